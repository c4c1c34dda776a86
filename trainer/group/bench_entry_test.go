package group_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

func benchT3(f func(*Bench)) *Entry {
	b := &Bench{Trainer: "t3", Round: 1, Reason: "spot check: another delta than its share makes",
		Evidence: SpotEvidence{Base: 0, Engine: "native", Submitted: grouptest.HashN(5), Recomputed: grouptest.HashN(6), MaxAbsDiff: 0.5,
			Samples: 4, RecomputedSamples: 4, Batches: []core.BatchID{grouptest.Bid(3)}, Checker: "t1"}}
	if f != nil {
		f(b)
	}
	return &Entry{Bench: b}
}

func TestApplyBench(t *testing.T) {
	leftOpen := func(tb testing.TB) *grouptest.Fixture {
		f := grouptest.Open(tb)
		f.Must(&Entry{Leave: "t2"})
		f.Must(&Entry{Leave: "t3"})
		return f
	}
	runApplyCases(t, []applyCase{
		{name: "benched", setup: grouptest.Published, entry: benchT3(nil), check: func(t *testing.T, s *State) {
			r, ok := s.Benched["t3"]
			if !ok || r.Round != 1 || r.Reason == "" || r.Evidence.MaxAbsDiff != 0.5 || len(r.Evidence.Batches) != 1 || r.At.IsZero() {
				t.Fatalf("t3's bench: %+v (benched %v)", r, ok)
			}
			if _, ok := s.Trainers["t3"]; !ok {
				t.Fatal("a benched trainer stays registered")
			}
		}},
		{name: "while its round is open", setup: grouptest.Open, entry: benchT3(func(b *Bench) { b.Trainer = "t2" }), check: func(t *testing.T, s *State) {
			if _, ok := s.Benched["t2"]; !ok || s.Round == nil || len(s.Round.Shares["t2"]) != 1 {
				t.Fatalf("benched %v, round %+v", ok, s.Round)
			}
		}},
		{name: "left while its round ran", setup: leftOpen, entry: benchT3(func(b *Bench) { b.Trainer = "t2" }), check: func(t *testing.T, s *State) {
			if _, ok := s.Benched["t2"]; !ok {
				t.Fatal("not benched")
			}
		}},
		{name: "unknown trainer", setup: grouptest.Published, entry: benchT3(func(b *Bench) { b.Trainer = "t9" }), want: ErrTrainer},
		{name: "gone, not in the round", setup: leftOpen, entry: benchT3(func(b *Bench) { b.Trainer = "t3" }), want: ErrTrainer},
		{name: "no one", setup: grouptest.Published, entry: benchT3(func(b *Bench) { b.Trainer = "" }), want: ErrEntry},
		{name: "no reason", setup: grouptest.Published, entry: benchT3(func(b *Bench) { b.Reason = "" }), want: ErrEntry},
		{name: "round 0", setup: grouptest.Published, entry: benchT3(func(b *Bench) { b.Round = 0 }), want: ErrEntry},
		{name: "a round not started", setup: grouptest.Published, entry: benchT3(func(b *Bench) { b.Round = 2 }), want: ErrEntry},
	})
}

func TestApplyClear(t *testing.T) {
	benched := func(tb testing.TB) *grouptest.Fixture {
		f := grouptest.Published(tb)
		f.Must(benchT3(nil))
		return f
	}
	runApplyCases(t, []applyCase{
		{name: "cleared", setup: benched, entry: &Entry{Clear: &Clear{Trainer: "t3"}}, check: func(t *testing.T, s *State) {
			if _, ok := s.Benched["t3"]; ok || len(s.Benched) != 0 {
				t.Fatalf("still benched: %+v", s.Benched)
			}
		}},
		{name: "not benched", setup: benched, entry: &Entry{Clear: &Clear{Trainer: "t2"}}, want: ErrTrainer},
		{name: "unknown", setup: grouptest.Published, entry: &Entry{Clear: &Clear{Trainer: "t9"}}, want: ErrTrainer},
	})
}

// A benched trainer gets no share, even after it leaves and registers
// again, until it is cleared.
func TestPlanSkipsBenched(t *testing.T) {
	f := grouptest.Published(t)
	live := []mesh.PeerID{"t1", "t2", "t3"}
	f.Must(benchT3(nil))
	f.Must(&Entry{Leave: "t3"})
	f.Must(&Entry{Register: &Trainer{ID: "t3", Engine: "cpu", Device: "z", Speed: 100}})
	st, ok := f.S.Plan(f.At(), "t1", live)
	if !ok {
		t.Fatal("no round planned")
	}
	if _, ok := st.Shares["t3"]; ok || len(st.Shares) == 0 {
		t.Fatalf("shares %v: the benched t3 has one", st.Shares)
	}
	if _, ok := f.S.Plan(f.At(), "t3", []mesh.PeerID{"t3"}); ok {
		t.Fatal("a round planned for the benched trainer alone")
	}
	// The bench survives a snapshot.
	var snap bytes.Buffer
	if err := json.NewEncoder(&snap).Encode(f.S); err != nil {
		t.Fatal(err)
	}
	restored, err := DecodeState(&snap)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := restored.Benched["t3"]; !ok || r.Round != 1 {
		t.Fatalf("restored: %+v", restored.Benched)
	}
	f.Must(&Entry{Clear: &Clear{Trainer: "t3"}})
	st, ok = f.S.Plan(f.At(), "t1", live)
	if !ok || len(st.Shares["t3"]) == 0 {
		t.Fatalf("cleared, t3 has no share: %v", st.Shares)
	}
}
