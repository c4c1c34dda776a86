package chunks

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// voters makes n voter peers and the admin's set of them.
func (w *world) voters(t testing.TB, seq uint64, n int) ([]testPeer, *member.VoterSet) {
	t.Helper()
	ps := make([]testPeer, n)
	vs := make([]member.Voter, n)
	for i := range ps {
		ps[i] = newTestPeer(t)
		vs[i] = member.Voter{Peer: string(ps[i].id), Key: ps[i].key.Public().(ed25519.PublicKey)}
	}
	s, err := member.NewVoterSet(w.admin, seq, vs, t0)
	if err != nil {
		t.Fatal(err)
	}
	return ps, s
}

// certified is a manifest for v with the votes of the voters given.
func (w *world) certified(t testing.TB, vs *member.VoterSet, by []testPeer, v, term, index uint64) (*Manifest, bool) {
	t.Helper()
	m := w.manifest(t, []byte("a bundle of v"+string(rune('0'+v))), v, term, index)
	m.ParentHash = "parent"
	var votes []Vote
	for _, p := range by {
		vote, err := m.VoteFor(p.key, string(p.id), vs)
		if err != nil {
			t.Fatal(err)
		}
		votes = append(votes, vote)
	}
	ok := m.Certify(vs, votes)
	if err := m.Sign(w.trainer.key, w.cert, t0); err != nil {
		t.Fatal(err)
	}
	return m, ok
}

func TestCertification(t *testing.T) {
	w := newWorld(t)
	ps, vs := w.voters(t, 1, 3)

	m, ok := w.certified(t, vs, ps[:2], 5, 2, 40)
	if !ok {
		t.Fatal("two of three votes are not a quorum")
	}
	got, err := ParseManifest(m.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := got.Verify(w.pub(), t0, nil); err != nil {
		t.Fatalf("the signer: %v", err)
	}
	if err := got.VerifyCertified(w.pub(), vs); err != nil {
		t.Fatalf("two of three voters: %v", err)
	}
	if got.ParentHash != "parent" || len(got.Cert.Votes) != 2 {
		t.Fatalf("decoded: parent hash %q, %d votes", got.ParentHash, len(got.Cert.Votes))
	}

	// One vote of three is no quorum.
	one, ok := w.certified(t, vs, ps[:1], 5, 2, 40)
	if ok {
		t.Fatal("one vote of three called a quorum")
	}
	if err := one.VerifyCertified(w.pub(), vs); !errors.Is(err, ErrUncertified) {
		t.Fatalf("one vote of three: %v", err)
	}

	// A rogue signer that changes what the voters voted for (the version,
	// the term, the bundle, an evaluation) keeps their votes but loses
	// the certification.
	for name, lie := range map[string]func(*Manifest){
		"version":    func(m *Manifest) { m.Version = 1000 },
		"term":       func(m *Manifest) { m.Term = 99 },
		"index":      func(m *Manifest) { m.Index = 1 << 40 },
		"bundle":     func(m *Manifest) { m.Bundle[0] ^= 1 },
		"evaluation": func(m *Manifest) { m.Evals = []Eval{{Task: evalTask, Prompts: 10, Passed: 10, MeanReward: 1}} },
		"parent":     func(m *Manifest) { m.ParentHash = "other" },
	} {
		f, err := ParseManifest(m.Marshal())
		if err != nil {
			t.Fatal(err)
		}
		lie(f)
		if err := f.Sign(w.trainer.key, w.cert, t0); err != nil {
			t.Fatal(err)
		}
		if err := f.VerifyCertified(w.pub(), vs); !errors.Is(err, ErrUncertified) {
			t.Errorf("a manifest with its %s changed after the votes: %v", name, err)
		}
	}

	// Votes of peers that are not voters, a set the admin did not sign,
	// and a set that is not the one in force do not count.
	outsiders, _ := w.voters(t, 1, 2)
	if _, err := m.VoteFor(outsiders[0].key, string(outsiders[0].id), vs); !errors.Is(err, ErrUncertified) {
		t.Fatalf("an outsider votes: %v", err)
	}
	f, _ := ParseManifest(m.Marshal())
	f.Cert.Votes = []Vote{{Peer: string(ps[0].id), Sig: f.Cert.Votes[0].Sig}, {Peer: string(ps[1].id), Sig: f.Cert.Votes[0].Sig}}
	if err := f.VerifyCertified(w.pub(), vs); !errors.Is(err, ErrUncertified) {
		t.Fatalf("one voter's vote under two names: %v", err)
	}
	_, newer := w.voters(t, 2, 3)
	if err := m.VerifyCertified(w.pub(), newer); !errors.Is(err, ErrUncertified) {
		t.Fatalf("certified under a set no longer in force: %v", err)
	}
	rogue := newWorld(t) // another admin signs a set of the rogue's own voters
	rps, rvs := rogue.voters(t, 7, 1)
	rm, ok := w.certified(t, rvs, rps, 6, 3, 50)
	if !ok {
		t.Fatal("the rogue's own quorum")
	}
	if err := rm.VerifyCertified(w.pub(), rvs); !errors.Is(err, ErrUncertified) {
		t.Fatalf("a set another key signed: %v", err)
	}
	if err := m.VerifyCertified(w.pub(), nil); !errors.Is(err, ErrUncertified) {
		t.Fatalf("no voter set known: %v", err)
	}
	if err := w.manifest(t, []byte("x"), 5, 2, 40).VerifyCertified(w.pub(), vs); !errors.Is(err, ErrUncertified) {
		t.Fatalf("an uncertified manifest: %v", err)
	}
	_, empty := w.voters(t, 3, 0)
	if em, ok := w.certified(t, empty, nil, 5, 2, 40); ok || em.VerifyCertified(w.pub(), empty) == nil {
		t.Fatal("a set with no voter certifies")
	}
}

// A device that accepted an uncertified manifest with forged numbers (a
// rogue trainer's v1000) takes the certified chain up again; a certified
// chain is fenced as before.
func TestFenceCertified(t *testing.T) {
	w := newWorld(t)
	ps, vs := w.voters(t, 1, 1)
	forged := w.manifest(t, []byte("rogue"), 1000, 1<<30, 1<<40)
	v3, _ := w.certified(t, vs, ps, 3, 2, 30)
	if err := v3.Fence(forged); err != nil {
		t.Fatalf("the certified v3 after a forged uncertified v1000: %v", err)
	}
	v4, _ := w.certified(t, vs, ps, 4, 2, 41)
	if err := v4.Fence(v3); err != nil {
		t.Fatalf("v4 after v3: %v", err)
	}
	if err := v3.Fence(v4); !errors.Is(err, ErrStale) {
		t.Fatalf("v3 after v4: %v", err)
	}
	if err := forged.Fence(v4); !errors.Is(err, ErrUncertified) {
		t.Fatalf("an uncertified v1000 after a certified v4: %v", err)
	}
}
