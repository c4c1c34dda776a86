package native

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
)

// Test vectors shared with other engines (the torch worker checks itself
// against the same files): testdata/vectors/model is an HF model directory,
// adapter a PEFT adapter for it, and vectors.json the expected log-probs
// without and with the adapter, and after one TrainStep from that adapter.
// Regenerate with `go test -run TestVectors -update` (only on purpose: the
// files pin the engine's numerics).

var update = flag.Bool("update", false, "rewrite testdata/vectors")

type vectors struct {
	Seqs        [][]int              `json:"seqs"`
	Base        [][]float32          `json:"base_logprobs"`
	Adapter     [][]float32          `json:"adapter_logprobs"`
	Batch       []engine.TrainSample `json:"train_batch"`
	Recipe      engine.Recipe        `json:"train_recipe"`
	AfterStep   [][]float32          `json:"after_step_logprobs"`
	StepLoss    float64              `json:"step_loss"`
	Tolerance   float64              `json:"tolerance"`
	Description string               `json:"description"`
}

func vectorsConfig() Config {
	c := Config{VocabSize: 32, Hidden: 32, Intermediate: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
		RopeTheta: 10000, RMSNormEps: 1e-6, MaxPosition: 256, EOS: []int{31}}
	c.defaults()
	return c
}

func computeVectors(t *testing.T, e *Engine, v *vectors) {
	t.Helper()
	var err error
	if v.Base, err = e.Logprobs(ctx, v.Seqs, true); err != nil {
		t.Fatal(err)
	}
	if v.Adapter, err = e.Logprobs(ctx, v.Seqs, false); err != nil {
		t.Fatal(err)
	}
	st, err := e.TrainStep(ctx, v.Batch, v.Recipe)
	if err != nil {
		t.Fatal(err)
	}
	v.StepLoss = st.Loss
	if v.AfterStep, err = e.Logprobs(ctx, v.Seqs, false); err != nil {
		t.Fatal(err)
	}
}

func TestVectors(t *testing.T) {
	dir := filepath.Join("testdata", "vectors")
	if *update {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := CreateTiny(filepath.Join(dir, "model"), vectorsConfig(), 77); err != nil {
			t.Fatal(err)
		}
		e, err := Open(ctx, filepath.Join(dir, "model"), Options{Name: "clawmesh-vectors", LoRA: LoRAConfig{Rank: 2}, Seed: 5})
		if err != nil {
			t.Fatal(err)
		}
		perturb(e, 5)
		if err := e.ExportAdapter(ctx, filepath.Join(dir, "adapter")); err != nil {
			t.Fatal(err)
		}
		v := vectors{
			Description: "log-probs (index 0 is 0) of seqs under the base model, with the adapter, and with the adapter after one TrainStep on train_batch",
			Seqs:        [][]int{{1, 5, 9, 2, 30, 7, 7, 12}, {4, 4, 4, 4}, {0, 31, 16, 3, 22, 9, 1, 8, 15, 27, 6, 19}},
			Batch: []engine.TrainSample{
				{Tokens: []int{1, 5, 9, 2, 30, 7}, LossMask: []bool{false, false, false, true, true, true}, Advantages: []float32{0, 0, 0, 1, 1, 1}},
				{Tokens: []int{1, 5, 9, 2, 11, 3}, LossMask: []bool{false, false, false, true, true, true}, Advantages: []float32{0, 0, 0, -1, -1, -1},
					OldLogprobs: []float32{0, 0, 0, -3.2, -3.5, -3.1}},
			},
			Recipe:    engine.Recipe{LR: 1e-3},
			Tolerance: 1e-4,
		}
		computeVectors(t, e, &v)
		b, _ := json.MarshalIndent(v, "", " ")
		if err := os.WriteFile(filepath.Join(dir, "vectors.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want vectors
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	e, err := Open(ctx, filepath.Join(dir, "model"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.LoadAdapter(ctx, filepath.Join(dir, "adapter")); err != nil {
		t.Fatal(err)
	}
	got := want
	computeVectors(t, e, &got)
	cmp := func(name string, a, b [][]float32) {
		for i := range b {
			for j := range b[i] {
				if d := math.Abs(float64(a[i][j] - b[i][j])); d > want.Tolerance {
					t.Errorf("%s seq %d pos %d: %v, vector %v", name, i, j, a[i][j], b[i][j])
				}
			}
		}
	}
	cmp("base", got.Base, want.Base)
	cmp("adapter", got.Adapter, want.Adapter)
	cmp("after step", got.AfterStep, want.AfterStep)
	if math.Abs(got.StepLoss-want.StepLoss) > want.Tolerance {
		t.Errorf("step loss %v, vector %v", got.StepLoss, want.StepLoss)
	}
}
