package trainer

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/torch"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// checkRolloutsExact runs episodes on w's engine and checks that what a
// rollout records is exact: the engine's own log-probs of the recorded
// prompt and reply ids, recomputed, are the recorded ones.
func checkRolloutsExact(t *testing.T, w *worker) {
	t.Helper()
	ctx := context.Background()
	set, err := tasks.Parse(strings.NewReader(string(letterTasks(4))))
	if err != nil {
		t.Fatal(err)
	}
	rt := localRuntime(t, set, group.TaskSet{Hash: set.Hash, Reward: set.Hash, Group: 2}, charsetPlugin(t), nil)
	cfg := testGroup.WithDefaults()
	dir := filepath.Join(t.TempDir(), "v0")
	if _, err := w.genesis(ctx, cfg, dir); err != nil {
		t.Fatal(err)
	}
	if err := w.eng.LoadAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	for k, task := range set.Tasks {
		steps, sc, n, err := w.episode(ctx, rt, task, 0, 1, uint64(k), "x")
		if err != nil {
			t.Fatal(err)
		}
		if len(steps) != 1 || n == 0 || sc.Value == nil {
			t.Fatalf("%d steps, %d tokens, score %+v", len(steps), n, sc)
		}
		st := steps[0]
		prompt, c := st.Response.PromptTokenIDs, st.Response.Choices[0]
		seq := slices0(prompt)
		for _, tk := range c.Tokens {
			seq = append(seq, tk.ID)
		}
		lps, err := w.eng.Logprobs(ctx, [][]int{seq}, false)
		if err != nil {
			t.Fatal(err)
		}
		for i, tk := range c.Tokens {
			if got := float64(lps[0][len(prompt)+i]); math.Abs(got-tk.Logprob) > 2e-3 {
				t.Fatalf("task %s token %d: recorded log-prob %v, the engine gives %v", task.ID, i, tk.Logprob, got)
			}
		}
	}
}

func slices0(xs []int) []int { return append([]int(nil), xs...) }

func TestRolloutsExactNative(t *testing.T) {
	w := &worker{}
	defer w.close()
	checkRolloutsExact(t, w)
}

// TestRolloutsExactTorch runs the same rollouts through the torch engine
// (the PyTorch worker on the CPU), through the same Engine interface.
func TestRolloutsExactTorch(t *testing.T) {
	env, err := torch.Probe(context.Background(), "")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the torch engine may not be skipped: %v", err)
		}
		t.Skipf("python3 with torch not found: %v", err)
	}
	w := &worker{engineID: EngineTorch, device: DeviceCPU, python: env.Python}
	defer w.close()
	checkRolloutsExact(t, w)
}
