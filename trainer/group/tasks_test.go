package group_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

func taskSet(n, held int) *TaskSet {
	ts := &TaskSet{Hash: grouptest.HashN(900), Reward: grouptest.HashN(901), Group: 4, PerRound: 3, Epochs: 2, Ratio: 0.25}
	for i := range n {
		ts.Train = append(ts.Train, fmt.Sprintf("p%02d", i))
	}
	for i := range held {
		ts.HeldOut = append(ts.HeldOut, fmt.Sprintf("h%02d", i))
	}
	return ts
}

// roundTasks lists the task prompts of the open round, with their epochs.
func roundTasks(s *State) []string {
	var out []string
	for _, ids := range s.Round.Shares {
		for _, id := range ids {
			if b := s.Batches[id]; b.Task != "" {
				out = append(out, fmt.Sprintf("%s/%d", b.Prompt, b.Epoch))
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestTaskSetConsumedOnce: a task set's prompts go through the rounds like
// batches: each prompt of each epoch is trained into exactly one version,
// a round that closes without some (aborted, or a contributor missing)
// gives them back, and epoch 1 starts only when epoch 0 is taken.
func TestTaskSetConsumedOnce(t *testing.T) {
	f := grouptest.NewFixture(t)
	f.Must(&Entry{Configure: &Config{Quota: 64, RoundSteps: 128}})
	f.Must(&Entry{Genesis: &Genesis{Hash: grouptest.HashN(0), Publisher: "t1"}})
	f.Must(&Entry{Register: &Trainer{ID: "t1", Speed: 1}})
	f.Must(&Entry{Register: &Trainer{ID: "t2", Speed: 1}})
	ts := taskSet(5, 2)
	f.Must(&Entry{Tasks: ts})
	f.Must(&Entry{Tasks: ts}) // again: no change
	other := *ts
	other.Reward = grouptest.HashN(902)
	if err := f.Apply(&Entry{Tasks: &other}); !errors.Is(err, ErrConfig) {
		t.Fatalf("the same set with another verifier: %v", err)
	}
	if p := f.S.Progress(ts.Hash); p.Total != 10 || p.Pending != 10 {
		t.Fatalf("progress %+v", p)
	}
	trained := map[string]int{}
	live := []mesh.PeerID{"t1", "t2"}
	for round := 0; round < 20 && f.S.Progress(ts.Hash).Trained < 10; round++ {
		start, ok := f.S.Plan(f.At(), "t1", live)
		if !ok {
			t.Fatalf("no round with %+v", f.S.Progress(ts.Hash))
		}
		f.Must(&Entry{Start: start})
		got := roundTasks(f.S)
		if len(got) == 0 || len(got) > 3 {
			t.Fatalf("round %d: %v (per round 3)", start.Round, got)
		}
		if start.Round == 2 {
			// A failover: the round closes with nothing.
			f.Must(&Entry{Abort: &Abort{Round: start.Round, Reason: "leader lost"}})
			continue
		}
		// Only t1's share is trained; t2's goes back.
		cur, _ := f.S.Current()
		share := f.S.Round.Shares["t1"]
		cs := []Contribution{{Trainer: "t1", Batches: share, Samples: 4 * len(share)}}
		if len(share) == 0 {
			cs = []Contribution{{Trainer: "t2", Batches: f.S.Round.Shares["t2"], Samples: 1}}
		}
		f.Must(&Entry{Publish: &Publish{Round: start.Round, Version: cur.Version + 1, Parent: cur.Version, Hash: grouptest.HashN(int(cur.Version) + 1), Publisher: "t1", Contributors: cs}})
		for _, c := range cs {
			for _, id := range c.Batches {
				b := f.S.Batches[id]
				trained[fmt.Sprintf("%s/%d", b.Prompt, b.Epoch)]++
				if b.Epoch == 1 {
					// Every epoch-0 prompt was taken before any of epoch 1.
					for _, o := range f.S.Batches {
						if o.Task != "" && o.Epoch == 0 && o.Status == Pending {
							t.Fatalf("%s/1 trained while %s/0 pending", b.Prompt, o.Prompt)
						}
					}
				}
			}
		}
		if err := grouptest.CheckInvariants(f.S); err != nil {
			t.Fatal(err)
		}
	}
	if len(trained) != 10 {
		t.Fatalf("trained %d prompt-epochs: %v", len(trained), trained)
	}
	for k, n := range trained {
		if n != 1 {
			t.Fatalf("%s trained %d times", k, n)
		}
	}
	if _, ok := f.S.Plan(f.At(), "t1", live); ok {
		t.Fatal("a round with every prompt trained")
	}
	// Snapshots carry the sets.
	if c := grouptest.CloneState(t, f.S); c.TaskSets[ts.Hash] == nil || c.Progress(ts.Hash) != f.S.Progress(ts.Hash) {
		t.Fatal("the task set did not survive a snapshot")
	}
}

// TestTaskRatio: with device batches pending, the prompts take at most the
// set's ratio of the round's steps, and the batches the rest.
func TestTaskRatio(t *testing.T) {
	f := grouptest.Ready(t) // batches of 4 steps, RoundSteps 128
	var refs []BatchRef
	for i := 7; i <= 60; i++ {
		refs = append(refs, BatchRef{ID: grouptest.Bid(i), From: mesh.PeerID(fmt.Sprintf("d%d", i)), Steps: 4})
	}
	f.Must(&Entry{Add: refs})
	ts := taskSet(40, 2)
	ts.PerRound, ts.Ratio, ts.Group = 100, 0.25, 8
	f.Must(&Entry{Tasks: ts})
	start, ok := f.S.Plan(f.At(), "t1", []mesh.PeerID{"t1", "t2"})
	if !ok {
		t.Fatal("no round")
	}
	prompts, live := 0, 0
	for _, ids := range start.Shares {
		for _, id := range ids {
			if f.S.Batches[id].Task != "" {
				prompts++
			} else {
				live += f.S.Batches[id].Steps
			}
		}
	}
	// 0.25 × 128 = 32 steps = 4 prompts of 8; the batches get 96.
	if prompts != 4 || live != 96 {
		t.Fatalf("%d prompts, %d live steps", prompts, live)
	}
}

func TestTaskEntriesRefused(t *testing.T) {
	f := grouptest.Ready(t)
	for name, ts := range map[string]TaskSet{
		"bad hash":  {Hash: "x", Reward: grouptest.HashN(1), Train: []string{"a"}},
		"no reward": {Hash: grouptest.HashN(1), Train: []string{"a"}},
		"group 1":   {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2), Group: 1, Train: []string{"a"}},
		"no train":  {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2)},
		"dup id":    {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2), Train: []string{"a"}, HeldOut: []string{"a"}},
		"ratio 2":   {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2), Ratio: 2, Train: []string{"a"}},
		"holdout 1": {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2), Holdout: 1, Train: []string{"a"}},
		"too many":  {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2), Epochs: MaxTaskItems, Train: []string{"a", "b"}},
		"bad tools": {Hash: grouptest.HashN(1), Reward: grouptest.HashN(2), Tools: "zz", Train: []string{"a"}},
	} {
		before := grouptest.StateJSON(t, f.S)
		if err := f.Apply(&Entry{Tasks: &ts}); err == nil {
			t.Errorf("%s: applied", name)
		}
		if after := grouptest.StateJSON(t, f.S); after != before {
			t.Errorf("%s: a refused entry changed the state: %s", name, grouptest.Diff(before, after))
		}
	}
	ts := taskSet(3, 2)
	f.Must(&Entry{Tasks: ts})
	good := Eval{Version: 0, Task: ts.Hash, Prompts: 2, Passed: 1, PassAt1: 0.5, MeanReward: 0.1}
	for name, ev := range map[string]Eval{
		"no version": {Version: 9, Task: ts.Hash, Prompts: 2},
		"no set":     {Version: 0, Task: grouptest.HashN(5), Prompts: 2},
		"count":      {Version: 0, Task: ts.Hash, Prompts: 3},
		"passed":     {Version: 0, Task: ts.Hash, Prompts: 2, Passed: 3},
		"reward":     {Version: 0, Task: ts.Hash, Prompts: 2, MeanReward: 2},
		"abstained":  {Version: 0, Task: ts.Hash, Prompts: 2, Passed: 1, PassAt1: 0.5, Abstained: 2},
		"negative":   {Version: 0, Task: ts.Hash, Prompts: 2, Abstained: -1},
	} {
		if err := f.Apply(&Entry{Eval: &ev}); err == nil {
			t.Errorf("%s: applied", name)
		}
	}
	if got := f.S.Unevaluated(); len(got) != 1 || got[0] != ts.Hash {
		t.Fatalf("unevaluated %v", got)
	}
	f.Must(&Entry{Eval: &good})
	second := good
	second.Passed, second.PassAt1 = 2, 1
	f.Must(&Entry{Eval: &second}) // the first stands
	if evs := f.S.Versions[0].Evals; len(evs) != 1 || evs[0] != good {
		t.Fatalf("evals %+v", evs)
	}
	if got := f.S.Unevaluated(); len(got) != 0 {
		t.Fatalf("unevaluated %v", got)
	}
	if err := f.Apply(&Entry{Tasks: ts, Eval: &good}); !errors.Is(err, ErrEntry) {
		t.Fatalf("two commands: %v", err)
	}
}

