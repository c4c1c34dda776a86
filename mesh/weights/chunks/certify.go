package chunks

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights/internal/wire"
)

// A Certification is the voters' word on a version: the voter set in force
// when they voted, and the votes, each a voter's Ed25519 signature over
// the version's claim (Claim). A manifest is certified when the votes of a
// quorum of that set (a majority) check out, and that set is the one the
// device holds as the mesh's newest.
type Certification struct {
	Voters *member.VoterSet
	Votes  []Vote // sorted by peer id, one per voter
}

// A Vote is one voter's signature over a version's claim.
type Vote struct {
	Peer string
	Sig  []byte
}

// claimContext prefixes every claim, so that a vote cannot be taken for
// another signature made with the voter's key.
const claimContext = "clawmesh/certify\nCMVC1"

// Claim is what a voter signs for m under voter set vs: the mesh, the
// version and its parent (numbers and adapter hashes), the bundle's
// SHA-256, the raft term and index that committed the version, its
// evaluations, and the voter set's hash. A voter builds the same manifest
// from its own copy of the version and the group's log, so its claim is
// the leader's byte for byte; Created, the signer and the votes are not
// part of it.
func (m *Manifest) Claim(vs *member.VoterSet) []byte {
	b := []byte(claimContext)
	b = wire.AppendString(b, m.MeshID)
	b = binary.AppendUvarint(b, m.Version)
	b = binary.AppendUvarint(b, m.Parent)
	b = wire.AppendString(b, m.Base)
	b = wire.AppendString(b, m.AdapterHash)
	b = wire.AppendString(b, m.ParentHash)
	b = append(b, m.Bundle[:]...)
	b = binary.AppendUvarint(b, m.Size)
	b = binary.AppendUvarint(b, m.Term)
	b = binary.AppendUvarint(b, m.Index)
	b = appendEvals(b, m.Evals)
	h := vs.Hash()
	return append(b, h[:]...)
}

// VoteFor signs m's claim under vs with key, the voter's signing key.
func (m *Manifest) VoteFor(key ed25519.PrivateKey, peer string, vs *member.VoterSet) (Vote, error) {
	k, ok := vs.Key(peer)
	if !ok {
		return Vote{}, fmt.Errorf("%w: %s is not a voter of set %d", ErrUncertified, peer, vs.Seq())
	}
	if !bytes.Equal(key.Public().(ed25519.PublicKey), k) {
		return Vote{}, fmt.Errorf("%w: the key is not voter %s's", ErrUncertified, peer)
	}
	return Vote{Peer: peer, Sig: ed25519.Sign(key, m.Claim(vs))}, nil
}

// CheckVote says whether v is a valid vote of a voter of vs for m.
func (m *Manifest) CheckVote(vs *member.VoterSet, v Vote) error {
	k, ok := vs.Key(v.Peer)
	if !ok {
		return fmt.Errorf("%w: a vote of %s, not a voter of set %d", ErrUncertified, v.Peer, vs.Seq())
	}
	if len(v.Sig) != ed25519.SignatureSize || !ed25519.Verify(k, m.Claim(vs), v.Sig) {
		return fmt.Errorf("%w: voter %s's vote for %s does not verify", ErrUncertified, v.Peer, m.Name())
	}
	return nil
}

// Certify attaches the votes under vs to m (sorted, one per peer, the
// invalid ones left out) and says whether they reach vs's quorum; m must
// then be signed again.
func (m *Manifest) Certify(vs *member.VoterSet, votes []Vote) bool {
	c := &Certification{Voters: vs}
	for _, v := range votes {
		if m.CheckVote(vs, v) != nil || slices.ContainsFunc(c.Votes, func(o Vote) bool { return o.Peer == v.Peer }) {
			continue
		}
		c.Votes = append(c.Votes, Vote{Peer: v.Peer, Sig: bytes.Clone(v.Sig)})
	}
	slices.SortFunc(c.Votes, func(a, b Vote) int { return strings.Compare(a.Peer, b.Peer) })
	m.Cert = c
	return vs.Quorum() > 0 && len(c.Votes) >= vs.Quorum()
}

// VerifyCertified checks m's certification for the mesh of admin whose
// voter set in force is current: the set m was certified under is signed
// by the admin and is current (same sequence and bytes), and the valid
// votes of distinct voters of it reach its quorum. Everything else fails
// with ErrUncertified.
func (m *Manifest) VerifyCertified(admin ed25519.PublicKey, current *member.VoterSet) error {
	c := m.Cert
	switch {
	case c == nil:
		return fmt.Errorf("%w: %s carries no votes", ErrUncertified, m.Name())
	case current == nil:
		return fmt.Errorf("%w: this peer knows no voter set of the mesh", ErrUncertified)
	}
	if err := c.Voters.Verify(admin); err != nil {
		return fmt.Errorf("%w: %w", ErrUncertified, err)
	}
	if c.Voters.Hash() != current.Hash() {
		return fmt.Errorf("%w: %s was certified under voter set %d, the mesh's is %d", ErrUncertified, m.Name(), c.Voters.Seq(), current.Seq())
	}
	seen := map[string]bool{}
	for _, v := range c.Votes {
		if seen[v.Peer] {
			return fmt.Errorf("%w: two votes of %s", ErrUncertified, v.Peer)
		}
		seen[v.Peer] = true
		if err := m.CheckVote(c.Voters, v); err != nil {
			return err
		}
	}
	if q := c.Voters.Quorum(); q == 0 || len(seen) < q {
		return fmt.Errorf("%w: %s has %d of the %d votes it needs (voter set %d of %d voters)",
			ErrUncertified, m.Name(), len(seen), q, c.Voters.Seq(), c.Voters.Len())
	}
	return nil
}

func (c *Certification) append(b []byte) []byte {
	b = wire.AppendBytes(b, c.Voters.Marshal())
	b = binary.AppendUvarint(b, uint64(len(c.Votes)))
	for _, v := range c.Votes {
		b = wire.AppendString(b, v.Peer)
		b = append(b, v.Sig...)
	}
	return b
}

func readCert(d *wire.Decoder) *Certification {
	vb := d.Bytes(member.MaxEncodedSize)
	n := d.Uvarint()
	if d.Err() == nil && n > member.MaxVoters {
		d.Fail("%d votes", n)
	}
	if d.Err() != nil {
		return nil
	}
	vs, err := member.ParseVoterSet(vb)
	if err != nil {
		d.Fail("voter set: %v", err)
		return nil
	}
	c := &Certification{Voters: vs}
	for range n {
		p := d.String(member.MaxPeerIDLen)
		sig := d.Take(ed25519.SignatureSize)
		if d.Err() != nil {
			return nil
		}
		if len(c.Votes) > 0 && strings.Compare(c.Votes[len(c.Votes)-1].Peer, p) >= 0 {
			d.Fail("votes out of order")
			return nil
		}
		c.Votes = append(c.Votes, Vote{Peer: p, Sig: bytes.Clone(sig)})
	}
	return c
}
