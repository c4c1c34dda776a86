package torch

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// The shared test vectors (model/engine/native/testdata/vectors): a tiny
// Qwen3-shaped model with fixed weights, a PEFT adapter for it, and the
// log-probs and step loss the native engine pins. Both engines must give
// the same log-probs, loss and LoRA gradients (relative 1e-4 in float32)
// and the same adapter after the same steps.

var vectorsDir = filepath.Join("..", "native", "testdata", "vectors")

// relTol bounds every comparison between the engines, relative to the
// magnitude compared (log-probs: max(1, |x|); a gradient or adapter tensor:
// its largest component).
const relTol = 1e-4

type vectors struct {
	Seqs      [][]int              `json:"seqs"`
	Base      [][]float32          `json:"base_logprobs"`
	Adapter   [][]float32          `json:"adapter_logprobs"`
	Batch     []engine.TrainSample `json:"train_batch"`
	Recipe    engine.Recipe        `json:"train_recipe"`
	AfterStep [][]float32          `json:"after_step_logprobs"`
	StepLoss  float64              `json:"step_loss"`
	Tolerance float64              `json:"tolerance"`
}

func readVectors(t *testing.T) vectors {
	b, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func cmpLogprobs(t *testing.T, name string, got, want [][]float32, tol float64) {
	t.Helper()
	var worst float64
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("%s seq %d: %d log-probs, want %d", name, i, len(got[i]), len(want[i]))
		}
		for j := range want[i] {
			d := math.Abs(float64(got[i][j]-want[i][j])) / max(1, math.Abs(float64(want[i][j])))
			worst = max(worst, d)
			if !(d <= tol) {
				t.Errorf("%s seq %d pos %d: %v, want %v", name, i, j, got[i][j], want[i][j])
			}
		}
	}
	t.Logf("%s: worst relative log-prob difference %.2g", name, worst)
}

// cmpTensors compares named tensors, each relative to its largest |component|.
func cmpTensors(t *testing.T, name string, got, want map[string][]float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tensors, want %d", name, len(got), len(want))
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	var worst float64
	worstName := ""
	for _, n := range names {
		g, ok := got[n]
		if !ok || len(g) != len(want[n]) {
			t.Errorf("%s: %s missing or of another size", name, n)
			continue
		}
		var scale, d float64
		for i, w := range want[n] {
			scale = max(scale, math.Abs(float64(w)))
			d = max(d, math.Abs(float64(g[i]-w)))
		}
		rel := d / max(scale, 1e-30)
		if scale == 0 {
			rel = d
		}
		if rel > worst || worstName == "" {
			worst, worstName = rel, n
		}
		if !(rel <= tol) {
			t.Errorf("%s: %s differs by %.3g (largest component %.3g)", name, n, d, scale)
		}
	}
	t.Logf("%s: %d tensors, worst relative difference %.2g (%s)", name, len(names), worst, worstName)
}

func cmpStats(t *testing.T, name string, got, want engine.StepStats) {
	t.Helper()
	rel := func(a, b float64) float64 { return math.Abs(a-b) / max(1e-12, math.Abs(b)) }
	if got.Tokens != want.Tokens || math.Abs(got.ClipFrac-want.ClipFrac) > 1e-9 ||
		rel(got.Loss, want.Loss) > relTol || rel(got.GradNorm, want.GradNorm) > relTol ||
		math.Abs(got.KL-want.KL) > relTol*max(1e-6, math.Abs(want.KL)) ||
		math.Abs(got.Entropy-want.Entropy) > relTol*max(1, math.Abs(want.Entropy)) {
		t.Errorf("%s: torch %+v, native %+v", name, got, want)
	}
}

