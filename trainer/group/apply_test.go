package group_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/model/loss"

	// group's tests are package group_test, as they use grouptest, which
	// imports group: a dot import keeps them reading as the package's own.
	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

type applyCase struct {
	name  string
	setup func(testing.TB) *grouptest.Fixture
	entry *Entry
	want  error // nil: accepted
	check func(t *testing.T, s *State)
}

// runApplyCases applies each case's entry to its fixture. An accepted entry
// is checked by the case; a refused one must wrap the case's sentinel and
// leave the state as it was but for the applied term and index.
func runApplyCases(t *testing.T, cases []applyCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.setup(t)
			before := grouptest.StateJSON(t, f.S)
			err := f.Apply(c.entry)
			if !grouptest.WantErr(err, c.want) {
				t.Fatalf("apply %s: err %v, want %v", grouptest.EntryString(c.entry), err, c.want)
			}
			if f.S.Term != f.Term || f.S.Index != f.Index {
				t.Errorf("applied (%d,%d), want (%d,%d)", f.S.Term, f.S.Index, f.Term, f.Index)
			}
			if err != nil {
				if after := grouptest.StateJSON(t, f.S); after != before {
					t.Fatalf("refused entry changed the state %s", grouptest.Diff(before, after))
				}
			} else if c.check != nil {
				c.check(t, f.S)
			}
			if err := grouptest.CheckInvariants(f.S); err != nil {
				t.Fatalf("invariant: %v", err)
			}
		})
	}
}

func fresh(t testing.TB) *grouptest.Fixture { return grouptest.NewFixture(t) }

func TestApplyMalformed(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "nil", setup: grouptest.Ready, entry: nil, want: ErrEntry},
		{name: "no command", setup: grouptest.Ready, entry: &Entry{}, want: ErrEntry},
		{name: "two commands", setup: grouptest.Ready, entry: &Entry{Leave: "t1", Abort: &Abort{Round: 1}}, want: ErrEntry},
		{name: "three commands", setup: grouptest.Open, entry: &Entry{Add: []BatchRef{{ID: grouptest.Bid(50)}}, Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}}, Speeds: []SpeedUpdate{{Trainer: "t1", Speed: 3}}}, want: ErrEntry},
		{name: "empty lists", setup: grouptest.Open, entry: &Entry{Add: []BatchRef{}, Refuse: []Refusal{}, Speeds: []SpeedUpdate{}}, want: ErrEntry},
	})
}

func TestApplyConfigure(t *testing.T) {
	cases := []applyCase{
		{name: "defaults", setup: fresh, entry: &Entry{Configure: &Config{}}, check: func(t *testing.T, s *State) {
			if !s.Configured || s.Config != (Config{}).WithDefaults() {
				t.Errorf("config %+v", s.Config)
			}
			if s.Config.Recipe != "combined" || s.Config.Quota != DefaultQuota || s.Config.Deadline != DefaultDeadline {
				t.Errorf("defaults not applied: %+v", s.Config)
			}
		}},
		{name: "set", setup: fresh, entry: &Entry{Configure: &Config{Recipe: "binary", Quota: 7, RoundSteps: 9, Aggregate: AggTrimmed}}, check: func(t *testing.T, s *State) {
			c := s.Config
			if c.Quota != 7 || c.RoundSteps != 9 || c.Recipe != "binary" || c.Trim != DefaultTrim || c.RecipeOf().String() != "rl" {
				t.Errorf("config %+v", c)
			}
		}},
		{name: "quota after genesis", setup: grouptest.Ready, entry: &Entry{Configure: &Config{Quota: 3}}, check: func(t *testing.T, s *State) {
			if s.Config.Quota != 3 || s.Config.RoundSteps != DefaultRoundSteps {
				t.Errorf("config %+v", s.Config)
			}
		}},
		{name: "same base after genesis", setup: grouptest.Ready, entry: &Entry{Configure: &Config{Base: DefaultBase, Seed: DefaultSeed, LR: 0.5}}, check: func(t *testing.T, s *State) {
			if s.Config.LR != 0.5 {
				t.Errorf("config %+v", s.Config)
			}
		}},
		{name: "base after genesis", setup: grouptest.Ready, entry: &Entry{Configure: &Config{Base: "llama"}}, want: ErrConfig},
		{name: "base hash after genesis", setup: grouptest.Ready, entry: &Entry{Configure: &Config{BaseHash: grouptest.HashN(9)}}, want: ErrConfig},
		{name: "seed after genesis", setup: grouptest.Ready, entry: &Entry{Configure: &Config{Seed: 2}}, want: ErrConfig},
	}
	bad := map[string]Config{
		"recipe":       {Recipe: "sft"},
		"max lag":      {MaxLag: -1},
		"local steps":  {LocalSteps: -1},
		"many steps":   {LocalSteps: 10001},
		"lr":           {LR: 1.5},
		"lr negative":  {LR: -0.1},
		"lr nan":       {LR: math.NaN()},
		"quota":        {Quota: -4},
		"round steps":  {RoundSteps: -1},
		"deadline":     {Deadline: time.Millisecond},
		"aggregate":    {Aggregate: "median"},
		"max norm":     {MaxNorm: -1},
		"max norm inf": {MaxNorm: math.Inf(1)},
		"trim":         {Aggregate: AggTrimmed, Trim: 0.5},
		"trim nan":     {Trim: math.NaN()},
		"base":         {Base: "a\nb"},
		"base nul":     {Base: "a\x00"},
	}
	for name, c := range bad {
		cases = append(cases, applyCase{name: "bad " + name, setup: fresh, entry: &Entry{Configure: &c}, want: ErrConfig})
		cases = append(cases, applyCase{name: "bad " + name + " after genesis", setup: grouptest.Ready, entry: &Entry{Configure: &c}, want: ErrConfig})
	}
	runApplyCases(t, cases)
}

