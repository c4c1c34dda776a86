package member

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func (w *world) voters(seq uint64, ps ...peer) *VoterSet {
	w.tb.Helper()
	var vs []Voter
	for _, p := range ps {
		vs = append(vs, Voter{Peer: p.id, Key: p.pub()})
	}
	s, err := NewVoterSet(w.admin.key, seq, vs, t0)
	if err != nil {
		w.tb.Fatalf("voter set %d: %v", seq, err)
	}
	return s
}

func TestVoterSet(t *testing.T) {
	w := newWorld(t, 1)
	other := newWorld(t, 2)
	s := w.voters(3, w.trainer, w.helper)
	p, err := ParseVoterSet(s.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(w.adminPub); err != nil {
		t.Fatalf("the admin's set: %v", err)
	}
	if p.Seq() != 3 || p.Len() != 2 || p.Quorum() != 2 || !p.Has(w.trainer.id) || p.Has(w.plain.id) || p.MeshID() != MeshIDOf(w.adminPub) {
		t.Fatalf("parsed set: seq %d, %d voters, quorum %d", p.Seq(), p.Len(), p.Quorum())
	}
	if k, ok := p.Key(w.helper.id); !ok || !k.Equal(w.helper.pub()) {
		t.Fatalf("the helper's key: %x %v", k, ok)
	}
	if p.Hash() != s.Hash() {
		t.Fatal("a parsed set hashes differently")
	}
	if err := p.Verify(other.adminPub); !errors.Is(err, ErrOtherMesh) {
		t.Fatalf("another mesh's admin: %v", err)
	}
	// Signed by a trainer's key, not the admin's: another mesh's admin key
	// in the body, or a bad signature.
	forged, err := NewVoterSet(w.trainer.key, 9, []Voter{{Peer: w.trainer.id, Key: w.trainer.pub()}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := forged.Verify(w.adminPub); err == nil {
		t.Fatal("a set a trainer signed verifies for the mesh")
	}
	b := s.Marshal()
	b[len(b)-ed25519SigOffset] ^= 1
	if q, err := ParseVoterSet(b); err == nil {
		if err := q.Verify(w.adminPub); !errors.Is(err, ErrTampered) {
			t.Fatalf("a tampered set: %v", err)
		}
	}
	if !(*VoterSet)(nil).Newer(s) || s.Newer(w.voters(3)) || !s.Newer(w.voters(4)) {
		t.Fatal("Newer does not follow Seq")
	}
	if w.voters(5).Quorum() != 0 || w.voters(5, w.trainer).Quorum() != 1 || w.voters(5, w.trainer, w.helper, w.plain).Quorum() != 2 {
		t.Fatal("quorum is not a majority")
	}
	// With and Without build the next set.
	next := w.voters(4).With(Voter{Peer: w.plain.id, Key: w.plain.pub()})
	if len(next) != 1 || next[0].Peer != w.plain.id || len(s.Without(w.helper.id)) != 1 || len(s.With(Voter{Peer: w.helper.id, Key: w.plain.pub()})) != 2 {
		t.Fatalf("With/Without: %v", next)
	}
}

func TestVoterSetRefuses(t *testing.T) {
	w := newWorld(t, 1)
	for name, vs := range map[string][]Voter{
		"a peer twice":    {{Peer: w.trainer.id, Key: w.trainer.pub()}, {Peer: w.trainer.id, Key: w.helper.pub()}},
		"a key twice":     {{Peer: w.trainer.id, Key: w.trainer.pub()}, {Peer: w.helper.id, Key: w.trainer.pub()}},
		"a short key":     {{Peer: w.trainer.id, Key: w.trainer.pub()[:5]}},
		"no peer id":      {{Peer: "", Key: w.trainer.pub()}},
		"too many voters": make([]Voter, MaxVoters+1),
	} {
		if _, err := NewVoterSet(w.admin.key, 1, vs, t0); err == nil {
			t.Errorf("%s: signed", name)
		}
	}
	if _, err := NewVoterSet(w.admin.key, 1, nil, time.Time{}); err == nil {
		t.Error("a set at the zero time: signed")
	}
}

const ed25519SigOffset = 10 // a byte inside the signature

func FuzzParseVoterSet(f *testing.F) {
	w := newWorld(f, 1)
	seeds := known{}
	for _, s := range []*VoterSet{w.voters(0), w.voters(1, w.trainer), w.voters(7, w.trainer, w.helper, w.plain)} {
		f.Add(seeds.add(s.Marshal()))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseVoterSet(b)
		checkParseErr(t, err)
		if err != nil {
			return
		}
		if !bytes.Equal(s.Marshal(), b) {
			t.Fatalf("ParseVoterSet(%x).Marshal() = %x", b, s.Marshal())
		}
		for _, v := range s.Voters() {
			if !s.Has(v.Peer) {
				t.Fatalf("voter %s not found", v.Peer)
			}
		}
		if s.Verify(w.adminPub) == nil && !seeds[string(b)] {
			t.Fatalf("a voter set that is not a seed verifies: %x", b)
		}
	})
}
