package mesh

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// The voter set: the admin's signed word on which trainers vote in the
// trainers' raft group and certify adapter versions (member.VoterSet).
// Every peer keeps the newest one it verified in DATA/mesh/voters.bin and
// passes it on: in the hello of the certificate exchange (to admitted
// peers only) and, when the admin's device signs a new one, on its own
// gossip topic. Trainers not in it are volunteers.

// topicVoters is the gossip topic of the mesh's voter sets.
func topicVoters(meshID string) string { return TopicName(meshID, "voters/1") }

// votersFile is where a data directory keeps the newest voter set.
func votersFile(dataDir string) string { return filepath.Join(dataDir, Dir, "voters.bin") }

// voterState is the newest voter set this peer has verified: the admin's
// word on which trainers vote in the trainers' group and certify versions.
type voterState struct {
	mu      sync.Mutex
	set     *member.VoterSet // nil: none seen
	changed chan struct{}    // closed when set changes
	topic   Topic            // nil until Run joined it
	// signMu serializes the admin's signing of the next set.
	signMu sync.Mutex
}

// Errors of TrustVoter and UntrustVoter.
var (
	// ErrNotTrainer: the peer to trust is not a trainer.
	ErrNotTrainer = errors.New("mesh: not a trainer")
	// ErrAlreadyVoter: the peer to trust is a voter already.
	ErrAlreadyVoter = errors.New("mesh: already a voter")
	// ErrNotVoter: the peer to untrust is no voter.
	ErrNotVoter = errors.New("mesh: not a voter")
)

