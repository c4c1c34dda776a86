// Package grouptest holds what the tests of the trainers' replicated state
// share, in package group and in what drives it (package raftfsm): fixed
// states to start from (a Fixture), the invariants every state keeps
// (CheckInvariants), a seeded random driver of plausible entries that
// records the log it applied (Driver, RecordLog), and the states' JSON
// for comparing them. Only tests import it.
package grouptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// T0 is when a Fixture's clock starts.
var T0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// HashN is a valid 64-hex-digit hash (adapter hashes and batch ids alike).
func HashN(n int) string { return fmt.Sprintf("%064x", n) }

// Bid is batch n's id.
func Bid(n int) core.BatchID { return core.BatchID(fmt.Sprintf("%064x", 1<<40+n)) }

// Fixture drives a State with increasing raft indices and a clock that
// ticks a second per entry.
type Fixture struct {
	T     testing.TB
	S     *group.State
	Term  uint64 // the term of the entries it applies
	Index uint64 // the index of the last entry it applied
}

// NewFixture is an empty state at term 1.
func NewFixture(t testing.TB) *Fixture { return &Fixture{T: t, S: group.New(), Term: 1} }

// At is the clock: T0 and a second per entry applied.
func (f *Fixture) At() time.Time { return T0.Add(time.Duration(f.Index) * time.Second) }

// Apply applies e at the next index, stamping e.At if unset.
func (f *Fixture) Apply(e *group.Entry) error {
	f.T.Helper()
	f.Index++
	if e != nil && e.At.IsZero() {
		e.At = f.At()
	}
	return f.S.Apply(e, f.Term, f.Index)
}

// Must applies e and fails the test if it is refused.
func (f *Fixture) Must(e *group.Entry) {
	f.T.Helper()
	if err := f.Apply(e); err != nil {
		f.T.Fatalf("apply %s: %v", EntryString(e), err)
	}
}

// EntryString is e as JSON, for messages.
func EntryString(e *group.Entry) string {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Sprintf("%+v", e)
	}
	return string(b)
}

// Ready is a configured state with version 0, trainers t1 (speed 1) and t2
// (speed 2), t3 (speed 1), and batches 1..6 (from d1 for odd, d2 for even,
// 4 steps each).
func Ready(t testing.TB) *Fixture {
	f := NewFixture(t)
	f.Must(&group.Entry{Configure: &group.Config{Quota: 64, RoundSteps: 128}})
	f.Must(&group.Entry{Genesis: &group.Genesis{Hash: HashN(0), Publisher: "t1"}})
	f.Must(&group.Entry{Register: &group.Trainer{ID: "t1", Engine: "cpu", Device: "x", Speed: 1}})
	f.Must(&group.Entry{Register: &group.Trainer{ID: "t2", Engine: "cpu", Device: "y", Speed: 2}})
	f.Must(&group.Entry{Register: &group.Trainer{ID: "t3", Engine: "cpu", Device: "z", Speed: 1}})
	var refs []group.BatchRef
	for i := 1; i <= 6; i++ {
		from := mesh.PeerID("d1")
		if i%2 == 0 {
			from = "d2"
		}
		refs = append(refs, group.BatchRef{ID: Bid(i), From: from, Steps: 4, Adapters: []string{"v0"}})
	}
	f.Must(&group.Entry{Add: refs})
	return f
}

// Open is ready with round 1 open: t1 has batches 1 and 2, t2 batch 3.
func Open(t testing.TB) *Fixture {
	f := Ready(t)
	f.Must(&group.Entry{Start: &group.Start{Round: 1, Base: 0, Leader: "t1", Deadline: T0.Add(time.Hour),
		Shares: map[mesh.PeerID][]core.BatchID{"t1": {Bid(1), Bid(2)}, "t2": {Bid(3)}}}})
	return f
}

// Published is open with round 1 published as v1 (t1 trained 1 and 2, t2
// trained 3).
func Published(t testing.TB) *Fixture {
	f := Open(t)
	f.Must(&group.Entry{Publish: &group.Publish{Round: 1, Version: 1, Parent: 0, Hash: HashN(1), Publisher: "t1",
		Contributors: []group.Contribution{{Trainer: "t1", Batches: []core.BatchID{Bid(1), Bid(2)}, Samples: 8}, {Trainer: "t2", Batches: []core.BatchID{Bid(3)}, Samples: 4}}}})
	return f
}

// StateJSON is s as JSON with the applied term and index left out: what a
// refused entry must leave unchanged.
func StateJSON(t testing.TB, s *group.State) string {
	t.Helper()
	c := *s
	c.Term, c.Index = 0, 0
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	return string(b)
}