// TestPublishWithEvals: a version published with its evaluations is
// committed with them (no evaluation is then owed); a publication whose
// evaluations do not fit is refused whole.
func TestPublishWithEvals(t *testing.T) {
	f := grouptest.Open(t)
	ts := taskSet(3, 2)
	f.Must(&Entry{Tasks: ts})
	pub := func(evs ...Eval) *Entry {
		return &Entry{Publish: &Publish{Round: 1, Version: 1, Hash: grouptest.HashN(1),
			Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1)}}}, Evals: evs}}
	}
	good := Eval{Version: 1, Task: ts.Hash, Prompts: 2, Passed: 2, PassAt1: 1, MeanReward: 0.5, By: "t1"}
	for name, evs := range map[string][]Eval{
		"other version": {{Version: 0, Task: ts.Hash, Prompts: 2}},
		"unknown set":   {{Version: 1, Task: grouptest.HashN(5), Prompts: 2}},
		"count":         {{Version: 1, Task: ts.Hash, Prompts: 1}},
		"twice":         {good, good},
	} {
		before := grouptest.StateJSON(t, f.S)
		if err := f.Apply(pub(evs...)); !errors.Is(err, ErrEntry) {
			t.Errorf("%s: %v", name, err)
		}
		if after := grouptest.StateJSON(t, f.S); after != before {
			t.Errorf("%s: a refused publication changed the state: %s", name, grouptest.Diff(before, after))
		}
	}
	f.Must(pub(good))
	cur, _ := f.S.Current()
	if cur.Version != 1 || len(cur.Evals) != 1 || cur.Evals[0] != good {
		t.Fatalf("v1 committed with evals %+v", cur.Evals)
	}
	if got := f.S.Unevaluated(); len(got) != 0 {
		t.Fatalf("v1 still owes evaluations on %v", got)
	}
}

