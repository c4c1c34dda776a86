package group_test

import (
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

// TestFencingLeaderChange plays a leader deposed in the middle of a round:
// the new leader aborts the round and publishes its own version; every late
// entry of the old leader is then refused and changes nothing.
func TestFencingLeaderChange(t *testing.T) {
	f := grouptest.Open(t) // round 1 opened by t1 in term 1
	old := &Publish{Round: 1, Version: 1, Parent: 0, Hash: grouptest.HashN(0xdead), Publisher: "t1",
		Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1), grouptest.Bid(2)}}}}

	// Term 2: t2 leads, aborts the round and runs round 2.
	f.Term = 2
	f.Must(&Entry{Abort: &Abort{Round: 1, Reason: "new leader"}})
	st, ok := f.S.Plan(f.At(), "t2", []mesh.PeerID{"t1", "t2", "t3"})
	if !ok || st.Round != 2 {
		t.Fatalf("plan %+v %v", st, ok)
	}
	refuse := func(e *Entry, want error) {
		t.Helper()
		before := grouptest.StateJSON(t, f.S)
		if err := f.Apply(e); !errors.Is(err, want) {
			t.Fatalf("apply %s: %v, want %v", grouptest.EntryString(e), err, want)
		}
		if after := grouptest.StateJSON(t, f.S); after != before {
			t.Fatalf("refused entry changed the state %s", grouptest.Diff(before, after))
		}
	}
	// The old leader's publish of round 1 lands now: no such round.
	refuse(&Entry{Publish: old}, ErrNoRound)
	f.Must(&Entry{Start: st})
	// A Start while round 2 is open, whoever proposes it.
	refuse(&Entry{Start: &Start{Round: 3, Base: 0, Leader: "t1", Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(6)}}}}, ErrFenced)
	refuse(&Entry{Start: &Start{Round: 2, Base: 0, Leader: "t1", Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(6)}}}}, ErrFenced)
	// The old leader's publish under round 2's number, still v1 from v0, but
	// its contributors have no share or another's batches.
	var contribs []Contribution
	for _, p := range (&Round{Shares: st.Shares}).Trainers() {
		contribs = append(contribs, Contribution{Trainer: p, Batches: st.Shares[p]})
	}
	good := &Publish{Round: 2, Version: 1, Parent: 0, Hash: grouptest.HashN(0xbeef), Publisher: "t2", Contributors: contribs}
	f.Must(&Entry{Publish: good})
	v1, _ := f.S.Current()
	if v1.Term != 2 || v1.Hash != grouptest.HashN(0xbeef) || v1.Round != 2 {
		t.Fatalf("v1 %+v", v1)
	}
	// The same round again, and the old leader's v1.
	refuse(&Entry{Publish: good}, ErrNoRound)
	refuse(&Entry{Publish: old}, ErrNoRound)
	// Round 3 from v1; publishes naming the wrong parent or version.
	f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(7), Steps: 1}, {ID: grouptest.Bid(8), Steps: 1}}})
	st3, ok := f.S.Plan(f.At(), "t2", []mesh.PeerID{"t3"})
	if !ok {
		t.Fatal("no round 3")
	}
	f.Must(&Entry{Start: st3})
	c3 := []Contribution{{Trainer: "t3", Batches: st3.Shares["t3"]}}
	refuse(&Entry{Publish: &Publish{Round: 3, Version: 1, Parent: 0, Hash: grouptest.HashN(3), Contributors: c3}}, ErrVersion)
	refuse(&Entry{Publish: &Publish{Round: 3, Version: 2, Parent: 0, Hash: grouptest.HashN(3), Contributors: c3}}, ErrVersion)
	refuse(&Entry{Publish: &Publish{Round: 3, Version: 3, Parent: 1, Hash: grouptest.HashN(3), Contributors: c3}}, ErrVersion)
	refuse(&Entry{Publish: &Publish{Round: 2, Version: 2, Parent: 1, Hash: grouptest.HashN(3), Contributors: c3}}, ErrNoRound)
	refuse(&Entry{Abort: &Abort{Round: 2}}, ErrNoRound)
	f.Must(&Entry{Publish: &Publish{Round: 3, Version: 2, Parent: 1, Hash: grouptest.HashN(3), Contributors: c3}})
	if err := grouptest.CheckInvariants(f.S); err != nil {
		t.Fatal(err)
	}
	if len(f.S.Versions) != 3 || f.S.Rounds != 3 {
		t.Fatalf("versions %d rounds %d", len(f.S.Versions), f.S.Rounds)
	}
}

func TestCheck(t *testing.T) {
	f := grouptest.Published(t) // v0 and v1 in term 1
	f.Term = 3
	f.Index += 10
	f.Must(&Entry{Start: &Start{Round: 2, Base: 1, Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(4)}}}})
	f.Must(&Entry{Publish: &Publish{Round: 2, Version: 2, Parent: 1, Hash: grouptest.HashN(2), Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(4)}}}}})
	v0, _ := f.S.Version(0)
	v1, _ := f.S.Version(1)
	v2, _ := f.S.Current()
	if v2.Version != 2 || v2.Term != 3 {
		t.Fatalf("v2 %+v", v2)
	}
	for _, v := range []Version{v0, v1, v2} {
		if err := f.S.Check(ClaimOf(v)); err != nil {
			t.Errorf("committed %s refused: %v", v.Name(), err)
		}
	}
	c := ClaimOf(v2)
	bad := map[string]Claim{
		// A deposed term-2 leader published its own v2 that never committed.
		"deposed leader's v2": {Version: 2, Hash: grouptest.HashN(0xbad), Term: 2, Index: v2.Index - 1},
		"other hash":          {Version: 2, Hash: grouptest.HashN(0xbad), Term: c.Term, Index: c.Index},
		"other term":          {Version: 2, Hash: c.Hash, Term: 2, Index: c.Index},
		"later term":          {Version: 2, Hash: c.Hash, Term: 4, Index: c.Index},
		"other index":         {Version: 2, Hash: c.Hash, Term: c.Term, Index: c.Index + 1},
		"v1 under v2's token": {Version: 1, Hash: v1.Hash, Term: c.Term, Index: c.Index},
		"v2 with v1's hash":   {Version: 2, Hash: v1.Hash, Term: v1.Term, Index: v1.Index},
		"older v3":            {Version: 3, Hash: grouptest.HashN(3), Term: 2, Index: v2.Index + 5},
		"v3 at v2's token":    {Version: 3, Hash: grouptest.HashN(3), Term: c.Term, Index: c.Index},
		"uncommitted v3":      {Version: 3, Hash: grouptest.HashN(3), Term: 4, Index: c.Index + 1},
		"far future":          {Version: 1 << 62, Hash: grouptest.HashN(3), Term: 9, Index: 1 << 40},
		"empty":               {},
	}
	for name, c := range bad {
		if err := f.S.Check(c); !errors.Is(err, ErrFenced) {
			t.Errorf("%s: Check(%+v) = %v, want ErrFenced", name, c, err)
		}
	}
	if err := New().Check(Claim{}); !errors.Is(err, ErrFenced) {
		t.Errorf("Check on an empty lineage: %v", err)
	}
	if err := New().Check(Claim{Version: 0, Hash: grouptest.HashN(0), Term: 1, Index: 1}); !errors.Is(err, ErrFenced) {
		t.Errorf("Check on an empty lineage: %v", err)
	}
}