func TestApplyGenesis(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "fresh", setup: fresh, entry: &Entry{At: grouptest.T0, Genesis: &Genesis{Hash: grouptest.HashN(7), Publisher: "p"}}, check: func(t *testing.T, s *State) {
			v, ok := s.Current()
			if !ok || len(s.Versions) != 1 || v.Version != 0 || v.Hash != grouptest.HashN(7) || v.Term != 1 || v.Index != 1 || v.Publisher != "p" || !v.At.Equal(grouptest.T0) || v.Name() != "v0" {
				t.Errorf("genesis %+v", v)
			}
			if !s.Configured || s.Config != (Config{}).WithDefaults() {
				t.Errorf("genesis left config %+v", s.Config)
			}
		}},
		{name: "configured", setup: func(t testing.TB) *grouptest.Fixture {
			f := fresh(t)
			f.Must(&Entry{Configure: &Config{Quota: 5}})
			return f
		}, entry: &Entry{Genesis: &Genesis{Hash: grouptest.HashN(7)}}, check: func(t *testing.T, s *State) {
			if s.Config.Quota != 5 {
				t.Errorf("genesis reset the config: %+v", s.Config)
			}
		}},
		{name: "twice", setup: grouptest.Ready, entry: &Entry{Genesis: &Genesis{Hash: grouptest.HashN(7)}}, want: ErrGenesis},
		{name: "after publish", setup: grouptest.Published, entry: &Entry{Genesis: &Genesis{Hash: grouptest.HashN(0)}}, want: ErrGenesis},
		{name: "short hash", setup: fresh, entry: &Entry{Genesis: &Genesis{Hash: "abc"}}, want: ErrEntry},
		{name: "upper hash", setup: fresh, entry: &Entry{Genesis: &Genesis{Hash: strings.ToUpper(grouptest.HashN(0xabc))}}, want: ErrEntry},
		{name: "empty hash", setup: fresh, entry: &Entry{Genesis: &Genesis{}}, want: ErrEntry},
	})
}

func TestApplyAdd(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "new", setup: grouptest.Ready, entry: &Entry{At: grouptest.T0.Add(time.Hour), Add: []BatchRef{{ID: grouptest.Bid(10), From: "d3", Steps: 3, Adapters: []string{"v0", "x"}}, {ID: grouptest.Bid(11)}}}, check: func(t *testing.T, s *State) {
			b := s.Batches[grouptest.Bid(10)]
			if b == nil || b.Status != Pending || b.From != "d3" || b.Steps != 3 || len(b.Adapters) != 2 || !b.Added.Equal(grouptest.T0.Add(time.Hour)) {
				t.Errorf("batch %+v", b)
			}
			if s.Batches[grouptest.Bid(11)] == nil || s.Counts[Pending] != 8 {
				t.Errorf("counts %v", s.Counts)
			}
		}},
		// An empty list is no command: its encoding leaves it out.
		{name: "empty", setup: grouptest.Ready, entry: &Entry{Add: []BatchRef{}}, want: ErrEntry},
		{name: "empty and another", setup: grouptest.Ready, entry: &Entry{Add: []BatchRef{}, Leave: "t1"}},
		{name: "known ids are kept", setup: grouptest.Published, entry: &Entry{Add: []BatchRef{{ID: grouptest.Bid(1), Steps: 99}, {ID: grouptest.Bid(4), Steps: 99}, {ID: grouptest.Bid(12), Steps: 1}, {ID: grouptest.Bid(12), Steps: 2}}}, check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(1)]; b.Status != Trained || b.Steps != 4 {
				t.Errorf("trained batch re-added: %+v", b)
			}
			if b := s.Batches[grouptest.Bid(4)]; b.Status != Pending || b.Steps != 4 {
				t.Errorf("pending batch re-added: %+v", b)
			}
			if b := s.Batches[grouptest.Bid(12)]; b.Steps != 1 {
				t.Errorf("a batch twice in one entry: %+v", b)
			}
		}},
		{name: "from revoked", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Ready(t)
			f.Must(&Entry{Revoke: &Revocation{Peer: "d9", Reason: "bad: data"}})
			return f
		}, entry: &Entry{Add: []BatchRef{{ID: grouptest.Bid(20), From: "d9"}, {ID: grouptest.Bid(21), From: "d8"}}}, check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(20)]; b.Status != Refused || b.Reason != "revoked: bad: data" {
				t.Errorf("batch from revoked %+v", b)
			}
			if b := s.Batches[grouptest.Bid(21)]; b.Status != Pending {
				t.Errorf("batch %+v", b)
			}
			if s.Refusals[ReasonRevoked] != 1 {
				t.Errorf("refusals %v", s.Refusals)
			}
		}},
		{name: "bad id", setup: grouptest.Ready, entry: &Entry{Add: []BatchRef{{ID: grouptest.Bid(30)}, {ID: "nope"}}}, want: ErrEntry},
		{name: "empty id", setup: grouptest.Ready, entry: &Entry{Add: []BatchRef{{ID: ""}}}, want: ErrEntry},
		{name: "negative steps", setup: grouptest.Ready, entry: &Entry{Add: []BatchRef{{ID: grouptest.Bid(30)}, {ID: grouptest.Bid(31), Steps: -1}}}, want: ErrEntry},
	})
}