// LoadVoters reads the voter set kept in dataDir (nil if there is none)
// and checks that the admin of adminPub signed it.
func LoadVoters(dataDir string, adminPub ed25519.PublicKey) (*member.VoterSet, error) {
	b, err := os.ReadFile(votersFile(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	vs, err := member.ParseVoterSet(b)
	if err == nil {
		err = vs.Verify(adminPub)
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %s is damaged (%v): remove it, and the newest voter set is learnt again from the mesh's peers", votersFile(dataDir), err)
	}
	return vs, nil
}

// SaveVoters writes vs into dataDir, atomically.
func SaveVoters(dataDir string, vs *member.VoterSet) error {
	return writeFile(votersFile(dataDir), vs.Marshal())
}

// Voters returns the newest voter set this peer knows (nil: none yet).
func (m *Mesh) Voters() *member.VoterSet {
	m.voters.mu.Lock()
	defer m.voters.mu.Unlock()
	return m.voters.set
}

// VotersChanged returns a channel closed when the voter set next changes.
func (m *Mesh) VotersChanged() <-chan struct{} {
	m.voters.mu.Lock()
	defer m.voters.mu.Unlock()
	if m.voters.changed == nil {
		m.voters.changed = make(chan struct{})
	}
	return m.voters.changed
}

// AdoptVoters takes vs as the voter set in force if the mesh's admin
// signed it and it is newer than the one known, and keeps it in the data
// directory. It says whether it did.
func (m *Mesh) AdoptVoters(vs *member.VoterSet) (bool, error) {
	ok, saved, err := m.adoptVoters(vs)
	if saved != nil {
		m.log.Warn("saving the voter set", "err", saved)
	}
	return ok, err
}

// adoptVoters is AdoptVoters; saved is the error of keeping the set on
// disk, if it was adopted.
func (m *Mesh) adoptVoters(vs *member.VoterSet) (ok bool, saved, err error) {
	if vs == nil {
		return false, nil, nil
	}
	if err := vs.Verify(m.admin); err != nil {
		return false, nil, fmt.Errorf("mesh: voter set %d: %w", vs.Seq(), err)
	}
	m.voters.mu.Lock()
	defer m.voters.mu.Unlock()
	if !m.voters.set.Newer(vs) {
		return false, nil, nil
	}
	// Written under the lock, so that the file never holds an older set
	// than the last one adopted.
	saved = SaveVoters(m.cfg.DataDir, vs)
	m.voters.set = vs
	if m.voters.changed != nil {
		close(m.voters.changed)
		m.voters.changed = nil
	}
	m.logVoters(vs)
	return true, saved, nil
}

func (m *Mesh) logVoters(vs *member.VoterSet) {
	if vs.Len() == 0 {
		m.log.Warn("the voter set names no trainer: the mesh certifies no version until the admin trusts one", "seq", vs.Seq())
		return
	}
	ids := make([]string, 0, vs.Len())
	for _, v := range vs.Voters() {
		ids = append(ids, v.Peer)
	}
	m.log.Info("voter set in force", "seq", vs.Seq(), "voters", ids)
}

// votersHex is the voter set for a hello: hex, "" when none.
func (m *Mesh) votersHex() string {
	if vs := m.Voters(); vs != nil {
		return hex.EncodeToString(vs.Marshal())
	}
	return ""
}

// takeVoters adopts the voter set a peer's hello carries, if the admin
// signed it and it is newer.
func (m *Mesh) takeVoters(from PeerID, hexSet string) {
	if hexSet == "" {
		return
	}
	b, err := hex.DecodeString(hexSet)
	if err != nil {
		m.log.Debug("a voter set not in hex", "from", from)
		return
	}
	vs, err := member.ParseVoterSet(b)
	if err == nil {
		_, err = m.AdoptVoters(vs)
	}
	if err != nil {
		m.log.Info("a voter set refused", "from", from, "err", err)
	}
}

// runVoters joins the voter sets' topic and takes in the sets published
// on it until ctx is done.
func (m *Mesh) runVoters(ctx context.Context) {
	t, err := m.host.Join(topicVoters(m.state.MeshID))
	if err != nil {
		m.log.Warn("joining the voter sets' topic", "err", err)
		return
	}
	m.voters.mu.Lock()
	m.voters.topic = t
	m.voters.mu.Unlock()
	for {
		msg, err := t.Next(ctx)
		if err != nil {
			return
		}
		vs, err := member.ParseVoterSet(msg.Data)
		if err == nil {
			_, err = m.AdoptVoters(vs)
		}
		if err != nil {
			m.log.Info("a voter set refused", "from", msg.From, "err", err)
		}
	}
}

// signVoters signs, with the admin key, the set next makes of the one in
// force (numbered one higher), keeps it, publishes it on the gossip and
// hands it to each admitted peer in the certificate exchange.
func (m *Mesh) signVoters(ctx context.Context, next func(cur *member.VoterSet) ([]member.Voter, error)) (*member.VoterSet, error) {
	if m.adminKey == nil {
		return nil, fmt.Errorf("%w: only the mesh admin decides which trainers vote, and the admin key is not on this device "+
			"(it is on the device that made the mesh, with 'clawmesh mesh init')", member.ErrNotAllowed)
	}
	m.voters.signMu.Lock()
	defer m.voters.signMu.Unlock()
	cur := m.Voters()
	voters, err := next(cur)
	if err != nil {
		return cur, err
	}
	var seq uint64 = 1
	if cur != nil {
		seq = cur.Seq() + 1
	}
	vs, err := member.NewVoterSet(m.adminKey, seq, voters, m.now())
	if err != nil {
		return nil, err
	}
	ok, saved, err := m.adoptVoters(vs)
	if err != nil || !ok {
		return nil, fmt.Errorf("mesh: a newer voter set than %d arrived meanwhile: try again (%v)", seq, err)
	}
	if saved != nil {
		// In force here, but not kept: a restart would number the next
		// set again, and peers would ignore it.
		return nil, fmt.Errorf("mesh: the voter set %d is in force but could not be kept in the data directory: %w", seq, saved)
	}
	m.voters.mu.Lock()
	t := m.voters.topic
	m.voters.mu.Unlock()
	if t != nil {
		if err := t.Publish(ctx, vs.Marshal()); err != nil {
			m.log.Warn("publishing the voter set", "err", err)
		}
	}
	if m.host != nil {
		// The gossip misses a peer whose place in the topic's mesh is not
		// grafted yet: the exchange, run again now with each admitted
		// peer, hands it the set for sure.
		for _, pe := range m.Peers() {
			go m.admit(context.Background(), pe.ID)
		}
	}
	return vs, nil
}

// grantVoter makes p, a trainer that redeemed a voter token, a voter.
func (m *Mesh) grantVoter(ctx context.Context, p PeerID, cert *member.Certificate) {
	vs, err := m.signVoters(ctx, func(cur *member.VoterSet) ([]member.Voter, error) {
		v := member.Voter{Peer: string(p), Key: cert.SubjectKey()}
		if cur == nil {
			return []member.Voter{v}, nil
		}
		return cur.With(v), nil
	})
	if err != nil {
		m.log.Error("making the trainer that redeemed a voter token a voter", "peer", p, "err", err)
		return
	}
	m.log.Info("trainer made a voter by its invite", "peer", p, "seq", vs.Seq())
}

// TrustVoter makes peer, a trainer this device knows (it admitted it or
// invited it), a voter: on the admin's device only, it signs the next
// voter set, keeps it and spreads it. A voter already is left as it is:
// TrustVoter returns the set in force and an error wrapping
// ErrAlreadyVoter.
func (m *Mesh) TrustVoter(ctx context.Context, peer PeerID) (*member.VoterSet, error) {
	key, err := m.cfg.KeyOf(peer)
	if err != nil {
		return nil, fmt.Errorf("%w: %q (a peer id looks like 12D3KooW..., as 'clawmesh mesh peers' lists them)", ErrBadPeerID, clip(string(peer), 60))
	}
	return m.signVoters(ctx, func(cur *member.VoterSet) ([]member.Voter, error) {
		if cur != nil && cur.Has(string(peer)) {
			return nil, fmt.Errorf("%w: %s votes already (voter set %d)", ErrAlreadyVoter, peer, cur.Seq())
		}
		m.mu.Lock()
		revoked := m.revs.IsRevoked(string(peer))
		m.mu.Unlock()
		if revoked {
			return nil, fmt.Errorf("%w: %s was removed from the mesh", member.ErrRevoked, peer)
		}
		k, ok := m.Known(peer)
		if !ok {
			return nil, fmt.Errorf("%w: %s was never admitted by this device nor invited by it; trust takes a trainer of the mesh "+
				"('clawmesh mesh peers' lists the peers connected now)", ErrUnknownPeer, peer)
		}
		if k.Role != member.RoleTrainer.String() {
			return nil, fmt.Errorf("%w: %s is a %s; only a trainer can vote", ErrNotTrainer, peer, k.Role)
		}
		v := member.Voter{Peer: string(peer), Key: key}
		if cur == nil {
			return []member.Voter{v}, nil
		}
		return cur.With(v), nil
	})
}

// UntrustVoter makes voter peer a volunteer: on the admin's device only,
// it signs the next voter set without it, keeps it and spreads it. A peer
// that is no voter is left as it is (an error wrapping ErrNotVoter). The
// last voter may go: the mesh then certifies no version until one is
// trusted.
func (m *Mesh) UntrustVoter(ctx context.Context, peer PeerID) (*member.VoterSet, error) {
	if _, err := m.cfg.KeyOf(peer); err != nil {
		return nil, fmt.Errorf("%w: %q (a peer id looks like 12D3KooW..., as 'mesh status' lists the voters)", ErrBadPeerID, clip(string(peer), 60))
	}
	return m.signVoters(ctx, func(cur *member.VoterSet) ([]member.Voter, error) {
		if cur == nil || !cur.Has(string(peer)) {
			return nil, fmt.Errorf("%w: %s is not a voter ('clawmesh mesh status' lists the voters)", ErrNotVoter, peer)
		}
		return cur.Without(string(peer)), nil
	})
}

// TrustOffline is TrustVoter in dataDir, for a device that is not
// running: the set is kept and spreads when it next runs.
func TrustOffline(dataDir string, key ed25519.PrivateKey, keyOf func(PeerID) (ed25519.PublicKey, error), peer PeerID, now time.Time) (*member.VoterSet, error) {
	m, err := New(Config{DataDir: dataDir, Key: key, KeyOf: keyOf, Now: func() time.Time { return now }})
	if err != nil {
		return nil, err
	}
	return m.TrustVoter(context.Background(), peer)
}

// UntrustOffline is UntrustVoter in dataDir, for a device that is not
// running.
func UntrustOffline(dataDir string, key ed25519.PrivateKey, keyOf func(PeerID) (ed25519.PublicKey, error), peer PeerID, now time.Time) (*member.VoterSet, error) {
	m, err := New(Config{DataDir: dataDir, Key: key, KeyOf: keyOf, Now: func() time.Time { return now }})
	if err != nil {
		return nil, err
	}
	return m.UntrustVoter(context.Background(), peer)
}

// VoterChoice says whether a trainer an invite token lets in is to vote.
type VoterChoice int

const (
	// VoterIfNone, the default: a voter if the mesh has none yet and this
	// device holds the admin key (so that a one-person mesh's first
	// trainer certifies its versions), else a volunteer.
	VoterIfNone VoterChoice = iota
	// MakeVoter: a voter; only the admin's device may say so.
	MakeVoter
	// MakeVolunteer: a volunteer, which trains but never votes.
	MakeVolunteer
)

// InviteOptions say what an invite token offers.
type InviteOptions struct {
	// Role is the role offered; zero means member.
	Role member.Role
	// TTL and Uses: the token's lifetime and redemptions (member.TokenSpec).
	TTL  time.Duration
	Uses int
	// Addrs are this peer's addresses now; default those it last listened
	// on.
	Addrs []string
	// Voter applies to a trainer token.
	Voter VoterChoice
}

// InviteWith makes an invite token as o says (see Invite). A trainer
// token makes a voter if o.Voter says so, or by default if the mesh has
// no voter yet and this device holds the admin key; Token.Voter tells.
// Only the admin's device may make a voter (else an error wrapping
// member.ErrNotAllowed).
func InviteWith(dataDir string, key ed25519.PrivateKey, o InviteOptions, now time.Time, rand io.Reader) (*member.Token, error) {
	st, err := LoadState(dataDir)
	if err != nil {
		return nil, err
	}
	cert, _ := st.Certificate()
	role := o.Role
	if role == 0 {
		role = member.RoleMember
	}
	if o.Voter == MakeVoter && role != member.RoleTrainer {
		return nil, fmt.Errorf("mesh: only a trainer can be a voter, not a %s", role)
	}
	admin, err := LoadAdminKey(dataDir)
	isAdmin := err == nil
	if err != nil && !errors.Is(err, ErrNotAdmin) {
		return nil, err
	}
	if !isAdmin && o.Voter == MakeVoter {
		return nil, fmt.Errorf("%w: only the mesh admin may make a voter, and the admin key is not on this device; "+
			"invite the trainer without --voter (it volunteers: it trains but never votes), and the admin can make it a voter "+
			"later with 'clawmesh mesh trust PEER'", member.ErrNotAllowed)
	}
	addrs := o.Addrs
	if len(addrs) == 0 {
		addrs = st.Addrs
	}
	if len(addrs) == 0 {
		return nil, errors.New("mesh: no address to put in the token: start the node (or trainer) once, so that it knows where it listens")
	}
	spec := member.TokenSpec{Inviter: cert.Subject(), Addrs: addrs, Role: role, TTL: o.TTL, MaxUses: o.Uses}
	if !isAdmin {
		if !cert.MayInvite() {
			return nil, fmt.Errorf("%w: this peer's certificate does not let it invite (ask the mesh admin)", member.ErrNotAllowed)
		}
		return member.NewToken(key, cert, spec, now, rand)
	}
	if role == member.RoleTrainer {
		switch o.Voter {
		case MakeVoter:
			spec.Voter = true
		case VoterIfNone:
			vs, err := LoadVoters(dataDir, admin.Public().(ed25519.PublicKey))
			if err != nil {
				return nil, err
			}
			spec.Voter = vs == nil || vs.Len() == 0
		}
	}
	return member.NewToken(admin, nil, spec, now, rand)
}

// Sign signs msg with this peer's identity key, the one its certificate
// certifies: for protocols that build on the mesh's identities (a
// trainer's signed deltas, a voter's votes). Each such protocol prefixes
// what it signs with its own context.
func (m *Mesh) Sign(msg []byte) []byte { return ed25519.Sign(m.cfg.Key, msg) }
