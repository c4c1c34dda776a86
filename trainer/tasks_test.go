package trainer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// letterTasks generates the task set the tests train on: n prompts asking
// for lower-case words, each with the answer "abc…z " (the characters a
// reply may use) and replies of at most 4 tokens. The charset verifier
// passes a reply made of those characters only. The tiny model, random at
// first, answers with line breaks and punctuation; GRPO on the verifier's
// partial credit teaches it within a few versions, and since every prompt
// wants the same thing, what it learns on the training split shows on the
// held-out one.
func letterTasks(n int) []byte {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id":"w%03d","messages":[{"role":"user","content":"Answer in lower-case words only. Item %d."}],"answer":"abcdefghijklmnopqrstuvwxyz ","meta":{"max_tokens":4}}`+"\n", i, i)
	}
	return []byte(b.String())
}

var charsetOnce struct {
	sync.Once
	path string
	err  error
}

// charsetPlugin builds testdata/charset with the Go toolchain, once per
// run (skipping the test without one).
func charsetPlugin(t testing.TB) []byte {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH to build the verifier plugin")
	}
	charsetOnce.Do(func() {
		d, err := os.MkdirTemp("", "clawmesh-charset-")
		if err != nil {
			charsetOnce.err = err
			return
		}
		charsetOnce.path = filepath.Join(d, "charset.wasm")
		_, charsetOnce.err = reward.Build(context.Background(), filepath.Join("testdata", "charset"), charsetOnce.path, os.Stderr)
	})
	if charsetOnce.err != nil {
		t.Fatal(charsetOnce.err)
	}
	b, err := os.ReadFile(charsetOnce.path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// localRuntime makes a task runtime without a trainer: the set and the
// verifier from a file.
func localRuntime(t testing.TB, set *tasks.Set, ts group.TaskSet, plugin []byte) *taskRuntime {
	t.Helper()
	p := filepath.Join(t.TempDir(), "verifier.wasm")
	if err := os.WriteFile(p, plugin, 0o600); err != nil {
		t.Fatal(err)
	}
	rt, err := newLocalRuntime(context.Background(), set, ts, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.runner.Close(context.Background()) })
	return rt
}

// TestRolloutsLearn: on one worker, rounds of rollouts from a task set,
// each trained from the previous version, raise the held-out pass@1.
func TestRolloutsLearn(t *testing.T) {
	ctx := context.Background()
	set, err := tasks.Parse(strings.NewReader(string(letterTasks(24))))
	if err != nil {
		t.Fatal(err)
	}
	train, held := set.Split(0.25)
	ts := group.TaskSet{Hash: set.Hash, Reward: tasks.Hash([]byte("x")), Group: 8, Holdout: 0.25}
	for _, x := range held {
		ts.HeldOut = append(ts.HeldOut, x.ID)
	}
	rt := localRuntime(t, set, ts, charsetPlugin(t))
	w := &worker{}
	defer w.close()
	cfg := testGroup.WithDefaults()
	root := t.TempDir()
	dir := filepath.Join(root, "v0")
	if _, err := w.genesis(ctx, cfg, dir); err != nil {
		t.Fatal(err)
	}
	first, err := w.evaluate(ctx, cfg, dir, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("v0: %+v", first)
	best := first
	for v := 1; v <= 4 && best.PassAt1 < 1; v++ {
		var items []rolloutItem
		for i := range 6 {
			x := train[(v*6+i)%len(train)]
			items = append(items, rolloutItem{id: group.TaskItemID(set.Hash, x.ID, 0), task: x, rt: rt})
		}
		res, err := w.train(ctx, cfg, dir, uint64(v-1), uint64(v), nil, items)
		if err != nil {
			t.Fatal(err)
		}
		if res.rollouts.Samples != 6*8 || res.rollouts.Tokens == 0 {
			t.Fatalf("rollouts %+v", res.rollouts)
		}
		parent, err := adapter.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		next := parent
		if res.samples > 0 {
			if next, err = adapter.Apply(parent, res.delta); err != nil {
				t.Fatal(err)
			}
		}
		dir = filepath.Join(root, fmt.Sprintf("v%d", v))
		if err := next.Write(dir); err != nil {
			t.Fatal(err)
		}
		ev, err := w.evaluate(ctx, cfg, dir, rt)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("v%d: rollouts %+v, trained %d samples, eval %+v", v, res.rollouts, res.samples, ev)
		if ev.PassAt1 > best.PassAt1 || ev.PassAt1 == best.PassAt1 && ev.MeanReward > best.MeanReward {
			best = ev
		}
	}
	if !(best.PassAt1 > first.PassAt1) {
		t.Fatalf("pass@1 never rose above v0's %v (best %+v)", first.PassAt1, best)
	}
}

func TestBenchRollouts(t *testing.T) {
	rep, err := BenchRollouts(context.Background(), RolloutBenchOptions{Tasks: letterTasks(20), Verifier: charsetPlugin(t), Group: 4, Prompts: 4, Rounds: 2, LocalSteps: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if len(rep.Rounds) != 2 || rep.RolloutTokens == 0 || !(rep.RolloutTokensPerS > 0) || !(rep.RawTokensPerS > 0) ||
		!(rep.RolloutShare > 0 && rep.RolloutShare < 1) || rep.Rounds[0].Samples != 16 {
		t.Fatalf("report %+v", rep)
	}
}