func TestApplyAddCopies(t *testing.T) {
	f := grouptest.Ready(t)
	ad := []string{"v0"}
	f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(40), Adapters: ad}}})
	ad[0] = "v9"
	if got := f.S.Batches[grouptest.Bid(40)].Adapters[0]; got != "v0" {
		t.Errorf("the state shares the entry's adapters: %q", got)
	}
	addrs := []string{"a:1"}
	f.Must(&Entry{Register: &Trainer{ID: "t9", Addrs: addrs}})
	addrs[0] = "b:2"
	if got := f.S.Trainers["t9"].Addrs[0]; got != "a:1" {
		t.Errorf("the state shares the entry's addresses: %q", got)
	}
	shares := map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(1)}}
	f.Must(&Entry{Start: &Start{Round: 1, Shares: shares}})
	shares["t1"][0] = grouptest.Bid(2)
	shares["t2"] = []core.BatchID{grouptest.Bid(3)}
	if got := f.S.Share("t1"); len(got) != 1 || got[0] != grouptest.Bid(1) || f.S.Share("t2") != nil {
		t.Errorf("the state shares the entry's shares: %v", f.S.Round.Shares)
	}
	cs := []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1)}}}
	f.Must(&Entry{Publish: &Publish{Round: 1, Version: 1, Hash: grouptest.HashN(1), Contributors: cs}})
	cs[0].Batches[0] = grouptest.Bid(5)
	cs[0].Trainer = "t2"
	if v, _ := f.S.Current(); v.Contributors[0].Batches[0] != grouptest.Bid(1) || v.Contributors[0].Trainer != "t1" {
		t.Errorf("the state shares the entry's contributors: %+v", v.Contributors)
	}
	if err := grouptest.CheckInvariants(f.S); err != nil {
		t.Fatal(err)
	}
}

func TestApplyRefuse(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "pending", setup: grouptest.Ready, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: ReasonStale}, {ID: grouptest.Bid(5), Reason: "unreadable: io error"}}}, check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(4)]; b.Status != Refused || b.Reason != ReasonStale {
				t.Errorf("batch %+v", b)
			}
			if b := s.Batches[grouptest.Bid(5)]; b.Status != Refused || b.Reason != "unreadable: io error" {
				t.Errorf("batch %+v", b)
			}
			if s.Refusals[ReasonStale] != 1 || s.Refusals["unreadable"] != 1 || s.Counts[Refused] != 2 || s.Counts[Pending] != 4 {
				t.Errorf("refusals %v counts %v", s.Refusals, s.Counts)
			}
		}},
		{name: "unknown", setup: grouptest.Ready, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}, {ID: grouptest.Bid(99), Reason: "x"}}}, want: ErrBatch},
		{name: "assigned", setup: grouptest.Open, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}, {ID: grouptest.Bid(1), Reason: "x"}}}, want: ErrBatch},
		{name: "trained", setup: grouptest.Published, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(1), Reason: "x"}}}, want: ErrBatch},
		{name: "refused", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Ready(t)
			f.Must(&Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}}})
			return f
		}, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "y"}}}, want: ErrBatch},
		{name: "twice in one entry", setup: grouptest.Ready, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}, {ID: grouptest.Bid(4), Reason: "y"}}}, want: ErrBatch},
		{name: "no reason", setup: grouptest.Ready, entry: &Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}, {ID: grouptest.Bid(5)}}}, want: ErrEntry},
	})
}

