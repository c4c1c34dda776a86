package peft_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/peft"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// shape is what an adapter's tensors need of a model's shape.
type shape struct{ layers, hidden, q, kv, inter int }

func shapeOf(c native.Config) shape {
	return shape{c.Layers, c.Hidden, c.Heads * c.HeadDim, c.KVHeads * c.HeadDim, c.Intermediate}
}

// dims are a projection's (out, in).
func (s shape) dims(m string) (int, int) {
	switch m {
	case "q_proj":
		return s.q, s.hidden
	case "k_proj", "v_proj":
		return s.kv, s.hidden
	case "o_proj":
		return s.hidden, s.q
	case "gate_proj", "up_proj":
		return s.inter, s.hidden
	case "down_proj":
		return s.hidden, s.inter
	}
	panic(m)
}

var allTargets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

// spec is one adapter to write.
type spec struct {
	rank    int
	alpha   float64
	rslora  bool
	targets []string
	dtype   safetensors.DType
	seed    uint64
	base    string
}

// writeAdapter writes a PEFT adapter for a model of shape s whose A and B
// are both random (B nonzero, so the adapter changes the model).
func writeAdapter(t testing.TB, dir string, s shape, sp spec) {
	t.Helper()
	r := rand.New(rand.NewPCG(sp.seed, 99))
	var ts []safetensors.Tensor
	for l := range s.layers {
		for _, m := range sp.targets {
			out, in := s.dims(m)
			part := "self_attn"
			if m == "gate_proj" || m == "up_proj" || m == "down_proj" {
				part = "mlp"
			}
			for _, ab := range []struct {
				name  string
				shape []int
				scale float64
			}{{"A", []int{sp.rank, in}, 1 / math.Sqrt(float64(in))}, {"B", []int{out, sp.rank}, 0.5 / math.Sqrt(float64(sp.rank))}} {
				v := make([]float32, ab.shape[0]*ab.shape[1])
				for i := range v {
					v[i] = float32(r.NormFloat64() * ab.scale)
				}
				name := fmt.Sprintf("base_model.model.model.layers.%d.%s.%s.lora_%s.weight", l, part, m, ab.name)
				tn, err := safetensors.F32Tensor(name, sp.dtype, ab.shape, v)
				if err != nil {
					t.Fatal(err)
				}
				ts = append(ts, tn)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, peft.WeightsFile), ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, dir, map[string]any{
		"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": sp.rank, "lora_alpha": sp.alpha, "target_modules": sp.targets,
		"base_model_name_or_path": sp.base, "bias": "none", "use_rslora": sp.rslora, "use_dora": false,
		"fan_in_fan_out": false, "rank_pattern": map[string]any{}, "alpha_pattern": map[string]any{},
	})
}

func writeConfig(t testing.TB, dir string, c map[string]any) {
	t.Helper()
	cb, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, peft.ConfigFile), cb, 0o644); err != nil {
		t.Fatal(err)
	}
}

// twoAdapters writes the two adapters the format tests stack: rank 8
// (alpha 13) on every projection, F32; rank 4 rsLoRA (alpha 6) on three of
// them, BF16, its base spelt another way (a local copy's directory, lower
// case).
func twoAdapters(t *testing.T, s shape) (a, b string) {
	t.Helper()
	work := t.TempDir()
	a, b = filepath.Join(work, "a"), filepath.Join(work, "b")
	writeAdapter(t, a, s, spec{rank: 8, alpha: 13, targets: allTargets, dtype: safetensors.F32, seed: 1, base: "Qwen/Qwen3-0.6B"})
	writeAdapter(t, b, s, spec{rank: 4, alpha: 6, rslora: true, targets: []string{"q_proj", "v_proj", "down_proj"},
		dtype: safetensors.BF16, seed: 2, base: "/models/qwen3-0.6b/"})
	return a, b
}

func stackInto(t *testing.T, dirs ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "stacked")
	if err := peft.Stack(out, dirs...); err != nil {
		t.Fatal(err)
	}
	return out
}

