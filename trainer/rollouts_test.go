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

var testPlugins struct {
	sync.Mutex
	paths map[string]string
}

// testPlugin builds testdata/NAME with the Go toolchain, once per run
// (skipping the test without one), and returns the module.
func testPlugin(t testing.TB, name string) []byte {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH to build the test plugins")
	}
	testPlugins.Lock()
	defer testPlugins.Unlock()
	p, ok := testPlugins.paths[name]
	if !ok {
		d, err := os.MkdirTemp("", "clawmesh-plugin-")
		if err != nil {
			t.Fatal(err)
		}
		p = filepath.Join(d, name+".wasm")
		if _, err := reward.Build(context.Background(), filepath.Join("testdata", name), p, os.Stderr); err != nil {
			t.Fatal(err)
		}
		if testPlugins.paths == nil {
			testPlugins.paths = map[string]string{}
		}
		testPlugins.paths[name] = p
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// charsetPlugin is the verifier of letterTasks.
func charsetPlugin(t testing.TB) []byte { return testPlugin(t, "charset") }

// moodyPlugin is a verifier that scores letterTasks as charset does, and
// traps, abstains or gives every reply the same score on the tasks whose
// meta says so (moodyTasks).
func moodyPlugin(t testing.TB) []byte { return testPlugin(t, "moody") }

// moodyTasks is letterTasks(n) with task i's meta given extra(i) as well
// (say `"trap":true`; "" for nothing more).
func moodyTasks(n int, extra func(i int) string) []byte {
	var b strings.Builder
	for i := range n {
		meta := `"max_tokens":4`
		if x := extra(i); x != "" {
			meta += "," + x
		}
		fmt.Fprintf(&b, `{"id":"w%03d","messages":[{"role":"user","content":"Answer in lower-case words only. Item %d."}],"answer":"abcdefghijklmnopqrstuvwxyz ","meta":{%s}}`+"\n", i, i, meta)
	}
	return []byte(b.String())
}

// localRuntime makes a task runtime without a trainer: the set and the
// verifier from a file.
func localRuntime(t testing.TB, set *tasks.Set, ts group.TaskSet, plugin, tools []byte) *rolloutRuntime {
	t.Helper()
	write := func(name string, b []byte) string {
		if b == nil {
			return ""
		}
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rt, err := newLocalRuntime(context.Background(), set, ts, write("verifier.wasm", plugin), write("tools.wasm", tools))
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
	rt := localRuntime(t, set, ts, charsetPlugin(t), nil)
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

// TestEvaluateCountsAbstentions: an evaluation counts the held-out
// prompts the verifier gave no score, whether it abstained or trapped;
// they count 0 in the mean reward and never pass.
func TestEvaluateCountsAbstentions(t *testing.T) {
	ctx := context.Background()
	set, err := tasks.Parse(strings.NewReader(string(moodyTasks(8, func(i int) string {
		switch i % 4 {
		case 0:
			return `"abstain":true`
		case 1:
			return `"trap":true`
		}
		return ""
	}))))
	if err != nil {
		t.Fatal(err)
	}
	ts := group.TaskSet{Hash: set.Hash, Reward: tasks.Hash([]byte("x")), Group: 2}
	for _, x := range set.Tasks {
		ts.HeldOut = append(ts.HeldOut, x.ID)
	}
	rt := localRuntime(t, set, ts, moodyPlugin(t), nil)
	w := &worker{}
	defer w.close()
	cfg := testGroup.WithDefaults()
	dir := filepath.Join(t.TempDir(), "v0")
	if _, err := w.genesis(ctx, cfg, dir); err != nil {
		t.Fatal(err)
	}
	ev, err := w.evaluate(ctx, cfg, dir, rt)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Prompts != 8 || ev.Abstained != 4 || ev.Passed > 4 || ev.MostlyAbstained() {
		t.Fatalf("evaluation %+v", ev)
	}
}