func TestApplyRegister(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "new", setup: grouptest.Ready, entry: &Entry{At: grouptest.T0.Add(time.Hour), Register: &Trainer{ID: "t9", Engine: "mlx", Device: "m", Addrs: []string{"a"}, Joined: grouptest.T0}}, check: func(t *testing.T, s *State) {
			tr := s.Trainers["t9"]
			if tr == nil || tr.Speed != 1 || tr.Engine != "mlx" || tr.Device != "m" || !tr.Joined.Equal(grouptest.T0.Add(time.Hour)) || len(tr.Addrs) != 1 {
				t.Errorf("trainer %+v", tr)
			}
		}},
		{name: "again", setup: grouptest.Ready, entry: &Entry{At: grouptest.T0.Add(time.Hour), Register: &Trainer{ID: "t2", Engine: "cuda"}}, check: func(t *testing.T, s *State) {
			tr := s.Trainers["t2"]
			if tr.Speed != 2 || tr.Engine != "cuda" || tr.Device != "" || tr.Joined.Equal(grouptest.T0.Add(time.Hour)) {
				t.Errorf("trainer %+v", tr)
			}
		}},
		{name: "new speed", setup: grouptest.Ready, entry: &Entry{Register: &Trainer{ID: "t2", Speed: 5}}, check: func(t *testing.T, s *State) {
			if s.Trainers["t2"].Speed != 5 {
				t.Errorf("trainer %+v", s.Trainers["t2"])
			}
		}},
		{name: "no id", setup: grouptest.Ready, entry: &Entry{Register: &Trainer{Speed: 1}}, want: ErrEntry},
		{name: "negative speed", setup: grouptest.Ready, entry: &Entry{Register: &Trainer{ID: "t9", Speed: -1}}, want: ErrEntry},
		{name: "nan speed", setup: grouptest.Ready, entry: &Entry{Register: &Trainer{ID: "t9", Speed: math.NaN()}}, want: ErrEntry},
		{name: "infinite speed", setup: grouptest.Ready, entry: &Entry{Register: &Trainer{ID: "t9", Speed: math.Inf(1)}}, want: ErrEntry},
		{name: "huge speed", setup: grouptest.Ready, entry: &Entry{Register: &Trainer{ID: "t1", Speed: 1e300}}, want: ErrEntry},
		{name: "revoked", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Ready(t)
			f.Must(&Entry{Revoke: &Revocation{Peer: "t1"}})
			return f
		}, entry: &Entry{Register: &Trainer{ID: "t1"}}, want: ErrTrainer},
	})
}

func TestApplyLeave(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "known", setup: grouptest.Ready, entry: &Entry{Leave: "t2"}, check: func(t *testing.T, s *State) {
			if _, ok := s.Trainers["t2"]; ok || len(s.Trainers) != 2 {
				t.Errorf("trainers %v", s.Trainers)
			}
		}},
		{name: "in the open round", setup: grouptest.Open, entry: &Entry{Leave: "t2"}, check: func(t *testing.T, s *State) {
			if _, ok := s.Trainers["t2"]; ok || len(s.Share("t2")) != 1 {
				t.Errorf("trainers %v, shares %v", s.Trainers, s.Round.Shares)
			}
		}},
		{name: "unknown", setup: grouptest.Ready, entry: &Entry{Leave: "t9"}, want: ErrTrainer},
	})
}

