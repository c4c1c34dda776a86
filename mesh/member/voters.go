package member

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MaxVoters bounds a VoterSet.
const MaxVoters = 64

// A Voter is a trainer the mesh's admin trusts to vote in the trainers'
// raft group and to certify adapter versions: its peer id, and the
// signing key its certificate certifies (what its certifications are
// checked against).
type Voter struct {
	Peer string
	Key  ed25519.PublicKey
}

// A VoterSet is the admin's signed word on which trainers are voters. It
// replaces every set with a lower Seq: the newest one a peer has seen is
// the one in force. Trainers not in it are volunteers: they train the
// shares they are given and hand their deltas in, but never vote in raft
// and never certify a version. A VoterSet is immutable; it is made by
// NewVoterSet or ParseVoterSet and checked by Verify.
type VoterSet struct {
	adminKey ed25519.PublicKey
	seq      uint64
	issued   time.Time
	voters   []Voter // sorted by peer id, one per peer, distinct keys
	sig      []byte
	raw      []byte
}

// NewVoterSet signs, with the admin's key, the set of voters numbered seq
// (higher than every set it replaces), at now. Voters are given in any
// order; a peer or a key may appear once.
func NewVoterSet(adminKey ed25519.PrivateKey, seq uint64, voters []Voter, now time.Time) (*VoterSet, error) {
	pub, err := publicOf(adminKey)
	if err != nil {
		return nil, err
	}
	if err := checkTime(now, "voter set time"); err != nil {
		return nil, err
	}
	if len(voters) > MaxVoters {
		return nil, fmt.Errorf("member: %d voters, at most %d", len(voters), MaxVoters)
	}
	vs := make([]Voter, len(voters))
	for i, v := range voters {
		if err := checkPeerID(v.Peer, "voter"); err != nil {
			return nil, err
		}
		if len(v.Key) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("member: voter %s has a key of %d bytes", quote(v.Peer), len(v.Key))
		}
		vs[i] = Voter{Peer: v.Peer, Key: bytes.Clone(v.Key)}
	}
	slices.SortFunc(vs, func(a, b Voter) int { return strings.Compare(a.Peer, b.Peer) })
	if err := checkVoters(vs); err != nil {
		return nil, err
	}
	s := &VoterSet{adminKey: pub, seq: seq, issued: seconds(now), voters: vs}
	body := s.appendBody(nil)
	s.sig = sign(adminKey, body)
	s.raw = append(body, s.sig...)
	return s, nil
}

// checkVoters refuses a sorted list that names a peer or a key twice.
func checkVoters(vs []Voter) error {
	for i := 1; i < len(vs); i++ {
		if vs[i].Peer == vs[i-1].Peer {
			return fmt.Errorf("member: voter %s named twice", quote(vs[i].Peer))
		}
	}
	for i := range vs {
		for j := range i {
			if vs[i].Key.Equal(vs[j].Key) {
				return fmt.Errorf("member: voters %s and %s share a key", quote(vs[j].Peer), quote(vs[i].Peer))
			}
		}
	}
	return nil
}

func (s *VoterSet) appendBody(b []byte) []byte {
	b = append(b, encodingVersion, kindVoterSet)
	b = append(b, s.adminKey...)
	b = appendUvarint(b, 0) // reserved
	b = binary.AppendUvarint(b, s.seq)
	b = appendTime(b, s.issued)
	b = appendUvarint(b, len(s.voters))
	for _, v := range s.voters {
		b = appendString(b, v.Peer)
		b = append(b, v.Key...)
	}
	return b
}

// Marshal returns the set's canonical encoding.
func (s *VoterSet) Marshal() []byte { return bytes.Clone(s.raw) }

