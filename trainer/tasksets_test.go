package trainer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// TestTaskSetTrainsThroughFailover: a 3-trainer group given a task set and
// its verifier (added through a trainer that does not lead) trains on its
// prompts round after round; the leader is killed as it is about to
// publish the second round; the new leader completes the set. Every
// prompt of every epoch is trained into exactly one version, none is
// skipped (a round whose groups are all flat closes with no version, its
// prompts done), and the held-out pass@1 recorded in the lineage rises
// from version 0's.
func TestTaskSetTrainsThroughFailover(t *testing.T) {
	ctx := context.Background()
	plugin := trainer.CharsetPlugin(t)
	c := newTestCluster(t, 3)
	if err := c.WaitUntil(ctx, clusterWait, "three registered trainers", func() bool {
		i, ok := c.Leader()
		return ok && len(c.Trainer(i).Status().Trainers) == 3
	}); err != nil {
		t.Fatal(err)
	}
	li, _ := leaderOf(t, c)
	// Whichever trainer leads when round 2 is about to be published
	// (leadership may move on a loaded machine) stops there until killed.
	type pause struct {
		trainer int
		round   uint64
	}
	paused := make(chan pause, 1)
	var once atomic.Bool
	for i := range c.Len() {
		c.Trainer(i).SetBeforePublish(func(ctx context.Context, round uint64) {
			if round < 2 || !once.CompareAndSwap(false, true) {
				return
			}
			paused <- pause{i, round}
			<-ctx.Done()
		})
	}
	adder := c.Trainer((li + 1) % 3)
	ts, err := adder.AddTasks(ctx, trainer.AddTasks{Name: "letters.jsonl", Tasks: trainer.LetterTasks(24), Reward: plugin,
		Group: 8, Holdout: 0.25, PerRound: 6, Epochs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(ts.HeldOut) == 0 || len(ts.Train) == 0 {
		t.Fatalf("split %d/%d", len(ts.Train), len(ts.HeldOut))
	}
	// Live batches arrive while the set trains: rounds mix them.
	batches := shipN(t, c, 0, 4)
	var p pause
	select {
	case p = <-paused:
	case <-time.After(clusterWait):
		t.Fatal("the leader never got to publish round 2")
	}
	round, leader := p.round, c.Trainer(p.trainer)
	if err := c.Kill(p.trainer); err != nil {
		t.Logf("kill: %v", err)
	}
	total := len(ts.Train) * ts.Epochs
	var tr *trainer.Trainer
	if err := c.WaitUntil(ctx, clusterWait, "every prompt trained and the last version evaluated", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		tr = c.Trainer(i)
		var done bool
		tr.ViewGroup(func(s *group.State) {
			p := s.Progress(ts.Hash)
			cur, _ := s.Current()
			done = p.Trained == total && s.Round == nil && len(cur.Evals) == 1 && s.Counts[group.Trained] == total+len(batches)
		})
		return done
	}); err != nil {
		t.Fatal(err)
	}
	if st := tr.Status(); st.Prompts.Trained != total || st.Batches.Trained != len(batches) || st.Batches.Pending != 0 {
		t.Fatalf("status counts batches %+v, prompts %+v", st.Batches, st.Prompts)
	}
	if sets := tr.TaskSets(); len(sets) != 1 || sets[0].Done != total || len(sets[0].Evals) != len(tr.Lineage()) {
		t.Fatalf("task sets %+v", sets)
	}
	// Every prompt-epoch in exactly one version's contributions.
	seen := map[core.BatchID]int{}
	isBatch := map[core.BatchID]bool{}
	for _, id := range batches {
		isBatch[id] = true
	}
	mixed := false
	lin := tr.Lineage()
	for _, v := range lin {
		if v.Publisher == leader.ID() && v.Round >= round && v.Version > 0 {
			t.Fatalf("v%d was published by the killed leader", v.Version)
		}
		live, prompts := 0, 0
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				seen[id]++
				if isBatch[id] {
					live++
				} else {
					prompts++
				}
			}
		}
		mixed = mixed || live > 0 && prompts > 0
	}
	// A round whose groups were all flat closed with no version: its
	// prompts are done in it.
	tr.ViewGroup(func(s *group.State) {
		for _, cr := range s.Closed {
			for _, c := range cr.Contributors {
				for _, id := range c.Batches {
					seen[id]++
				}
			}
		}
	})
	for _, id := range batches {
		if seen[id] != 1 {
			t.Fatalf("batch %s trained %d times", id, seen[id])
		}
		delete(seen, id)
	}
	if !mixed {
		t.Fatal("no round trained live batches and task prompts together")
	}
	for e := range ts.Epochs {
		for _, p := range ts.Train {
			if n := seen[group.TaskItemID(ts.Hash, p, e)]; n != 1 {
				t.Fatalf("prompt %s epoch %d trained %d times", p, e, n)
			}
		}
	}
	if len(seen) != total {
		t.Fatalf("%d ledger lines trained, want %d", len(seen), total)
	}
	first, last := lin[0].Evals, lin[len(lin)-1].Evals
	if len(first) != 1 || len(last) != 1 {
		t.Fatalf("evaluations: v0 %v, last %v", first, last)
	}
	for _, v := range lin {
		t.Logf("v%d round %d: %+v", v.Version, v.Round, v.Evals)
	}
	if !(last[0].PassAt1 > first[0].PassAt1) {
		t.Fatalf("held-out pass@1 went from %v to %v", first[0].PassAt1, last[0].PassAt1)
	}
	// The manifest the devices get carries the version's evaluation.
	cur := lin[len(lin)-1]
	if err := c.WaitUntil(ctx, clusterWait, "the newest version's manifest", func() bool {
		m := tr.LatestShared()
		return m != nil && m.Version == cur.Version
	}); err != nil {
		t.Fatal(err)
	}
	m := tr.LatestShared()
	if ev := cur.Evals[0]; len(m.Evals) != 1 || m.Evals[0].Task != ev.Task || m.Evals[0].Prompts != ev.Prompts || m.Evals[0].Passed != ev.Passed || m.Evals[0].MeanReward != ev.MeanReward {
		t.Fatalf("v%d's manifest carries %+v, its lineage %+v", cur.Version, m.Evals, cur.Evals)
	}
}

