package group

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// hashN is a valid 64-hex-digit hash (adapter hashes and batch ids alike).
func hashN(n int) string { return fmt.Sprintf("%064x", n) }

// bid is batch n's id.
func bid(n int) core.BatchID { return core.BatchID(fmt.Sprintf("%064x", 1<<40+n)) }

// fixture drives a State with increasing raft indices and a clock that
// ticks a second per entry.
type fixture struct {
	t     testing.TB
	s     *State
	term  uint64
	index uint64
}

func newFixture(t testing.TB) *fixture { return &fixture{t: t, s: New(), term: 1} }

func (f *fixture) at() time.Time { return t0.Add(time.Duration(f.index) * time.Second) }

// apply applies e at the next index, stamping e.At if unset.
func (f *fixture) apply(e *Entry) error {
	f.t.Helper()
	f.index++
	if e != nil && e.At.IsZero() {
		e.At = f.at()
	}
	return f.s.Apply(e, f.term, f.index)
}

func (f *fixture) must(e *Entry) {
	f.t.Helper()
	if err := f.apply(e); err != nil {
		f.t.Fatalf("apply %s: %v", entryString(e), err)
	}
}

func entryString(e *Entry) string {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Sprintf("%+v", e)
	}
	return string(b)
}

// ready is a configured state with version 0, trainers t1 (speed 1) and t2
// (speed 2), t3 (speed 1), and batches 1..6 (from d1 for odd, d2 for even,
// 4 steps each).
func ready(t testing.TB) *fixture {
	f := newFixture(t)
	f.must(&Entry{Configure: &Config{Quota: 64, RoundSteps: 128}})
	f.must(&Entry{Genesis: &Genesis{Hash: hashN(0), Publisher: "t1"}})
	f.must(&Entry{Register: &Trainer{ID: "t1", Engine: "cpu", Device: "x", Speed: 1}})
	f.must(&Entry{Register: &Trainer{ID: "t2", Engine: "cpu", Device: "y", Speed: 2}})
	f.must(&Entry{Register: &Trainer{ID: "t3", Engine: "cpu", Device: "z", Speed: 1}})
	var refs []BatchRef
	for i := 1; i <= 6; i++ {
		from := mesh.PeerID("d1")
		if i%2 == 0 {
			from = "d2"
		}
		refs = append(refs, BatchRef{ID: bid(i), From: from, Steps: 4, Adapters: []string{"v0"}})
	}
	f.must(&Entry{Add: refs})
	return f
}

// open is ready with round 1 open: t1 has batches 1 and 2, t2 batch 3.
func open(t testing.TB) *fixture {
	f := ready(t)
	f.must(&Entry{Start: &Start{Round: 1, Base: 0, Leader: "t1", Deadline: t0.Add(time.Hour),
		Shares: map[mesh.PeerID][]core.BatchID{"t1": {bid(1), bid(2)}, "t2": {bid(3)}}}})
	return f
}

// published is open with round 1 published as v1 (t1 trained 1 and 2, t2
// trained 3).
func published(t testing.TB) *fixture {
	f := open(t)
	f.must(&Entry{Publish: &Publish{Round: 1, Version: 1, Parent: 0, Hash: hashN(1), Publisher: "t1",
		Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{bid(1), bid(2)}, Samples: 8}, {Trainer: "t2", Batches: []core.BatchID{bid(3)}, Samples: 4}}}})
	return f
}

// stateJSON is s as JSON with the applied term and index left out: what a
// refused entry must leave unchanged.
func stateJSON(t testing.TB, s *State) string {
	t.Helper()
	c := *s
	c.Term, c.Index = 0, 0
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	return string(b)
}

func fullJSON(t testing.TB, s *State) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	return string(b)
}

