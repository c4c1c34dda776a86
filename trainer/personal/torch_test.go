package personal

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine/torch"
)

// needTorch returns a Python with torch, or skips the test (fails it where
// CI is set: CI installs PyTorch).
func needTorch(t *testing.T) string {
	t.Helper()
	env, err := torch.Probe(context.Background(), "")
	if err != nil {
		if v := os.Getenv("CI"); v != "" {
			if b, perr := strconv.ParseBool(v); perr != nil || b {
				t.Fatalf("python3 with torch not found, and CI is set: %v", err)
			}
		}
		t.Skip("python3 with torch not found (Debian: apt-get install python3-torch libopenblas0-pthread)")
	}
	return env.Python
}

// TestTrainTorch: the torch engine trains a personal adapter on the base
// with the shared version merged in and the previous personal adapter, as
// the native engine does: the same score before (the same policy), an
// adapter the native engine reads back with the score Train reported, and
// the shared version's base name; nothing of the merged base is left.
func TestTrainTorch(t *testing.T) {
	py := needTorch(t)
	ctx := context.Background()
	base := tinyBase(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	others := rollout(t, policy(t, base, "", ""), base, alice.Prompts, 8, 4, "v1", t0)
	for _, st := range others {
		r := -*st.Reward.Value
		st.Reward.Value = &r
	}
	shared := filepath.Join(t.TempDir(), "v2")
	if _, err := Train(ctx, testOptions(base), core.PersonalJob{Steps: others, Out: shared, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	prev := filepath.Join(t.TempDir(), "p1")
	onBase := rollout(t, policy(t, base, "", ""), base, alice.Prompts, 4, 5, "v1", t0)
	if _, err := Train(ctx, testOptions(base), core.PersonalJob{Steps: onBase, Out: prev, Seed: 4}); err != nil {
		t.Fatal(err)
	}
	served := policy(t, base, shared, prev)
	steps := rollout(t, served, base, alice.Prompts, 16, 6, "v2-p1", t0)
	held := rollout(t, served, base, alice.HeldBack, 16, 7, "v2-p1", t0)

	outDir := t.TempDir()
	out := filepath.Join(outDir, "p2")
	o := testOptions(base)
	o.Engine, o.Torch = EngineTorch, torch.Options{Python: py}
	res, err := Train(ctx, o, core.PersonalJob{Shared: shared, SharedVersion: "v2", Prev: prev, Steps: steps, HeldBack: held, Out: out, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("torch: %+v", res)
	before, _, _ := agreement(t, served, base, held)
	after, _, _ := agreement(t, policy(t, base, shared, out), base, held)
	// The engines agree to about 1e-5 in log-prob: a tie broken the other
	// way moves the share by 1/32 at most, now and then.
	if math.Abs(res.ScoreBefore-before) > 1.0/16 || math.Abs(res.ScoreAfter-after) > 1.0/16 || res.Trained == 0 {
		t.Errorf("torch scored %v → %v; the native engine scores the same adapters %v → %v", res.ScoreBefore, res.ScoreAfter, before, after)
	}
	if got, want := readConfig(t, out)["base_model_name_or_path"], readConfig(t, shared)["base_model_name_or_path"]; got != want {
		t.Errorf("base %v, want the shared version's %v", got, want)
	}
	if ents, _ := os.ReadDir(outDir); len(ents) != 1 {
		t.Errorf("beside the adapter: %d entries, want it alone (the merged base removed)", len(ents))
	}
}