// TestTaskSetAddedAgain: the same set added again with the same settings
// changes nothing, even with another split (the group keeps the split it
// was added with: sets added before the split was exact keep theirs);
// with other settings it is refused, and the error names each setting
// that differs in `tasks add`'s terms.
func TestTaskSetAddedAgain(t *testing.T) {
	f := grouptest.Ready(t)
	ts := taskSet(5, 2)
	ts.Holdout = 0.1
	f.Must(&Entry{Tasks: ts})
	before := grouptest.StateJSON(t, f.S)
	resplit := *ts
	resplit.Train, resplit.HeldOut = ts.Train[1:], append([]string{ts.Train[0]}, ts.HeldOut...)
	f.Must(&Entry{Tasks: &resplit})
	if after := grouptest.StateJSON(t, f.S); after != before {
		t.Fatalf("the same set again changed the state: %s", grouptest.Diff(before, after))
	}
	other := *ts
	other.Holdout, other.Group, other.Reward = 0.25, 8, grouptest.HashN(903)
	err := f.Apply(&Entry{Tasks: &other})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("other settings: %v", err)
	}
	for _, want := range []string{"--holdout 0.25 here, 0.1 in the group", "--group 8 here, 4 in the group",
		"--reward: verifier " + grouptest.HashN(903)[:12] + " here, " + ts.Reward[:12] + " in the group"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if d := SettingsDiff(*ts, *ts); len(d) != 0 {
		t.Fatalf("a set differs from itself: %v", d)
	}
	// Defaults count as what they stand for.
	dflt := *ts
	dflt.PerRound, dflt.Epochs = 0, 0
	if d := SettingsDiff(TaskSet{Group: 4, Holdout: 0.1, PerRound: DefaultTaskPerRound, Epochs: 1, Ratio: 0.25, Reward: ts.Reward, Hash: ts.Hash}, dflt); len(d) != 0 {
		t.Fatalf("defaults differ: %v", d)
	}
}