// FullJSON is s as JSON.
func FullJSON(t testing.TB, s *group.State) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	return string(b)
}

// CheckInvariants reports the first invariant s breaks.
func CheckInvariants(s *group.State) error {
	// Counts is a recount of the statuses; every batch is in a known status
	// with fields that fit it.
	recount := map[group.Status]int{}
	for id, b := range s.Batches {
		if b == nil || b.ID != id {
			return fmt.Errorf("batch %s: bad line %+v", id, b)
		}
		recount[b.Status]++
		switch b.Status {
		case group.Pending:
			if b.Round != 0 || b.Trainer != "" || b.Version != 0 || b.Reason != "" {
				return fmt.Errorf("pending batch %s: %+v", id, b)
			}
			if _, ok := s.Revoked[b.From]; ok && b.From != "" {
				return fmt.Errorf("pending batch %s from revoked %s", id, b.From)
			}
		case group.Assigned:
			if s.Round == nil || b.Round != s.Round.Number || !slices.Contains(s.Round.Shares[b.Trainer], id) {
				return fmt.Errorf("assigned batch %s (round %d, trainer %s) not in the open round's shares", id, b.Round, b.Trainer)
			}
		case group.Trained:
			// Version 0 only for one of a round closed with no version.
			if b.Version >= uint64(len(s.Versions)) || b.Version == 0 && !slices.ContainsFunc(s.Closed, func(c group.ClosedRound) bool { return c.Round == b.Round }) {
				return fmt.Errorf("trained batch %s in version %d of %d", id, b.Version, len(s.Versions))
			}
		case group.Refused:
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
	for _, st := range []group.Status{group.Pending, group.Assigned, group.Trained, group.Refused} {
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
	if refusals != recount[group.Refused] {
		return fmt.Errorf("refusals count %d batches, %d are refused (%v)", refusals, recount[group.Refused], s.Refusals)
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
				if !ok || b.Status != group.Trained || b.Version != v.Version || b.Trainer != c.Trainer {
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
	// A round closed with no version: its contributors' batches were
	// trained in it, into none, and left its base current.
	closed := map[core.BatchID]bool{}
	for i, c := range s.Closed {
		if c.Round == 0 || c.Round > s.Rounds || i > 0 && c.Round <= s.Closed[i-1].Round || c.Base >= uint64(len(s.Versions)) || len(c.Contributors) == 0 {
			return fmt.Errorf("closed round %+v", c)
		}
		for _, v := range s.Versions {
			if v.Round == c.Round {
				return fmt.Errorf("round %d closed with no version and published v%d", c.Round, v.Version)
			}
		}
		for _, ct := range c.Contributors {
			for _, id := range ct.Batches {
				if _, ok := inVersion[id]; ok || closed[id] {
					return fmt.Errorf("batch %s of closed round %d trained twice", id, c.Round)
				}
				closed[id] = true
				b, ok := s.Batches[id]
				if !ok || b.Status != group.Trained || b.Version != c.Base || b.Round != c.Round || b.Trainer != ct.Trainer {
					return fmt.Errorf("batch %s of closed round %d by %s is %+v", id, c.Round, ct.Trainer, b)
				}
			}
		}
	}
	for id, b := range s.Batches {
		if b.Status == group.Trained && !closed[id] {
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
				if !ok || b.Status != group.Assigned || b.Round != r.Number || b.Trainer != t || seen[id] {
					return fmt.Errorf("share of %s in round %d: batch %s is %+v", t, r.Number, id, b)
				}
				seen[id] = true
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("round %d assigns no batch", r.Number)
		}
		if n != recount[group.Assigned] {
			return fmt.Errorf("round %d assigns %d batches, %d are assigned", r.Number, n, recount[group.Assigned])
		}
	} else if recount[group.Assigned] != 0 {
		return fmt.Errorf("%d batches assigned with no round open", recount[group.Assigned])
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

// WantErr reports whether err matches want (nil: accepted).
func WantErr(err, want error) bool {
	if want == nil {
		return err == nil
	}
	return errors.Is(err, want)
}

// CloneState is a deep copy of s, through JSON as a snapshot would make it.
func CloneState(t testing.TB, s *group.State) *group.State {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	c, err := group.DecodeState(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("unmarshal state: %v", err)
	}
	return c
}

// Diff shows where two JSON texts first differ.
func Diff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-200)
	return fmt.Sprintf("at byte %d:\n  %s\n  %s", i, a[from:min(len(a), i+200)], b[from:min(len(b), i+200)])
}

// validHash is what group takes for a hash: 64 lowercase hex digits.
func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := range len(h) {
		c := h[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