// checkInvariants reports the first invariant s breaks.
func checkInvariants(s *State) error {
	// Counts is a recount of the statuses; every batch is in a known status
	// with fields that fit it.
	recount := map[Status]int{}
	for id, b := range s.Batches {
		if b == nil || b.ID != id {
			return fmt.Errorf("batch %s: bad line %+v", id, b)
		}
		recount[b.Status]++
		switch b.Status {
		case Pending:
			if b.Round != 0 || b.Trainer != "" || b.Version != 0 || b.Reason != "" {
				return fmt.Errorf("pending batch %s: %+v", id, b)
			}
			if _, ok := s.Revoked[b.From]; ok && b.From != "" {
				return fmt.Errorf("pending batch %s from revoked %s", id, b.From)
			}
		case Assigned:
			if s.Round == nil || b.Round != s.Round.Number || !slices.Contains(s.Round.Shares[b.Trainer], id) {
				return fmt.Errorf("assigned batch %s (round %d, trainer %s) not in the open round's shares", id, b.Round, b.Trainer)
			}
		case Trained:
			if b.Version == 0 || b.Version >= uint64(len(s.Versions)) {
				return fmt.Errorf("trained batch %s in version %d of %d", id, b.Version, len(s.Versions))
			}
		case Refused:
			if b.Reason == "" || b.Round != 0 || b.Trainer != "" {
				return fmt.Errorf("refused batch %s: %+v", id, b)
			}
		default:
			return fmt.Errorf("batch %s in status %q", id, b.Status)
		}
		if b.Steps < 0 || b.Tries < 0 {
			return fmt.Errorf("batch %s: %+v", id, b)
		}
	}
	for _, st := range []Status{Pending, Assigned, Trained, Refused} {
		if s.Counts[st] != recount[st] {
			return fmt.Errorf("counts[%s]=%d, recount %d (counts %v)", st, s.Counts[st], recount[st], s.Counts)
		}
	}
	for st, n := range s.Counts {
		if n != recount[st] {
			return fmt.Errorf("counts[%s]=%d, recount %d", st, n, recount[st])
		}
	}
	refusals := 0
	for _, n := range s.Refusals {
		refusals += n
	}
	if refusals != recount[Refused] {
		return fmt.Errorf("refusals count %d batches, %d are refused (%v)", refusals, recount[Refused], s.Refusals)
	}

	// The lineage: version i at index i, each the child of the one before,
	// committed at strictly increasing (term, index).
	inVersion := map[core.BatchID]uint64{}
	for i, v := range s.Versions {
		if v.Version != uint64(i) || !validHash(v.Hash) {
			return fmt.Errorf("versions[%d] is %+v", i, v)
		}
		if i == 0 {
			if len(v.Contributors) != 0 {
				return fmt.Errorf("genesis with contributors")
			}
			continue
		}
		p := s.Versions[i-1]
		if v.Parent != p.Version {
			return fmt.Errorf("v%d has parent %d", v.Version, v.Parent)
		}
		if v.Term < p.Term || (v.Term == p.Term && v.Index <= p.Index) {
			return fmt.Errorf("v%d at (%d,%d) not after v%d at (%d,%d)", v.Version, v.Term, v.Index, p.Version, p.Term, p.Index)
		}
		if v.Round == 0 || v.Round > s.Rounds {
			return fmt.Errorf("v%d from round %d of %d", v.Version, v.Round, s.Rounds)
		}
		if len(v.Contributors) == 0 {
			return fmt.Errorf("v%d has no contributor", v.Version)
		}
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				if w, ok := inVersion[id]; ok {
					return fmt.Errorf("batch %s trained in v%d and v%d", id, w, v.Version)
				}
				inVersion[id] = v.Version
				b, ok := s.Batches[id]
				if !ok || b.Status != Trained || b.Version != v.Version || b.Trainer != c.Trainer {
					return fmt.Errorf("batch %s contributed to v%d by %s is %+v", id, v.Version, c.Trainer, b)
				}
			}
			for _, x := range []float64{c.Norm, c.Clipped, c.Seconds} {
				if math.IsNaN(x) || math.IsInf(x, 0) {
					return fmt.Errorf("v%d: contribution %+v", v.Version, c)
				}
			}
		}
	}
	for id, b := range s.Batches {
		if b.Status == Trained {
			if _, ok := inVersion[id]; !ok {
				return fmt.Errorf("trained batch %s is no version's contributor", id)
			}
		}
	}

	// The open round: trains from the current version, and its shares are
	// exactly the assigned batches.
	if r := s.Round; r != nil {
		cur, ok := s.Current()
		if !ok || r.Base != cur.Version || r.Number != s.Rounds {
			return fmt.Errorf("round %d from v%d, current v%d, rounds %d", r.Number, r.Base, cur.Version, s.Rounds)
		}
		n := 0
		seen := map[core.BatchID]bool{}
		for t, ids := range r.Shares {
			for _, id := range ids {
				b, ok := s.Batches[id]
				if !ok || b.Status != Assigned || b.Round != r.Number || b.Trainer != t || seen[id] {
					return fmt.Errorf("share of %s in round %d: batch %s is %+v", t, r.Number, id, b)
				}
				seen[id] = true
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("round %d assigns no batch", r.Number)
		}
		if n != recount[Assigned] {
			return fmt.Errorf("round %d assigns %d batches, %d are assigned", r.Number, n, recount[Assigned])
		}
	} else if recount[Assigned] != 0 {
		return fmt.Errorf("%d batches assigned with no round open", recount[Assigned])
	}

	for p := range s.Revoked {
		if _, ok := s.Trainers[p]; ok {
			return fmt.Errorf("revoked %s is a registered trainer", p)
		}
	}
	for id, t := range s.Trainers {
		if t == nil || t.ID != id || !(t.Speed > 0) || math.IsInf(t.Speed, 0) {
			return fmt.Errorf("trainer %s: %+v", id, t)
		}
	}
	c := s.Config
	for _, x := range []float64{c.LR, c.MaxNorm, c.Trim} {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("config %+v", c)
		}
	}
	return nil
}

// wantErr reports whether err matches want (nil: accepted).
func wantErr(err, want error) bool {
	if want == nil {
		return err == nil
	}
	return errors.Is(err, want)
}

// cloneState is a deep copy of s, through JSON as a snapshot would make it.
func cloneState(t testing.TB, s *State) *State {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	c := New()
	if err := json.Unmarshal(b, c); err != nil {
		t.Fatalf("unmarshal state: %v", err)
	}
	c.fill()
	return c
}

// diff shows where two JSON texts first differ.
func diff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-200)
	return fmt.Sprintf("at byte %d:\n  %s\n  %s", i, a[from:min(len(a), i+200)], b[from:min(len(b), i+200)])
}