func tinyConfig(t *testing.T) native.Config {
	t.Helper()
	_, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func maxAbs(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// TestStackNative checks the stacked adapter against applying the two one
// after the other in the native engine: the base with A merged in
// (MergeAdapter, as PEFT's merge_and_unload) and B loaded on top gives the
// log-probabilities the base gives with the stacked adapter, to float32
// rounding. Each adapter moves them by far more than the tolerance, so an
// adapter dropped or scaled wrongly would fail.
func TestStackNative(t *testing.T) {
	cfg := tinyConfig(t)
	a, b := twoAdapters(t, shapeOf(cfg))
	out := stackInto(t, a, b)
	ctx := context.Background()
	e, err := native.NewTiny(cfg, 7, native.Options{Seed: 3, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	seqs := [][]int{{1, 2, 3, 4, 5, 6}, {cfg.VocabSize - 8, 40, 41, 300, 7, 9}, {100, 101}}
	lp := func(e interface {
		Logprobs(context.Context, [][]int, bool) ([][]float32, error)
	}, base bool) []float32 {
		t.Helper()
		r, err := e.Logprobs(ctx, seqs, base)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Concat(r...)
	}
	base := lp(e, true)
	if err := e.LoadAdapter(ctx, a); err != nil {
		t.Fatal(err)
	}
	onlyA := lp(e, false)
	merged, err := e.MergeAdapter()
	if err != nil {
		t.Fatal(err)
	}
	defer merged.Close()
	if err := merged.LoadAdapter(ctx, b); err != nil {
		t.Fatal(err)
	}
	want := lp(merged, false)
	if err := e.LoadAdapter(ctx, out); err != nil {
		t.Fatal(err)
	}
	got := lp(e, false)
	const tol = 2e-5
	if d := maxAbs(got, want); d > tol {
		t.Errorf("base+stacked differs from base+A merged then B by %.3g in log-probability (tolerance %g)", d, tol)
	} else {
		t.Logf("base+stacked against base+A then B: max |Δ log p| %.2e", d)
	}
	if d := maxAbs(want, onlyA); d < 1e3*tol {
		t.Errorf("adapter B moves log-probabilities by only %.3g", d)
	}
	if d := maxAbs(onlyA, base); d < 1e3*tol {
		t.Errorf("adapter A moves log-probabilities by only %.3g", d)
	}
}

// TestStackConfig checks what the stacked adapter says of itself: rank the
// sum, scale 1, the union of the targets, the first input's base, and
// zero blocks where an input does not adapt a module.
func TestStackConfig(t *testing.T) {
	cfg := tinyConfig(t)
	a, b := twoAdapters(t, shapeOf(cfg))
	out := stackInto(t, a, b)
	st, err := peft.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	c := st.Config
	if c.R != 12 || c.LoraAlpha != 12 || c.UseRSLoRA || c.Scale() != 1 || c.BaseModel != "Qwen/Qwen3-0.6B" {
		t.Errorf("stacked config r %d alpha %g rslora %v scale %g base %q; want 12, 12, false, 1, Qwen/Qwen3-0.6B",
			c.R, c.LoraAlpha, c.UseRSLoRA, c.Scale(), c.BaseModel)
	}
	if got := slices.Sorted(slices.Values(st.Targets)); !slices.Equal(got, slices.Sorted(slices.Values(allTargets))) {
		t.Errorf("targets %v, want %v", st.Targets, allTargets)
	}
	if want := cfg.Layers * len(allTargets); len(st.Modules) != want {
		t.Fatalf("%d modules, want %d", len(st.Modules), want)
	}
	for _, m := range st.Modules {
		if !strings.HasSuffix(m.Name, "k_proj") {
			continue
		}
		// B's last four columns (adapter b's block) are zero: b does not
		// adapt k_proj; A's first eight rows are a's.
		for o := range m.Out {
			for k := 8; k < 12; k++ {
				if m.B[o*m.Rank+k] != 0 || m.A[k*m.In] != 0 {
					t.Fatalf("%s: the block of an adapter that does not adapt it is not zero", m.Name)
				}
			}
		}
	}
	id, err := baseid.FromAdapter(out)
	if err != nil {
		t.Fatal(err)
	}
	ida, err := baseid.FromAdapter(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := baseid.Same(id, ida); err != nil {
		t.Errorf("baseid: the stacked adapter's base is not adapter a's: %v", err)
	}
	if !slices.Equal(id.Names, ida.Names) || id.Layers != ida.Layers || id.Hidden != ida.Hidden || id.QDim != ida.QDim || id.KVDim != ida.KVDim {
		t.Errorf("baseid: stacked %+v, adapter a %+v", id, ida)
	}
}

// sumDeltas adds each module's delta of every adapter, by module name.
func sumDeltas(t *testing.T, mods ...map[string][]float64) map[string][]float64 {
	t.Helper()
	sum := map[string][]float64{}
	for _, ms := range mods {
		for n, d := range ms {
			if s, ok := sum[n]; ok {
				for i := range d {
					s[i] += d[i]
				}
				continue
			}
			sum[n] = slices.Clone(d)
		}
	}
	return sum
}

// compareDeltas checks got against want module by module, relative to the
// largest entry of want.
func compareDeltas(t *testing.T, what string, got, want map[string][]float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d modules, want %d", what, len(got), len(want))
	}
	var worst float64
	for n, w := range want {
		g, ok := got[n]
		if !ok || len(g) != len(w) {
			t.Fatalf("%s: module %s missing or of another size", what, n)
		}
		var scale, d float64
		for i := range w {
			scale = max(scale, math.Abs(w[i]))
			d = max(d, math.Abs(g[i]-w[i]))
		}
		if scale == 0 {
			t.Fatalf("%s: module %s has a zero delta", what, n)
		}
		worst = max(worst, d/scale)
	}
	if worst > tol {
		t.Errorf("%s: the stacked delta differs from the sum by %.3g of the largest entry (tolerance %g)", what, worst, tol)
	} else {
		t.Logf("%s: stacked against summed deltas: largest relative difference %.2e", what, worst)
	}
}

// TestStackMLX exports the two adapters and the stacked one to mlx-lm's
// format: every module's delta in the stacked export is the sum of the two
// exports' deltas.
func TestStackMLX(t *testing.T) {
	a, b := twoAdapters(t, shapeOf(tinyConfig(t)))
	out := stackInto(t, a, b)
	deltas := func(dir string) map[string][]float64 {
		t.Helper()
		mdir := filepath.Join(t.TempDir(), "mlx")
		if err := mlx.Export(dir, mdir); err != nil {
			t.Fatal(err)
		}
		ad, err := mlx.Read(mdir)
		if err != nil {
			t.Fatal(err)
		}
		ds := map[string][]float64{}
		for _, m := range ad.Modules {
			ds[m.Name()] = m.Delta()
		}
		return ds
	}
	compareDeltas(t, "mlx", deltas(out), sumDeltas(t, deltas(a), deltas(b)), 1e-6)
}

// ggufDeltas reads a llama.cpp LoRA GGUF back and returns each adapted
// weight's delta as llama.cpp applies it: alpha/r · B·A, r being lora_b's
// first (ggml) dimension.
func ggufDeltas(t *testing.T, path string) map[string][]float64 {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	alpha, err := f.Float32(gguf.KeyLoRAAlpha)
	if err != nil {
		t.Fatal(err)
	}
	ds := map[string][]float64{}
	for _, ti := range f.Tensors {
		stem, ok := strings.CutSuffix(ti.Name, ".lora_a")
		if !ok {
			continue
		}
		av, at, err := f.TensorFloat32(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		bv, bt, err := f.TensorFloat32(stem + ".lora_b")
		if err != nil {
			t.Fatal(err)
		}
		in, r, out := int(at.Shape[0]), int(at.Shape[1]), int(bt.Shape[1])
		if int(bt.Shape[0]) != r {
			t.Fatalf("%s: lora_a %v and lora_b %v", stem, at.Shape, bt.Shape)
		}
		m := peft.Module{Name: stem, In: in, Out: out, Rank: r, A: av, B: bv, Scale: float64(alpha) / float64(r)}
		ds[stem] = m.Delta()
	}
	return ds
}

// TestStackGGUF exports the two adapters and the stacked one to llama.cpp
// LoRA GGUFs: every weight's delta read back from the stacked GGUF is the
// sum of the two GGUFs' deltas.
func TestStackGGUF(t *testing.T) {
	a, b := twoAdapters(t, shapeOf(tinyConfig(t)))
	out := stackInto(t, a, b)
	work := t.TempDir()
	deltas := func(name, dir string) map[string][]float64 {
		t.Helper()
		p := filepath.Join(work, name+".gguf")
		if err := gguf.ExportLoRA(dir, p, gguf.LoRAOptions{Arch: gguf.ArchQwen3}); err != nil {
			t.Fatal(err)
		}
		return ggufDeltas(t, p)
	}
	compareDeltas(t, "gguf", deltas("stacked", out), sumDeltas(t, deltas("a", a), deltas("b", b)), 1e-6)
}

// TestStackRefuses checks the errors for what cannot be stacked, and that
// a refused stack leaves nothing behind.
func TestStackRefuses(t *testing.T) {
	cfg := tinyConfig(t)
	s := shapeOf(cfg)
	work := t.TempDir()
	a := filepath.Join(work, "a")
	writeAdapter(t, a, s, spec{rank: 4, alpha: 8, targets: allTargets, dtype: safetensors.F32, seed: 1, base: "Qwen/Qwen3-0.6B"})
	other := filepath.Join(work, "other-base")
	writeAdapter(t, other, s, spec{rank: 4, alpha: 8, targets: allTargets, dtype: safetensors.F32, seed: 2, base: "Qwen/Qwen3-1.7B"})
	noName := filepath.Join(work, "no-name")
	writeAdapter(t, noName, s, spec{rank: 4, alpha: 8, targets: allTargets, dtype: safetensors.F32, seed: 2})
	wider := s
	wider.hidden *= 2
	wide := filepath.Join(work, "wide")
	writeAdapter(t, wide, wider, spec{rank: 4, alpha: 8, targets: []string{"q_proj"}, dtype: safetensors.F32, seed: 3, base: "Qwen/Qwen3-0.6B"})
	dora := filepath.Join(work, "dora")
	writeAdapter(t, dora, s, spec{rank: 4, alpha: 8, targets: allTargets, dtype: safetensors.F32, seed: 4, base: "Qwen/Qwen3-0.6B"})
	writeConfig(t, dora, map[string]any{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": true, "base_model_name_or_path": "Qwen/Qwen3-0.6B"})
	badRank := filepath.Join(work, "bad-rank")
	writeAdapter(t, badRank, s, spec{rank: 4, alpha: 8, targets: allTargets, dtype: safetensors.F32, seed: 5, base: "Qwen/Qwen3-0.6B"})
	writeConfig(t, badRank, map[string]any{"peft_type": "LORA", "r": 8, "lora_alpha": 8, "base_model_name_or_path": "Qwen/Qwen3-0.6B"})
	exists := filepath.Join(work, "exists")
	if err := os.Mkdir(exists, 0o755); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		out  string
		dirs []string
		err  error  // wrapped, or nil for any error
		says string // in the message
	}{
		{"no adapters", "", nil, nil, "two or more"},
		{"one adapter", "", []string{a}, nil, "two or more"},
		{"different bases", "", []string{a, other}, peft.ErrMismatch, "Qwen/Qwen3-1.7B"},
		{"a base and none", "", []string{a, noName}, peft.ErrMismatch, "base model"},
		{"different shapes", "", []string{a, wide}, peft.ErrMismatch, "q_proj"},
		{"DoRA", "", []string{a, dora}, peft.ErrUnsupported, "use_dora"},
		{"rank not r", "", []string{a, badRank}, peft.ErrFormat, "r is 8"},
		{"missing adapter", "", []string{a, filepath.Join(work, "nowhere")}, peft.ErrFormat, "nowhere"},
		{"output exists", exists, []string{a, a}, peft.ErrExists, exists},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := c.out
			if out == "" {
				out = filepath.Join(t.TempDir(), "stacked")
			}
			err := peft.Stack(out, c.dirs...)
			if err == nil {
				t.Fatal("stacked")
			}
			if c.err != nil && !errors.Is(err, c.err) {
				t.Errorf("error %v, want %v", err, c.err)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %q does not say %q", err, c.says)
			}
			if c.out == "" {
				if _, serr := os.Lstat(out); serr == nil {
					t.Errorf("a refused stack wrote %s", out)
				}
				if left, _ := os.ReadDir(filepath.Dir(out)); len(left) > 0 {
					t.Errorf("a refused stack left %s behind", left[0].Name())
				}
			}
		})
	}
	if left, _ := os.ReadDir(exists); len(left) > 0 {
		t.Errorf("stacking onto an existing directory wrote into it")
	}
	// The same adapter twice stacks (its delta doubled): stacking is a sum.
	if err := peft.Stack(filepath.Join(work, "twice"), a, a); err != nil {
		t.Errorf("an adapter stacked with itself: %v", err)
	}
}

// renameTensors rewrites dir's adapter_model.safetensors with every tensor
// name passed through fn; extra tensors (name → source name) are added.
func renameTensors(t *testing.T, dir string, fn func(string) string, extra map[string]string) {
	t.Helper()
	p := filepath.Join(dir, peft.WeightsFile)
	f, err := safetensors.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	add := func(name, src string) {
		ti, b, err := f.Raw(src)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, safetensors.Tensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: slices.Clone(b)})
	}
	for _, n := range f.Names() {
		add(fn(n), n)
	}
	for n, src := range extra {
		add(n, src)
	}
	if err := safetensors.WriteFile(p, ts, nil); err != nil {
		t.Fatal(err)
	}
}

// TestStackPrefix stacks an adapter whose tensors lack PEFT's
// "base_model.model." prefix with one that has it: the modules are the
// same, and the stacked delta of each is the sum of the two. An adapter
// naming one module both ways is refused.
func TestStackPrefix(t *testing.T) {
	s := shape{layers: 2, hidden: 8, q: 8, kv: 4, inter: 12}
	work := t.TempDir()
	a, b := filepath.Join(work, "a"), filepath.Join(work, "b")
	writeAdapter(t, a, s, spec{rank: 2, alpha: 3, targets: []string{"q_proj", "up_proj"}, dtype: safetensors.F32, seed: 1, base: "m"})
	writeAdapter(t, b, s, spec{rank: 3, alpha: 5, rslora: true, targets: []string{"q_proj"}, dtype: safetensors.F16, seed: 2, base: "m"})
	renameTensors(t, b, func(n string) string { return strings.TrimPrefix(n, "base_model.model.") }, nil)
	out := stackInto(t, a, b)
	deltas := func(dir string) map[string][]float64 {
		t.Helper()
		ad, err := peft.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		ds := map[string][]float64{}
		for _, m := range ad.Modules {
			ds["base_model.model."+strings.TrimPrefix(m.Name, "base_model.model.")] = m.Delta()
		}
		return ds
	}
	compareDeltas(t, "prefix", deltas(out), sumDeltas(t, deltas(a), deltas(b)), 1e-6)

	dup := filepath.Join(work, "dup")
	writeAdapter(t, dup, s, spec{rank: 2, alpha: 3, targets: []string{"q_proj"}, dtype: safetensors.F32, seed: 3, base: "m"})
	renameTensors(t, dup, func(n string) string { return n }, map[string]string{
		"model.layers.0.self_attn.q_proj.lora_A.weight": "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight",
		"model.layers.0.self_attn.q_proj.lora_B.weight": "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight",
	})
	err := peft.Stack(filepath.Join(work, "dup-stacked"), a, dup)
	if !errors.Is(err, peft.ErrFormat) || !strings.Contains(err.Error(), "same module") {
		t.Errorf("an adapter naming a module twice: error %v, want %v saying so", err, peft.ErrFormat)
	}
}