// ParseVoterSet decodes a voter set. It checks the form only; Verify
// checks the signature.
func ParseVoterSet(b []byte) (*VoterSet, error) {
	b = bytes.Clone(b)
	if err := header(b, MaxEncodedSize, kindVoterSet, "voter set"); err != nil {
		return nil, err
	}
	d := &decoder{b: b[2:]}
	s := &VoterSet{}
	s.adminKey = d.key("admin key")
	if r := d.uvarint("reserved"); d.err == nil && r != 0 {
		d.fail("reserved field %d", r)
	}
	s.seq = d.uvarint("sequence")
	s.issued = d.time("issue time")
	n := d.length(MaxVoters, "voters")
	for i := 0; i < n && d.err == nil; i++ {
		p := d.peerID("voter")
		k := d.key("voter key")
		s.voters = append(s.voters, Voter{Peer: p, Key: k})
	}
	s.sig = d.take(ed25519.SignatureSize, "signature")
	if err := d.finish("voter set"); err != nil {
		return nil, err
	}
	if !slices.IsSortedFunc(s.voters, func(a, b Voter) int { return strings.Compare(a.Peer, b.Peer) }) {
		return nil, fmt.Errorf("%w: voter set: voters out of order", ErrTampered)
	}
	if err := checkVoters(s.voters); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTampered, err)
	}
	s.raw = b
	if err := canonical(b, append(s.appendBody(nil), s.sig...), "voter set"); err != nil {
		return nil, err
	}
	return s, nil
}

// Verify checks that the admin of the mesh of adminPub signed the set
// (else ErrOtherMesh or ErrTampered).
func (s *VoterSet) Verify(adminPub ed25519.PublicKey) error {
	if err := checkAdminKey(adminPub); err != nil {
		return err
	}
	if !s.adminKey.Equal(adminPub) {
		return fmt.Errorf("%w: the voter set is from mesh %s, not %s", ErrOtherMesh, MeshIDOf(s.adminKey), MeshIDOf(adminPub))
	}
	if !verifySig(s.adminKey, s.raw[:len(s.raw)-ed25519.SignatureSize], s.sig) {
		return fmt.Errorf("%w: the signature of voter set %d does not verify", ErrTampered, s.seq)
	}
	return nil
}

// MeshID is the id of the mesh the set claims (checked by Verify).
func (s *VoterSet) MeshID() string { return MeshIDOf(s.adminKey) }

// Seq orders the sets of a mesh: a higher one replaces a lower one.
func (s *VoterSet) Seq() uint64 { return s.seq }

// Issued is when the admin signed the set.
func (s *VoterSet) Issued() time.Time { return s.issued }

// Voters returns the voters, sorted by peer id.
func (s *VoterSet) Voters() []Voter {
	out := make([]Voter, len(s.voters))
	for i, v := range s.voters {
		out[i] = Voter{Peer: v.Peer, Key: bytes.Clone(v.Key)}
	}
	return out
}

// Len is the number of voters.
func (s *VoterSet) Len() int { return len(s.voters) }

// Has says whether peer is a voter.
func (s *VoterSet) Has(peer string) bool {
	_, ok := s.Key(peer)
	return ok
}

// Key returns the signing key of voter peer.
func (s *VoterSet) Key(peer string) (ed25519.PublicKey, bool) {
	i, ok := slices.BinarySearchFunc(s.voters, peer, func(v Voter, p string) int { return strings.Compare(v.Peer, p) })
	if !ok {
		return nil, false
	}
	return s.voters[i].Key, true
}

// Quorum is how many voters must certify a version: a majority. A set
// with no voter has no quorum (0): nothing is certified under it.
func (s *VoterSet) Quorum() int {
	if len(s.voters) == 0 {
		return 0
	}
	return len(s.voters)/2 + 1
}

// Hash is the SHA-256 of the set's encoding: what certifications name the
// set they were made under by.
func (s *VoterSet) Hash() [sha256.Size]byte { return sha256.Sum256(s.raw) }

// With returns the voters with v added (or its key replaced).
func (s *VoterSet) With(v Voter) []Voter {
	out := slices.DeleteFunc(s.Voters(), func(o Voter) bool { return o.Peer == v.Peer })
	return append(out, Voter{Peer: v.Peer, Key: bytes.Clone(v.Key)})
}

// Without returns the voters but peer.
func (s *VoterSet) Without(peer string) []Voter {
	return slices.DeleteFunc(s.Voters(), func(o Voter) bool { return o.Peer == peer })
}

// Newer says whether o replaces s (s nil: any o does).
func (s *VoterSet) Newer(o *VoterSet) bool { return s == nil || o.seq > s.seq }
