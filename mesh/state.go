package mesh

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh/member"
)

// Dir is the directory, under a data directory, that holds a peer's mesh
// membership:
//
//	DATA/mesh/state.json        the mesh (id, name, admin key) and this peer's certificate
//	DATA/mesh/admin.key         the mesh admin's private key (only on the device that made the mesh)
//	DATA/mesh/revocations.bin   the revocations this peer knows (member.RevocationList)
//	DATA/mesh/voters.bin        the newest voter set this peer verified (member.VoterSet)
//	DATA/mesh/ledger.bin        uses of the invite tokens this peer issued (member.Ledger)
//	DATA/mesh/members.json      the peers this peer admitted or issued certificates to (Known), MaxKnown at most
//
// The peer's own key is its libp2p identity (DATA/identity.key, mesh/p2p).
const Dir = "mesh"

// Errors.
var (
	// ErrNotJoined: the data directory is in no mesh (no mesh init, no
	// join).
	ErrNotJoined = errors.New("mesh: not in a mesh (run clawmesh mesh init, or clawmesh join TOKEN)")
	// ErrJoined: the data directory is in a mesh already.
	ErrJoined = errors.New("mesh: already in a mesh")
	// ErrNotAdmin: the admin key is not on this device.
	ErrNotAdmin = errors.New("mesh: this device does not hold the mesh's admin key")
)

// State is a peer's membership, as stored in DATA/mesh/state.json.
type State struct {
	MeshID string `json:"mesh_id"`
	Name   string `json:"name,omitempty"`
	// Admin is the mesh admin's public key (hex).
	Admin string `json:"admin"`
	// Cert is this peer's certificate (member.Certificate.Marshal, hex).
	Cert string `json:"cert"`
	// Addrs are the addresses this peer last listened on, for invite
	// tokens made while it is stopped.
	Addrs []string `json:"addrs,omitempty"`
	// Bootstrap are peers to dial at start: the inviter's addresses from
	// the token this peer joined with, and --bootstrap.
	Bootstrap []string  `json:"bootstrap,omitempty"`
	Updated   time.Time `json:"updated"`
}

// AdminKey returns the admin public key.
func (s *State) AdminKey() (ed25519.PublicKey, error) {
	b, err := hex.DecodeString(s.Admin)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("mesh: state: bad admin key")
	}
	return ed25519.PublicKey(b), nil
}

// Certificate returns this peer's certificate.
func (s *State) Certificate() (*member.Certificate, error) {
	b, err := hex.DecodeString(s.Cert)
	if err != nil {
		return nil, fmt.Errorf("mesh: state: bad certificate: %v", err)
	}
	return member.ParseCertificate(b)
}

// LoadState reads the membership in dataDir; ErrNotJoined if there is none.
func LoadState(dataDir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, Dir, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotJoined
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("mesh: %s is damaged: %v", filepath.Join(dataDir, Dir, "state.json"), err)
	}
	if _, err := s.AdminKey(); err != nil {
		return nil, err
	}
	if _, err := s.Certificate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// SaveState writes s into dataDir, atomically.
func SaveState(dataDir string, s *State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dataDir, Dir, "state.json"), append(b, '\n'))
}

// writeFile writes data to path atomically and durably, readable by the
// owner only.
func writeFile(path string, data []byte) error {
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	return nil
}

// Init makes a new mesh in dataDir: an admin key, kept in DATA/mesh/
// admin.key, and a certificate (a member that may invite) for this
// device's peer, whose identity key is key. It refuses a directory already
// in a mesh.
func Init(dataDir, name string, key ed25519.PrivateKey, peer PeerID, now time.Time, rand io.Reader) (*State, error) {
	if _, err := LoadState(dataDir); err == nil {
		return nil, ErrJoined
	} else if !errors.Is(err, ErrNotJoined) {
		return nil, err
	}
	if strings.ContainsAny(name, "\n\r") || len(name) > 64 {
		return nil, fmt.Errorf("mesh: name %q: one line of 64 bytes at most", name)
	}
	admin, err := member.NewKey(rand)
	if err != nil {
		return nil, err
	}
	pub := admin.Public().(ed25519.PublicKey)
	// The device's own certificate: a member that may invite. What only
	// the admin may do (sign with the admin key) needs admin.key, which
	// stays on this device.
	cert, err := member.IssueCertificate(admin, nil, member.CertSpec{
		Subject: string(peer), SubjectKey: key.Public().(ed25519.PublicKey), Role: member.RoleMember, MayInvite: true, TTL: member.MaxTTL,
	}, now, rand)
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dataDir, Dir, "admin.key"), []byte(hex.EncodeToString(admin)+"\n")); err != nil {
		return nil, err
	}
	s := &State{MeshID: member.MeshIDOf(pub), Name: name, Admin: hex.EncodeToString(pub), Cert: hex.EncodeToString(cert.Marshal()), Updated: now.UTC()}
	if err := SaveState(dataDir, s); err != nil {
		return nil, err
	}
	return s, nil
}

// LoadAdminKey reads the admin key from dataDir; ErrNotAdmin if it is not
// there.
func LoadAdminKey(dataDir string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, Dir, "admin.key"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotAdmin
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("mesh: %s is damaged", filepath.Join(dataDir, Dir, "admin.key"))
	}
	return ed25519.PrivateKey(k), nil
}

// LoadRevocations reads the revocations this peer knows (none if the file
// is missing).
func LoadRevocations(dataDir string, admin ed25519.PublicKey) (*member.RevocationList, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, Dir, "revocations.bin"))
	if errors.Is(err, os.ErrNotExist) {
		return member.NewRevocationList(admin), nil
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	return member.ParseRevocationList(admin, b)
}

// SaveRevocations writes the list.
func SaveRevocations(dataDir string, l *member.RevocationList) error {
	return writeFile(filepath.Join(dataDir, Dir, "revocations.bin"), l.Marshal())
}

// LoadLedger reads the ledger of the invite tokens this peer issued.
func LoadLedger(dataDir string, admin ed25519.PublicKey, owner PeerID) (*member.Ledger, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, Dir, "ledger.bin"))
	if errors.Is(err, os.ErrNotExist) {
		return member.NewLedger(admin, string(owner)), nil
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	return member.ParseLedger(b)
}

// SaveLedger writes the ledger.
func SaveLedger(dataDir string, l *member.Ledger) error {
	return writeFile(filepath.Join(dataDir, Dir, "ledger.bin"), l.Marshal())
}