// TestFlatRoundClosed: a round whose contributors trained nothing that
// changes the adapter closes with no version: the prompts they took are
// done (trained in that round, into no version), the refused ones
// refused, the others pending again; no later round takes the done ones.
func TestFlatRoundClosed(t *testing.T) {
	f := grouptest.NewFixture(t)
	f.Must(&Entry{Configure: &Config{Quota: 64, RoundSteps: 128}})
	f.Must(&Entry{Genesis: &Genesis{Hash: grouptest.HashN(0), Publisher: "t1"}})
	f.Must(&Entry{Register: &Trainer{ID: "t1", Speed: 1}})
	f.Must(&Entry{Register: &Trainer{ID: "t2", Speed: 1}})
	ts := taskSet(4, 1)
	ts.Epochs, ts.PerRound = 1, 4
	f.Must(&Entry{Tasks: ts})
	live := []mesh.PeerID{"t1", "t2"}
	start, ok := f.S.Plan(f.At(), "t1", live)
	if !ok {
		t.Fatal("no round")
	}
	f.Must(&Entry{Start: start})
	r := *f.S.Round
	if err := f.Apply(&Entry{Close: &Close{Round: r.Number}}); !errors.Is(err, ErrEntry) {
		t.Fatalf("a close with no contributor: %v", err)
	}
	if err := f.Apply(&Entry{Close: &Close{Round: r.Number + 1, Contributors: []Contribution{{Trainer: "t1"}}}}); !errors.Is(err, ErrNoRound) {
		t.Fatalf("a close of another round: %v", err)
	}
	var (
		done, back []core.BatchID
		cs         []Contribution
	)
	for _, p := range r.Trainers() {
		if len(r.Shares[p]) > 0 {
			done = append(done, r.Shares[p][0])
			back = append(back, r.Shares[p][1:]...)
			cs = append(cs, Contribution{Trainer: p, Batches: r.Shares[p][:1]})
		}
	}
	if len(back) == 0 {
		t.Fatalf("a round of %d prompts: %v", len(done), r.Shares)
	}
	f.Must(&Entry{Close: &Close{Round: r.Number, Contributors: cs, Reason: "every group flat"}})
	if len(f.S.Versions) != 1 || f.S.Round != nil || len(f.S.Closed) != 1 || f.S.Closed[0].Round != r.Number || f.S.Closed[0].Base != 0 {
		t.Fatalf("after the close: %d versions, round %v, closed %+v", len(f.S.Versions), f.S.Round, f.S.Closed)
	}
	for _, id := range done {
		if b := f.S.Batches[id]; b.Status != Trained || b.Round != r.Number || b.Version != 0 {
			t.Fatalf("a prompt of the closed round: %+v", b)
		}
	}
	for _, id := range back {
		if b := f.S.Batches[id]; b.Status != Pending {
			t.Fatalf("a prompt no one trained: %+v", b)
		}
	}
	if p := f.S.Progress(ts.Hash); p.Trained != len(done) || p.Pending != 4-len(done) {
		t.Fatalf("progress %+v", p)
	}
	if err := grouptest.CheckInvariants(f.S); err != nil {
		t.Fatal(err)
	}
	if c := grouptest.CloneState(t, f.S); len(c.Closed) != 1 {
		t.Fatal("the closed round did not survive a snapshot")
	}
	next, ok := f.S.Plan(f.At(), "t1", live)
	if !ok {
		t.Fatal("no round for the pending prompts")
	}
	for _, ids := range next.Shares {
		for _, id := range ids {
			if slices.Contains(done, id) {
				t.Fatalf("%s, done in the closed round, planned again", id)
			}
		}
	}
}
