package sim

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/model/engine/native/nativetest"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/trainer/learn"
)

var update = flag.Bool("update", false, "measure the native engine's learning curves again into "+curvesFile)

// curvesFile holds the native engine's measured learning curves, which
// the learning model is fitted to.
const curvesFile = "testdata/native_curves.json"

// nativeCurves is curvesFile.
type nativeCurves struct {
	Command string        `json:"command"`
	Date    string        `json:"date"`
	Setup   string        `json:"setup"`
	Curves  []nativeCurve `json:"curves"`
}

// nativeCurve is one run: the probability that the policy's reply is the
// preferred one before the first round (Preferred[0]) and after each round.
type nativeCurve struct {
	Samples   int       `json:"samples"` // per round
	Seed      uint64    `json:"seed"`
	Preferred []float64 `json:"preferred"`
}

// The measured runs: rounds of curveSamples samples, over curveSeeds.
var (
	curveSamples = []int{8, 32, 128}
	curveSeeds   = []uint64{1, 2, 3, 4, 5, 6}
)

const (
	curveRounds  = 10
	curvePrompts = 4 // learn.DefaultPrompts
)

// measureCurve runs Binary RL on the tiny model of seed the way a trainer
// learns from live use: each reply alone against the running baseline,
// one optimizer step a round at the group's default learning rate.
func measureCurve(t *testing.T, samples int, seed uint64) nativeCurve {
	t.Helper()
	// Two threads whatever the machine: the engine's sums depend on it.
	eng, tok := nativetest.Tiny(t, seed, 2)
	if len(learn.DefaultPrompts) != curvePrompts {
		t.Fatalf("learn.DefaultPrompts has %d prompts, the curves were measured with %d", len(learn.DefaultPrompts), curvePrompts)
	}
	rep, err := learn.RunPreference(context.Background(), eng, tok, learn.PreferenceOptions{
		Seed: seed, Rounds: curveRounds, Samples: samples / curvePrompts, Alone: true, EvalRounds: true,
		Learn: learn.Options{Recipe: loss.RecipeRL},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := nativeCurve{Samples: samples, Seed: seed, Preferred: []float64{rep.Before.PreferredProb}}
	for _, r := range rep.Rounds {
		// A reply that cannot be made into a sample, or one the
		// staleness rule drops, is left out: Used can fall short.
		if r.Train.OptSteps != 1 || r.Train.Used < samples*9/10 {
			t.Fatalf("round %d trained %d samples in %d steps, want about %d in 1", r.Round, r.Train.Used, r.Train.OptSteps, samples)
		}
		c.Preferred = append(c.Preferred, r.PreferredProb)
	}
	return c
}

func loadCurves(t *testing.T) nativeCurves {
	t.Helper()
	b, err := os.ReadFile(curvesFile)
	if err != nil {
		t.Fatal(err)
	}
	var nc nativeCurves
	if err := json.Unmarshal(b, &nc); err != nil {
		t.Fatalf("%s: %v", curvesFile, err)
	}
	if len(nc.Curves) != len(curveSamples)*len(curveSeeds) {
		t.Fatalf("%s has %d curves, want %d", curvesFile, len(nc.Curves), len(curveSamples)*len(curveSeeds))
	}
	return nc
}

// TestNativeCurves checks the stored curves against the engine: one curve
// measured again must match. With -update it measures them all again
// (a few minutes) and writes the file.
func TestNativeCurves(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the tiny model")
	}
	if *update {
		nc := nativeCurves{
			Command: "go test ./sim -run TestNativeCurves -update",
			Date:    time.Now().UTC().Format("2006-01-02"),
			Setup: fmt.Sprintf("native engine, tiny model; Binary RL on learn's preference scenario (%d prompts), each reply alone against the running baseline (live use); "+
				"one optimizer step a round at the learning rate 1e-2 (group.DefaultLR); preferred: the exact probability that the reply's first token is a word", curvePrompts),
		}
		for _, s := range curveSamples {
			for _, seed := range curveSeeds {
				c := measureCurve(t, s, seed)
				t.Logf("samples %d seed %d: %.3f", s, seed, c.Preferred)
				nc.Curves = append(nc.Curves, c)
			}
		}
		b, err := json.MarshalIndent(nc, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(curvesFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	nc := loadCurves(t)
	var stored *nativeCurve
	for i, c := range nc.Curves {
		if c.Samples == 32 && c.Seed == 1 {
			stored = &nc.Curves[i]
		}
	}
	if stored == nil {
		t.Fatalf("%s has no curve of 32 samples, seed 1", curvesFile)
	}
	got := measureCurve(t, 32, 1)
	// The engine is deterministic at a given thread count; the tolerance
	// is for another CPU's floating point.
	for k := range got.Preferred {
		if math.Abs(got.Preferred[k]-stored.Preferred[k]) > 0.02 {
			t.Fatalf("measured %.3f, %s has %.3f: the engine learns differently now; measure again with -update and fit the model again (TestLearningFit)",
				got.Preferred, curvesFile, stored.Preferred)
		}
	}
}