func TestApplyStart(t *testing.T) {
	sh := func(kv ...any) map[mesh.PeerID][]core.BatchID {
		m := map[mesh.PeerID][]core.BatchID{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[mesh.PeerID(kv[i].(string))] = kv[i+1].([]core.BatchID)
		}
		return m
	}
	ids := func(ns ...int) []core.BatchID {
		var out []core.BatchID
		for _, n := range ns {
			out = append(out, grouptest.Bid(n))
		}
		return out
	}
	noGenesis := func(t testing.TB) *grouptest.Fixture {
		f := fresh(t)
		f.Must(&Entry{Register: &Trainer{ID: "t1"}})
		f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(1)}}})
		return f
	}
	aborted := func(t testing.TB) *grouptest.Fixture {
		f := grouptest.Open(t)
		f.Must(&Entry{Abort: &Abort{Round: 1}})
		return f
	}
	runApplyCases(t, []applyCase{
		{name: "first", setup: grouptest.Ready, entry: &Entry{At: grouptest.T0.Add(time.Minute), Start: &Start{Round: 1, Base: 0, Leader: "t2", Deadline: grouptest.T0.Add(time.Hour), Shares: sh("t1", ids(1, 2), "t2", ids(4))}}, check: func(t *testing.T, s *State) {
			r := s.Round
			if r == nil || r.Number != 1 || r.Base != 0 || r.Term != 1 || r.Leader != "t2" || !r.Started.Equal(grouptest.T0.Add(time.Minute)) || !r.Deadline.Equal(grouptest.T0.Add(time.Hour)) || s.Rounds != 1 {
				t.Fatalf("round %+v", r)
			}
			if got := r.Trainers(); len(got) != 2 || got[0] != "t1" || got[1] != "t2" {
				t.Errorf("trainers %v", got)
			}
			for n, tr := range map[int]mesh.PeerID{1: "t1", 2: "t1", 4: "t2"} {
				if b := s.Batches[grouptest.Bid(n)]; b.Status != Assigned || b.Round != 1 || b.Trainer != tr || b.Tries != 1 {
					t.Errorf("batch %d: %+v", n, b)
				}
			}
			if s.Counts[Assigned] != 3 || s.Counts[Pending] != 3 {
				t.Errorf("counts %v", s.Counts)
			}
		}},
		{name: "after abort", setup: aborted, entry: &Entry{Start: &Start{Round: 2, Shares: sh("t3", ids(1))}}, check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(1)]; b.Tries != 2 || b.Round != 2 || b.Trainer != "t3" {
				t.Errorf("batch %+v", b)
			}
		}},
		{name: "after publish", setup: grouptest.Published, entry: &Entry{Start: &Start{Round: 2, Base: 1, Shares: sh("t3", ids(4))}}},
		{name: "no genesis", setup: noGenesis, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1))}}, want: ErrNoGenesis},
		{name: "round open", setup: grouptest.Open, entry: &Entry{Start: &Start{Round: 2, Shares: sh("t3", ids(4))}}, want: ErrFenced},
		{name: "round open same number", setup: grouptest.Open, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t3", ids(4))}}, want: ErrFenced},
		{name: "round zero", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 0, Shares: sh("t1", ids(1))}}, want: ErrFenced},
		{name: "round skipped", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 2, Shares: sh("t1", ids(1))}}, want: ErrFenced},
		{name: "round reused after abort", setup: aborted, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1))}}, want: ErrFenced},
		{name: "old base", setup: grouptest.Published, entry: &Entry{Start: &Start{Round: 2, Base: 0, Shares: sh("t1", ids(4))}}, want: ErrVersion},
		{name: "future base", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1, Base: 1, Shares: sh("t1", ids(1))}}, want: ErrVersion},
		{name: "no shares", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1}}, want: ErrEntry},
		{name: "empty shares", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(), "t2", []core.BatchID(nil))}}, want: ErrEntry},
		{name: "unknown trainer", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1), "t9", ids(2))}}, want: ErrTrainer},
		{name: "unknown batch", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1, 99))}}, want: ErrBatch},
		{name: "trained batch", setup: grouptest.Published, entry: &Entry{Start: &Start{Round: 2, Base: 1, Shares: sh("t1", ids(4, 1))}}, want: ErrBatch},
		{name: "refused batch", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Ready(t)
			f.Must(&Entry{Refuse: []Refusal{{ID: grouptest.Bid(2), Reason: "x"}}})
			return f
		}, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1), "t2", ids(2))}}, want: ErrBatch},
		{name: "batch twice in a share", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1, 2, 1))}}, want: ErrBatch},
		{name: "batch in two shares", setup: grouptest.Ready, entry: &Entry{Start: &Start{Round: 1, Shares: sh("t1", ids(1, 2), "t2", ids(3, 2))}}, want: ErrBatch},
	})
}

