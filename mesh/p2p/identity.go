package p2p

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh"
)

// File names inside Options.DataDir.
const (
	// IdentityFile holds the libp2p Ed25519 private key, in libp2p's
	// protobuf encoding (crypto.MarshalPrivateKey), mode 0600.
	IdentityFile = "identity.key"
	// PeersFile caches the addresses of the peers seen (JSON).
	PeersFile = "peers.json"
)

// LoadIdentity returns the identity of the node whose data dir is dataDir,
// and its peer id, creating the key (and the directory, 0700) if there is
// none yet. A file that exists but cannot be read or decoded is an error
// wrapping ErrIdentity, never replaced: replacing it would give the device
// a new peer id.
func LoadIdentity(dataDir string) (crypto.PrivKey, mesh.PeerID, error) {
	if dataDir == "" {
		return nil, "", fmt.Errorf("%w: no data dir", ErrIdentity)
	}
	path := filepath.Join(dataDir, IdentityFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return createIdentity(dataDir, path)
	case err != nil:
		return nil, "", fmt.Errorf("%w: read %s: %v", ErrIdentity, path, err)
	}
	key, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s is damaged (%v); it is not replaced, because a new key would be a new peer id: restore it from a backup, or move it aside to start this device afresh", ErrIdentity, path, err)
	}
	if key.Type() != crypto.Ed25519 {
		return nil, "", fmt.Errorf("%w: %s holds a %s key, not Ed25519", ErrIdentity, path, key.Type())
	}
	id, err := PeerIDFromKey(key.GetPublic())
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s: %v", ErrIdentity, path, err)
	}
	return key, id, nil
}

// createIdentity generates a key and stores it at path. The key is written
// to a temporary file and linked into place, so that a crash leaves no half
// key behind and, of two processes starting at once, the second one reads
// the first one's key rather than overwriting it.
func createIdentity(dataDir, path string) (crypto.PrivKey, mesh.PeerID, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, "", fmt.Errorf("%w: create data dir: %v", ErrIdentity, err)
	}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("%w: generate key: %v", ErrIdentity, err)
	}
	b, err := crypto.MarshalPrivateKey(key)
	if err != nil {
		return nil, "", fmt.Errorf("%w: encode key: %v", ErrIdentity, err)
	}
	if err := atomicfile.Create(path, b, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadIdentity(dataDir) // another process was first
		}
		return nil, "", fmt.Errorf("%w: store key: %v", ErrIdentity, err)
	}
	id, err := PeerIDFromKey(key.GetPublic())
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrIdentity, err)
	}
	return key, id, nil
}

// PeerIDFromKey is the peer id of a libp2p public key.
func PeerIDFromKey(pub crypto.PubKey) (mesh.PeerID, error) {
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadPeer, err)
	}
	return meshID(id), nil
}

// PeerIDFromEd25519 is the peer id of an Ed25519 public key, as a libp2p
// identity (Ed25519 peer ids embed the key itself).
func PeerIDFromEd25519(pub ed25519.PublicKey) (mesh.PeerID, error) {
	k, err := crypto.UnmarshalEd25519PublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadPeer, err)
	}
	return PeerIDFromKey(k)
}

// PublicKey extracts the Ed25519 public key embedded in a peer id.
func PublicKey(p mesh.PeerID) (ed25519.PublicKey, error) {
	id, err := libp2pID(p)
	if err != nil {
		return nil, err
	}
	k, err := id.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: %s embeds no key: %v", ErrBadPeer, p, err)
	}
	if k.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("%w: %s is a %s key, not Ed25519", ErrBadPeer, p, k.Type())
	}
	raw, err := k.Raw()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPeer, err)
	}
	return ed25519.PublicKey(raw), nil
}

// libp2pID parses a mesh peer id.
func libp2pID(p mesh.PeerID) (peer.ID, error) {
	id, err := peer.Decode(string(p))
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrBadPeer, p, err)
	}
	return id, nil
}

// meshID is the mesh's name for a libp2p peer id.
func meshID(id peer.ID) mesh.PeerID { return mesh.PeerID(id.String()) }