func readAdapter(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	f, err := safetensors.ReadFile(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, name := range f.Names() {
		v, _, err := f.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = v
	}
	return out
}

// richBatch uses every input the loss has: recorded and on-policy old
// log-probs, reference log-probs for the KL term, mixed-sign advantages.
func richBatch(ne *native.Engine, v vectors) []engine.TrainSample {
	ref, err := ne.Logprobs(ctx, [][]int{v.Seqs[0], v.Seqs[2]}, true)
	if err != nil {
		panic(err)
	}
	mk := func(toks []int, from int, adv float32) ([]bool, []float32) {
		m, a := make([]bool, len(toks)), make([]float32, len(toks))
		for i := from; i < len(toks); i++ {
			m[i] = true
			a[i] = adv * float32(1+i%3) / 2
		}
		return m, a
	}
	m0, a0 := mk(v.Seqs[0], 2, 1)
	m2, a2 := mk(v.Seqs[2], 4, -1)
	m1, a1 := mk(v.Seqs[1], 1, 0.5)
	old2 := make([]float32, len(v.Seqs[2]))
	for i := range old2 {
		old2[i] = ref[1][i] + 0.1*float32(i%2)
	}
	return []engine.TrainSample{
		{Tokens: v.Seqs[0], LossMask: m0, Advantages: a0, RefLogprobs: ref[0]},
		{Tokens: v.Seqs[2], LossMask: m2, Advantages: a2, OldLogprobs: old2, RefLogprobs: ref[1]},
		{Tokens: v.Seqs[1], LossMask: m1, Advantages: a1},
	}
}

// vectorsOptions runs the torch engine of TestVectors on the device
// CLAWMESH_TORCH_DEVICE names (cpu when unset; cuda on a GPU machine, in
// float32, so that the same tolerances hold there).
func vectorsOptions(t *testing.T, py string) Options {
	o := Options{Python: py, Device: os.Getenv("CLAWMESH_TORCH_DEVICE")}
	if o.Device == DeviceCUDA {
		o.DType = "float32"
	}
	t.Logf("torch engine on %s", cmp.Or(o.Device, DeviceCPU))
	return o
}

func TestVectors(t *testing.T) {
	py := needTorch(t)
	v := readVectors(t)
	model, adapter := filepath.Join(vectorsDir, "model"), filepath.Join(vectorsDir, "adapter")
	te, err := Open(ctx, model, vectorsOptions(t, py))
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	ne, err := native.Open(ctx, model, native.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []engine.Engine{te, ne} {
		if err := e.LoadAdapter(ctx, adapter); err != nil {
			t.Fatal(err)
		}
	}
	if ti, ni := te.Info(), ne.Info(); fmt.Sprint(ti) != fmt.Sprint(ni) {
		t.Errorf("Info: torch %+v, native %+v", ti, ni)
	}

	t.Run("logprobs", func(t *testing.T) {
		for _, base := range []bool{true, false} {
			got, err := te.Logprobs(ctx, v.Seqs, base)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ne.Logprobs(ctx, v.Seqs, base)
			if err != nil {
				t.Fatal(err)
			}
			pinned := v.Adapter
			if base {
				pinned = v.Base
			}
			cmpLogprobs(t, fmt.Sprintf("base=%v vs native", base), got, want, relTol)
			cmpLogprobs(t, fmt.Sprintf("base=%v vs vectors.json", base), got, pinned, v.Tolerance)
		}
	})

	t.Run("gradients", func(t *testing.T) {
		rich := richBatch(ne, v)
		for _, c := range []struct {
			name  string
			batch []engine.TrainSample
			rc    engine.Recipe
		}{
			{"vectors batch", v.Batch, v.Recipe},
			// Two passes (micro-batch 1), KL, entropy, seq-mean, clip-higher.
			{"rich batch", rich, engine.Recipe{MicroBatch: 1, Loss: loss.Config{Agg: loss.SeqMean, KLCoef: 0.05,
				EntropyCoef: 0.01, EpsLow: 0.1, EpsHigh: 0.15}}},
			{"rich batch, one pass", rich, engine.Recipe{Loss: loss.Config{KLCoef: 0.05, EntropyCoef: -0.02}}},
		} {
			got, gst, err := te.Gradient(ctx, c.batch, c.rc)
			if err != nil {
				t.Fatal(err)
			}
			want, nst, err := ne.Gradient(ctx, c.batch, c.rc)
			if err != nil {
				t.Fatal(err)
			}
			if !(nst.Tokens > 0 && nst.GradNorm > 0) {
				t.Fatalf("%s: nothing to compare: %+v", c.name, nst)
			}
			cmpStats(t, c.name, gst, nst)
			cmpTensors(t, c.name+" gradient", got, want, relTol)
		}
	})

	t.Run("steps", func(t *testing.T) {
		st, err := te.TrainStep(ctx, v.Batch, v.Recipe)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(st.Loss-v.StepLoss) > v.Tolerance {
			t.Errorf("step loss %v, vectors.json %v", st.Loss, v.StepLoss)
		}
		after, err := te.Logprobs(ctx, v.Seqs, false)
		if err != nil {
			t.Fatal(err)
		}
		cmpLogprobs(t, "after a step vs vectors.json", after, v.AfterStep, v.Tolerance)
		nst, err := ne.TrainStep(ctx, v.Batch, v.Recipe)
		if err != nil {
			t.Fatal(err)
		}
		cmpStats(t, "step 1", st, nst)
		// More steps on both, on another batch and recipe, then compare the
		// adapters they export.
		rich := richBatch(ne, v)
		rc := engine.Recipe{LR: 5e-3, WeightDecay: 0.01, MaxGradNorm: 0.5, Loss: loss.Config{KLCoef: 0.02}}
		for i := range 3 {
			a, err := te.TrainStep(ctx, rich, rc)
			if err != nil {
				t.Fatal(err)
			}
			b, err := ne.TrainStep(ctx, rich, rc)
			if err != nil {
				t.Fatal(err)
			}
			cmpStats(t, fmt.Sprintf("step %d", i+2), a, b)
		}
		td, nd := t.TempDir(), t.TempDir()
		if err := te.ExportAdapter(ctx, td); err != nil {
			t.Fatal(err)
		}
		if err := ne.ExportAdapter(ctx, nd); err != nil {
			t.Fatal(err)
		}
		cmpTensors(t, "adapter after 4 steps", readAdapter(t, td), readAdapter(t, nd), relTol)
		// The torch engine's export loads into the native engine and gives
		// the torch engine's log-probs.
		if err := ne.LoadAdapter(ctx, td); err != nil {
			t.Fatal(err)
		}
		got, _ := te.Logprobs(ctx, v.Seqs, false)
		want, _ := ne.Logprobs(ctx, v.Seqs, false)
		cmpLogprobs(t, "torch's adapter in the native engine", got, want, relTol)
	})

	t.Run("fresh adapters", func(t *testing.T) {
		// Both engines reset to the same fresh adapter, bit for bit.
		if err := te.ResetAdapter(); err != nil {
			t.Fatal(err)
		}
		ne2, err := native.Open(ctx, model, native.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := ne2.ResetAdapter(); err != nil {
			t.Fatal(err)
		}
		td, nd := t.TempDir(), t.TempDir()
		if err := te.ExportAdapter(ctx, td); err != nil {
			t.Fatal(err)
		}
		if err := ne2.ExportAdapter(ctx, nd); err != nil {
			t.Fatal(err)
		}
		cmpTensors(t, "fresh adapter", readAdapter(t, td), readAdapter(t, nd), 0)
	})
}