func TestApplyPublish(t *testing.T) {
	pub := func(mut func(p *Publish)) *Entry {
		p := &Publish{Round: 1, Version: 1, Parent: 0, Hash: grouptest.HashN(1), Publisher: "t1",
			Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1), grouptest.Bid(2)}, Samples: 8, Norm: 1, Clipped: 1, Seconds: 3}, {Trainer: "t2", Batches: []core.BatchID{grouptest.Bid(3)}, Samples: 4}}}
		if mut != nil {
			mut(p)
		}
		return &Entry{Publish: p}
	}
	runApplyCases(t, []applyCase{
		{name: "all", setup: grouptest.Open, entry: pub(nil), check: func(t *testing.T, s *State) {
			v, _ := s.Current()
			if v.Version != 1 || v.Parent != 0 || v.Hash != grouptest.HashN(1) || v.Term != 1 || v.Index != s.Index || v.Round != 1 || v.Publisher != "t1" || len(v.Contributors) != 2 || v.Contributors[0].Samples != 8 || v.Name() != "v1" {
				t.Errorf("version %+v", v)
			}
			if s.Round != nil || s.Rounds != 1 || s.Counts[Trained] != 3 || s.Counts[Assigned] != 0 {
				t.Errorf("round %+v counts %v", s.Round, s.Counts)
			}
			for n, tr := range map[int]mesh.PeerID{1: "t1", 2: "t1", 3: "t2"} {
				if b := s.Batches[grouptest.Bid(n)]; b.Status != Trained || b.Version != 1 || b.Trainer != tr || b.Round != 1 {
					t.Errorf("batch %d: %+v", n, b)
				}
			}
		}},
		{name: "partial", setup: grouptest.Open, entry: pub(func(p *Publish) {
			p.Contributors = []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(2)}}}
			p.Refused = []Refusal{{ID: grouptest.Bid(3), Reason: "verify: bad logprobs"}}
		}), check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(2)]; b.Status != Trained || b.Version != 1 {
				t.Errorf("batch 2: %+v", b)
			}
			if b := s.Batches[grouptest.Bid(1)]; b.Status != Pending || b.Round != 0 || b.Trainer != "" || b.Tries != 1 {
				t.Errorf("batch 1: %+v", b)
			}
			if b := s.Batches[grouptest.Bid(3)]; b.Status != Refused || b.Reason != "verify: bad logprobs" {
				t.Errorf("batch 3: %+v", b)
			}
			if s.Refusals["verify"] != 1 {
				t.Errorf("refusals %v", s.Refusals)
			}
		}},
		{name: "contributor that left", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Open(t)
			f.Must(&Entry{Leave: "t2"})
			return f
		}, entry: pub(nil)},
		{name: "no round", setup: grouptest.Ready, entry: pub(nil), want: ErrNoRound},
		{name: "other round", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Round = 2 }), want: ErrNoRound},
		{name: "closed round", setup: grouptest.Published, entry: pub(func(p *Publish) { p.Version, p.Parent, p.Hash = 2, 1, grouptest.HashN(2) }), want: ErrNoRound},
		{name: "same round again", setup: grouptest.Published, entry: pub(nil), want: ErrNoRound},
		{name: "aborted round", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Open(t)
			f.Must(&Entry{Abort: &Abort{Round: 1}})
			return f
		}, entry: pub(nil), want: ErrNoRound},
		{name: "version skipped", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Version = 2 }), want: ErrVersion},
		{name: "version same", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Version = 0 }), want: ErrVersion},
		{name: "wrong parent", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Parent = 1 }), want: ErrVersion},
		{name: "bad hash", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Hash = "x" }), want: ErrEntry},
		{name: "no contributor", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors = nil }), want: ErrEntry},
		{name: "contributor twice", setup: grouptest.Open, entry: pub(func(p *Publish) {
			p.Contributors = []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1)}}, {Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(2)}}}
		}), want: ErrEntry},
		{name: "nan norm", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors[1].Norm = math.NaN() }), want: ErrEntry},
		{name: "infinite seconds", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors[0].Seconds = math.Inf(1) }), want: ErrEntry},
		{name: "contributor with no share", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors[1].Trainer = "t3" }), want: ErrTrainer},
		{name: "another's batch", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors[1].Batches = []core.BatchID{grouptest.Bid(1)} }), want: ErrBatch},
		{name: "batch outside the round", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors[1].Batches = append(p.Contributors[1].Batches, grouptest.Bid(4)) }), want: ErrBatch},
		{name: "batch twice", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Contributors[0].Batches = []core.BatchID{grouptest.Bid(1), grouptest.Bid(1)} }), want: ErrBatch},
		{name: "refused and trained", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Refused = []Refusal{{ID: grouptest.Bid(3), Reason: "x"}} }), want: ErrBatch},
		{name: "refused outside the round", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Refused = []Refusal{{ID: grouptest.Bid(4), Reason: "x"}} }), want: ErrBatch},
		{name: "refused unknown", setup: grouptest.Open, entry: pub(func(p *Publish) { p.Refused = []Refusal{{ID: grouptest.Bid(99), Reason: "x"}} }), want: ErrBatch},
		{name: "refused without reason", setup: grouptest.Open, entry: pub(func(p *Publish) {
			p.Contributors = p.Contributors[:1]
			p.Refused = []Refusal{{ID: grouptest.Bid(3)}}
		}), want: ErrBatch},
	})
}