// TestAddLargeTaskSet: a set whose ids fill more than a request line
// reaches the leader whole, and a set the leader cannot take (a plugin
// that does not load, a bad split) is refused before the group hears of it.
func TestAddLargeTaskSet(t *testing.T) {
	ctx := context.Background()
	plugin := trainer.CharsetPlugin(t)
	c := newTestCluster(t, 1)
	tr := c.Trainer(0)
	var b strings.Builder
	for i := range 4000 {
		fmt.Fprintf(&b, `{"id":"a-rather-long-task-id-%05d","messages":[{"role":"user","content":"x"}],"answer":"x"}`+"\n", i)
	}
	if _, err := tr.AddTasks(ctx, trainer.AddTasks{Name: "big.jsonl", Tasks: []byte(b.String()), Reward: []byte("not wasm"), Group: 2, Holdout: 0.1}); !errors.Is(err, trainer.ErrTasks) {
		t.Fatalf("a plugin that does not load: %v", err)
	}
	if len(tr.TaskSets()) != 0 {
		t.Fatal("a refused set reached the group")
	}
	ts, err := tr.AddTasks(ctx, trainer.AddTasks{Name: "big.jsonl", Tasks: []byte(b.String()), Reward: plugin, Group: 2, Holdout: 0.01, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	sets := tr.TaskSets()
	if len(sets) != 1 || sets[0].Prompts+sets[0].HeldOut != 4000 || sets[0].Prompts != len(ts.Train) || sets[0].Items != len(ts.Train) {
		t.Fatalf("sets %+v", sets)
	}
	// The metrics carry the set's prompts and its evaluation.
	if err := c.WaitUntil(ctx, clusterWait, "v0 evaluated", func() bool { return len(tr.TaskSets()[0].Evals) > 0 }); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	tr.Metrics().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{`clawmesh_trainer_task_prompts{set="` + ts.Hash[:16] + `",status="pending"}`,
		`clawmesh_trainer_task_pass_at_1{set="` + ts.Hash[:16] + `"}`, `clawmesh_trainer_task_evaluated_version{set="` + ts.Hash[:16] + `"}`} {
		if !strings.Contains(body, want) {
			t.Fatalf("no %s in the metrics", want)
		}
	}
	// The leader checks the split against its own reading of the file
	// (kept here by an add its plugin failed).
	letters := trainer.LetterTasks(10)
	if _, err := tr.AddTasks(ctx, trainer.AddTasks{Name: "letters.jsonl", Tasks: letters, Reward: []byte("not wasm"), Group: 2, Holdout: 0.2}); !errors.Is(err, trainer.ErrTasks) {
		t.Fatalf("a plugin that does not load: %v", err)
	}
	set, err := tasks.Parse(bytes.NewReader(letters))
	if err != nil {
		t.Fatal(err)
	}
	train, held := set.Split(0.2)
	bad := group.TaskSet{Hash: set.Hash, Reward: ts.Reward, Group: 2, Holdout: 0.2, HeldOut: []string{train[0].ID}}
	for _, x := range append(train[1:], held...) {
		bad.Train = append(bad.Train, x.ID)
	}
	payload, _ := json.Marshal(&bad)
	if err := tr.AddTasksFrom(ctx, payload); !errors.Is(err, trainer.ErrTasks) || !strings.Contains(err.Error(), "split") {
		t.Fatalf("a split that does not match: %v", err)
	}
	// The set the group holds, given again with another split, keeps the
	// split it was added with.
	again := ts.TaskSet
	again.Train, again.HeldOut = again.Train[1:], append([]string{again.Train[0]}, again.HeldOut...)
	payload, _ = json.Marshal(&again)
	if err := tr.AddTasksFrom(ctx, payload); err != nil {
		t.Fatalf("the same set again: %v", err)
	}
	if sets := tr.TaskSets(); len(sets) != 1 || sets[0].Prompts != len(ts.Train) {
		t.Fatalf("sets %+v", sets)
	}
}

// TestRefusedReAddLeavesRunningSetAlone: while rounds train on a set and
// evaluate its versions, adding the same set again with another verifier
// or another holdout is refused, naming the setting that differs, and
// touches nothing that runs: a runtime held through the refusals (as a
// share's rollouts and an evaluation hold theirs) keeps its verifier, a
// version scores the same before and after, and no evaluation in the
// lineage counts an abstention. Adding the set again with the same
// settings says it is there.
func TestRefusedReAddLeavesRunningSetAlone(t *testing.T) {
	ctx := context.Background()
	plugin, moody := trainer.CharsetPlugin(t), trainer.MoodyPlugin(t)
	c := newTestCluster(t, 1)
	tr := c.Trainer(0)
	add := trainer.AddTasks{Name: "letters.jsonl", Tasks: trainer.LetterTasks(24), Reward: plugin, Group: 4, Holdout: 0.25, PerRound: 3, Epochs: 2}
	ts, err := tr.AddTasks(ctx, add)
	if err != nil {
		t.Fatal(err)
	}
	if ts.Existing || len(ts.HeldOut) != 6 {
		t.Fatalf("added %+v", ts)
	}
	if err := c.WaitUntil(ctx, clusterWait, "a version trained on the set", func() bool { return len(tr.Lineage()) >= 2 }); err != nil {
		t.Fatal(err)
	}
	score, release, err := tr.HoldTaskRuntime(ctx, ts.Hash)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if sc := score(ctx); sc.Value == nil {
		t.Fatalf("the held verifier abstains before anything: %s", sc.Reason)
	}
	before, err := tr.EvaluateVersion(ctx, ts.Hash, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Refused again and again while the rounds go on.
	for range 3 {
		other := add
		other.Reward = moody
		if _, err := tr.AddTasks(ctx, other); !errors.Is(err, trainer.ErrTasks) || !strings.Contains(err.Error(), "--reward: verifier") {
			t.Fatalf("the set with another verifier: %v", err)
		}
		other = add
		other.Holdout = 0.1
		if _, err := tr.AddTasks(ctx, other); !errors.Is(err, trainer.ErrTasks) || !strings.Contains(err.Error(), "--holdout 0.1 here, 0.25 in the group") {
			t.Fatalf("the set with another holdout: %v", err)
		}
	}
	if sc := score(ctx); sc.Value == nil {
		t.Fatalf("the held verifier abstains after the refusals: %s", sc.Reason)
	}
	after, err := tr.EvaluateVersion(ctx, ts.Hash, 1)
	if err != nil {
		t.Fatal(err)
	}
	if before.Passed != after.Passed || before.MeanReward != after.MeanReward || before.Abstained != 0 || after.Abstained != 0 {
		t.Fatalf("v1 scored %+v before the refusals, %+v after", before, after)
	}
	again, err := tr.AddTasks(ctx, add)
	if err != nil || !again.Existing || !slices.Equal(again.HeldOut, ts.HeldOut) {
		t.Fatalf("the same set again: %+v, %v", again, err)
	}
	n := len(tr.Lineage())
	if err := c.WaitUntil(ctx, clusterWait, "the rounds going on", func() bool {
		var closed int
		tr.ViewGroup(func(s *group.State) { closed = len(s.Closed) })
		return len(tr.Lineage())+closed > n
	}); err != nil {
		t.Fatal(err)
	}
	for _, v := range tr.Lineage() {
		for _, e := range v.Evals {
			if e.Abstained != 0 {
				t.Fatalf("v%d's evaluation counts abstentions: %+v", v.Version, e)
			}
		}
	}
	if sets := tr.TaskSets(); len(sets) != 1 || sets[0].Reward != ts.Reward || sets[0].Holdout != 0.25 {
		t.Fatalf("task sets %+v", sets)
	}
}

// TestAddRefusesAVerifierThatNeverScores: a verifier that traps on every
// one of a set's first tasks, or abstains on them all, is refused when the
// set is added, saying so; one that scores some of them is not.
func TestAddRefusesAVerifierThatNeverScores(t *testing.T) {
	ctx := context.Background()
	moody := trainer.MoodyPlugin(t)
	c := newTestCluster(t, 1)
	tr := c.Trainer(0)
	for _, meta := range []string{`"trap":true`, `"abstain":true`} {
		tasks := trainer.MoodyTasks(12, func(int) string { return meta })
		_, err := tr.AddTasks(ctx, trainer.AddTasks{Name: "never.jsonl", Tasks: tasks, Reward: moody, Group: 2, Holdout: 0.25})
		if !errors.Is(err, trainer.ErrTasks) || !strings.Contains(err.Error(), "the verifier scored none of the set's first 5 tasks") {
			t.Fatalf("a verifier that never scores (%s): %v", meta, err)
		}
	}
	if len(tr.TaskSets()) != 0 {
		t.Fatal("a refused set reached the group")
	}
	// Only the first tasks are tried, and one score is enough.
	tasks := trainer.MoodyTasks(12, func(i int) string {
		if i < 4 {
			return `"trap":true`
		}
		return ""
	})
	if _, err := tr.AddTasks(ctx, trainer.AddTasks{Name: "some.jsonl", Tasks: tasks, Reward: moody, Group: 2, Holdout: 0.25}); err != nil {
		t.Fatal(err)
	}
}

// TestFlatRoundsPublishNoVersion: a set whose verifier gives every reply
// the same score gives the rounds no learning signal: its prompts are all
// done, and no version is published for them.
func TestFlatRoundsPublishNoVersion(t *testing.T) {
	ctx := context.Background()
	moody := trainer.MoodyPlugin(t)
	c := newTestCluster(t, 1)
	tr := c.Trainer(0)
	tasks := trainer.MoodyTasks(8, func(int) string { return `"same":true` })
	ts, err := tr.AddTasks(ctx, trainer.AddTasks{Name: "flat.jsonl", Tasks: tasks, Reward: moody, Group: 2, Holdout: 0.25, PerRound: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "every prompt done", func() bool {
		sets := tr.TaskSets()
		return len(sets) == 1 && sets[0].Done == sets[0].Items
	}); err != nil {
		t.Fatal(err)
	}
	var closed []group.ClosedRound
	tr.ViewGroup(func(s *group.State) { closed = slices.Clone(s.Closed) })
	if lin := tr.Lineage(); len(lin) != 1 || len(closed) < 2 {
		t.Fatalf("%d versions and %d rounds closed with none for %d prompts of flat groups", len(lin), len(closed), len(ts.Train))
	}
}