func TestApplyAbort(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "open", setup: grouptest.Open, entry: &Entry{Abort: &Abort{Round: 1, Reason: "deadline"}}, check: func(t *testing.T, s *State) {
			if s.Round != nil || s.Rounds != 1 || s.Counts[Pending] != 6 || s.Counts[Assigned] != 0 || len(s.Versions) != 1 {
				t.Errorf("round %+v rounds %d counts %v", s.Round, s.Rounds, s.Counts)
			}
			if b := s.Batches[grouptest.Bid(1)]; b.Status != Pending || b.Round != 0 || b.Trainer != "" || b.Tries != 1 {
				t.Errorf("batch %+v", b)
			}
		}},
		{name: "assigned from a revoked device", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Open(t)
			f.Must(&Entry{Revoke: &Revocation{Peer: "d1", Reason: "spam"}})
			return f
		}, entry: &Entry{Abort: &Abort{Round: 1}}, check: func(t *testing.T, s *State) {
			// Batches 1 and 3 (from d1) were in the round when d1 was revoked.
			for _, n := range []int{1, 3, 5} {
				if b := s.Batches[grouptest.Bid(n)]; b.Status != Refused || b.Reason != "revoked: spam" {
					t.Errorf("batch %d from a revoked device: %+v", n, b)
				}
			}
			if b := s.Batches[grouptest.Bid(2)]; b.Status != Pending {
				t.Errorf("batch 2: %+v", b)
			}
		}},
		{name: "no round", setup: grouptest.Ready, entry: &Entry{Abort: &Abort{Round: 1}}, want: ErrNoRound},
		{name: "closed round", setup: grouptest.Published, entry: &Entry{Abort: &Abort{Round: 1}}, want: ErrNoRound},
		{name: "other round", setup: grouptest.Open, entry: &Entry{Abort: &Abort{Round: 2}}, want: ErrNoRound},
	})
}

func TestApplyRevoke(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "device", setup: grouptest.Ready, entry: &Entry{Revoke: &Revocation{Peer: "d2", Reason: "poison"}}, check: func(t *testing.T, s *State) {
			for _, n := range []int{2, 4, 6} {
				if b := s.Batches[grouptest.Bid(n)]; b.Status != Refused || b.Reason != "revoked: poison" {
					t.Errorf("batch %d: %+v", n, b)
				}
			}
			if s.Revoked["d2"] != "poison" || s.Refusals[ReasonRevoked] != 3 || s.Counts[Pending] != 3 {
				t.Errorf("revoked %v refusals %v counts %v", s.Revoked, s.Refusals, s.Counts)
			}
		}},
		{name: "no reason", setup: grouptest.Ready, entry: &Entry{Revoke: &Revocation{Peer: "d2"}}, check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(2)]; b.Reason != ReasonRevoked {
				t.Errorf("batch %+v", b)
			}
		}},
		{name: "trainer", setup: grouptest.Ready, entry: &Entry{Revoke: &Revocation{Peer: "t1"}}, check: func(t *testing.T, s *State) {
			if _, ok := s.Trainers["t1"]; ok {
				t.Errorf("revoked trainer still registered")
			}
			if _, ok := s.Revoked["t1"]; !ok {
				t.Errorf("revoked %v", s.Revoked)
			}
		}},
		{name: "during a round", setup: grouptest.Open, entry: &Entry{Revoke: &Revocation{Peer: "d1"}}, check: func(t *testing.T, s *State) {
			if b := s.Batches[grouptest.Bid(1)]; b.Status != Assigned {
				t.Errorf("assigned batch 1: %+v", b)
			}
			if b := s.Batches[grouptest.Bid(5)]; b.Status != Refused {
				t.Errorf("pending batch 5: %+v", b)
			}
		}},
		{name: "again", setup: func(t testing.TB) *grouptest.Fixture {
			f := grouptest.Ready(t)
			f.Must(&Entry{Revoke: &Revocation{Peer: "d2", Reason: "first"}})
			return f
		}, entry: &Entry{Revoke: &Revocation{Peer: "d2", Reason: "second"}}, check: func(t *testing.T, s *State) {
			if s.Revoked["d2"] != "first" || s.Refusals[ReasonRevoked] != 3 {
				t.Errorf("revoked %v refusals %v", s.Revoked, s.Refusals)
			}
		}},
		{name: "no one", setup: grouptest.Ready, entry: &Entry{Revoke: &Revocation{Reason: "x"}}, want: ErrEntry},
	})
}

func TestApplyRevokedPublish(t *testing.T) {
	// A batch from a device revoked during the round that no contributor
	// trained must not go back to pending: it would be planned again.
	f := grouptest.Open(t)
	f.Must(&Entry{Revoke: &Revocation{Peer: "d1"}})
	f.Must(&Entry{Publish: &Publish{Round: 1, Version: 1, Hash: grouptest.HashN(1), Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1)}}}}})
	if b := f.S.Batches[grouptest.Bid(3)]; b.Status != Refused || b.Reason != ReasonRevoked {
		t.Errorf("batch 3 from the revoked device: %+v", b)
	}
	if b := f.S.Batches[grouptest.Bid(1)]; b.Status != Trained {
		t.Errorf("batch 1, trained before the revocation was applied: %+v", b)
	}
	if b := f.S.Batches[grouptest.Bid(2)]; b.Status != Pending {
		t.Errorf("batch 2: %+v", b)
	}
	if st, ok := f.S.Plan(f.At(), "t1", []mesh.PeerID{"t1", "t2"}); ok {
		for _, ids := range st.Shares {
			for _, id := range ids {
				if f.S.Batches[id].From == "d1" {
					t.Errorf("plan shares batch %s of a revoked device", id)
				}
			}
		}
	}
	if err := grouptest.CheckInvariants(f.S); err != nil {
		t.Fatal(err)
	}
}

func TestApplySpeeds(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "update", setup: grouptest.Ready, entry: &Entry{Speeds: []SpeedUpdate{{Trainer: "t1", Speed: 7.5}, {Trainer: "t9", Speed: 3}, {Trainer: "t2", Speed: 0}, {Trainer: "t3", Speed: -1}}}, check: func(t *testing.T, s *State) {
			if s.Trainers["t1"].Speed != 7.5 || s.Trainers["t2"].Speed != 2 || s.Trainers["t3"].Speed != 1 {
				t.Errorf("speeds %v %v %v", s.Trainers["t1"], s.Trainers["t2"], s.Trainers["t3"])
			}
			if _, ok := s.Trainers["t9"]; ok {
				t.Errorf("a speed registered a trainer")
			}
		}},
		{name: "out of range", setup: grouptest.Ready, entry: &Entry{Speeds: []SpeedUpdate{{Trainer: "t1", Speed: 1e13}, {Trainer: "t2", Speed: math.NaN()}, {Trainer: "t3", Speed: math.Inf(1)}}}, check: func(t *testing.T, s *State) {
			if s.Trainers["t1"].Speed != 1 || s.Trainers["t2"].Speed != 2 || s.Trainers["t3"].Speed != 1 {
				t.Errorf("speeds %v %v %v", s.Trainers["t1"], s.Trainers["t2"], s.Trainers["t3"])
			}
		}},
		{name: "empty", setup: grouptest.Ready, entry: &Entry{Speeds: []SpeedUpdate{}}, want: ErrEntry},
	})
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]int64{"7": 7, "v7": 7, " v0 ": 0, "v18446744073709551615": -2, "": -1, "v": -1, "x7": -1, "vv7": -1, "-1": -1, "v1.5": -1, "v18446744073709551616": -1} {
		v, ok := ParseVersion(in)
		switch {
		case want == -1 && ok:
			t.Errorf("ParseVersion(%q) = %d, want not ok", in, v)
		case want == -2 && (!ok || v != math.MaxUint64):
			t.Errorf("ParseVersion(%q) = %d %v", in, v, ok)
		case want >= 0 && (!ok || v != uint64(want)):
			t.Errorf("ParseVersion(%q) = %d %v, want %d", in, v, ok, want)
		}
	}
}

func TestStaleBatch(t *testing.T) {
	cases := []struct {
		adapters []string
		current  uint64
		lag      int
		want     bool
	}{
		{nil, 10, 2, false},
		{[]string{"v7"}, 10, 2, true},
		{[]string{"v8"}, 10, 2, false},
		{[]string{"v7", "v8"}, 10, 2, false},
		{[]string{"v1", "v7"}, 10, 2, true},
		{[]string{"v1", "local"}, 10, 2, false},
		{[]string{"v0"}, 0, 0, false},
		{[]string{"v0"}, 1, 0, true},
		{[]string{"v12"}, 10, 2, false},
		{[]string{"v18446744073709551615"}, 10, 2, false},
		{[]string{"v18446744073709551614"}, 5, 3, false},
		{[]string{"v0"}, math.MaxUint64, 2, true},
	}
	for _, c := range cases {
		if got := StaleBatch(&Batch{Adapters: c.adapters}, c.current, c.lag); got != c.want {
			t.Errorf("StaleBatch(%v, %d, %d) = %v, want %v", c.adapters, c.current, c.lag, got, c.want)
		}
	}
}

func TestConfigValidateDefaults(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	d := Config{}.WithDefaults()
	if d.WithDefaults() != d {
		t.Errorf("WithDefaults is not idempotent")
	}
	if (Config{Aggregate: AggMean}).WithDefaults().Trim != 0 {
		t.Errorf("mean got a trim")
	}
	if w := (Config{}).WeightsOf(); w != loss.DefaultWeights || w.RL != 1 || w.OPD != 1 {
		t.Errorf("default weights %+v", w)
	}
	if w := (Config{RLWeight: 1}).WeightsOf(); w != (loss.Weights{RL: 1}) {
		t.Errorf("a reward weight alone: %+v", w)
	}
	for _, c := range []Config{{RLWeight: -1}, {OPDWeight: math.NaN()}, {RLWeight: math.Inf(1)}, {OPDWeight: MaxWeight + 1}} {
		if err := c.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "weights") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
