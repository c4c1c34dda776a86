package native

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// The engine's own float64 reference (reference_test.go) and the
// finite-difference checks (grad_test.go) share the Go code's reading of
// Qwen3 and PEFT, so a convention error (RoPE layout, q/k norm placement,
// GQA head mapping, LoRA scale, PEFT tensor names, tied embeddings) would
// pass both. TestMatchesTorch compares with testdata/torch_check.py, an
// independent float64 PyTorch model written from transformers'
// modeling_qwen3 and PEFT's LoRA, whose adapter gradients come from autograd.

const (
	// torchLogprobTol bounds |Go − torch| per log-prob: the Go side runs in
	// float32 and log-probs reach −15 nats here.
	torchLogprobTol = 1e-4
	// torchGradTol bounds |Go − torch| per gradient component, relative to
	// the largest |component| of the same PEFT tensor.
	torchGradTol = 1e-3
)

// torchPython returns a Python that can import torch: Debian's
// (python3-torch installs there) or the first python3 on PATH.
func torchPython() string {
	for _, cand := range []string{"/usr/bin/python3", "python3"} {
		p, err := exec.LookPath(cand)
		if err == nil && exec.Command(p, "-c", "import torch").Run() == nil {
			return p
		}
	}
	return ""
}

// inCI reports whether the CI environment variable asks for every
// cross-check to run.
func inCI() bool {
	v := os.Getenv("CI")
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err != nil || b
}

type torchRequest struct {
	ModelDir    string      `json:"model_dir"`
	AdapterDir  *string     `json:"adapter_dir"`
	Seqs        [][]int     `json:"seqs"`
	LossWeights [][]float64 `json:"loss_weights,omitempty"`
}

type torchResult struct {
	Logprobs [][]float64          `json:"logprobs"`
	Grads    map[string][]float64 `json:"grads"`
}

func runTorch(t *testing.T, py string, req torchRequest) torchResult {
	t.Helper()
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join("testdata", "torch_check.py"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("torch_check.py: %v\n%s", err, stderr.Bytes())
	}
	var res torchResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("torch_check.py output: %v", err)
	}
	if len(res.Logprobs) != len(req.Seqs) {
		t.Fatalf("torch_check.py: %d log-prob rows for %d seqs", len(res.Logprobs), len(req.Seqs))
	}
	return res
}

// torchCase is a model directory, an adapter for it, and the sequences to
// score; skipBase skips the base model when another case already covers it.
type torchCase struct {
	model, adapter string
	seqs           [][]int
	skipBase       bool
}

func TestMatchesTorch(t *testing.T) {
	py := torchPython()
	if py == "" {
		const how = "python3 with torch not found (Debian: apt-get install python3-torch libopenblas0-pthread, then /usr/bin/python3 has it)"
		if inCI() {
			t.Fatal(how + "; CI is set, so the torch cross-check may not be skipped")
		}
		t.Skip(how)
	}

	t.Run("vectors", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("testdata", "vectors", "vectors.json"))
		if err != nil {
			t.Fatal(err)
		}
		var v vectors
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		checkTorch(t, py, torchCase{model: filepath.Join("testdata", "vectors", "model"),
			adapter: filepath.Join("testdata", "vectors", "adapter"), seqs: v.Seqs})
	})

	// A second shape that differs from the vectors model wherever a
	// convention could hide: tied embeddings, three query heads per kv head,
	// head_dim (12) unequal to hidden/heads (8) so q/o projections are not
	// square, another rope theta and eps, three layers, longer sequences,
	// and an adapter of another rank and alpha/r on a subset of modules.
	dir := t.TempDir()
	model, adapter := filepath.Join(dir, "model"), filepath.Join(dir, "adapter")
	cfg := Config{VocabSize: 45, Hidden: 48, Intermediate: 80, Layers: 3, Heads: 6, KVHeads: 2, HeadDim: 12,
		RopeTheta: 1000, RMSNormEps: 1e-5, TiedEmbeddings: true, MaxPosition: 128, EOS: []int{44}}
	if err := CreateTiny(model, cfg, 21); err != nil {
		t.Fatal(err)
	}
	e, err := Open(ctx, model, Options{LoRA: LoRAConfig{Rank: 3, Alpha: 5,
		Targets: []string{"q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"}}, Seed: 21})
	if err != nil {
		t.Fatal(err)
	}
	perturb(e, 21)
	if err := e.ExportAdapter(ctx, adapter); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(21, 1))
	var seqs [][]int
	for _, n := range []int{40, 17, 2, 1} {
		s := make([]int, n)
		for i := range s {
			s[i] = r.IntN(cfg.VocabSize)
		}
		seqs = append(seqs, s)
	}
	t.Run("tiny", func(t *testing.T) {
		checkTorch(t, py, torchCase{model: model, adapter: adapter, seqs: seqs})
	})

	// rsLoRA scales by alpha/√r; the engine reads it from adapter_config.json.
	t.Run("rslora", func(t *testing.T) {
		rs := filepath.Join(t.TempDir(), "adapter")
		if err := os.CopyFS(rs, os.DirFS(adapter)); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(rs, adapterConfigFile)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b2 := bytes.Replace(b, []byte(`"use_rslora": false`), []byte(`"use_rslora": true`), 1)
		if bytes.Equal(b, b2) {
			t.Fatalf("no use_rslora in %s", b)
		}
		if err := os.WriteFile(p, b2, 0o644); err != nil {
			t.Fatal(err)
		}
		checkTorch(t, py, torchCase{model: model, adapter: rs, seqs: seqs[:2], skipBase: true})
	})

	// torch_check.py reads adapter_config.json with PEFT's field types, so
	// the exported config passing above means PEFT can hold it; a null
	// where PEFT needs a dict (as exports once wrote) must not pass.
	t.Run("peft types", func(t *testing.T) {
		for _, field := range []string{"rank_pattern", "alpha_pattern"} {
			bad := filepath.Join(t.TempDir(), "adapter")
			if err := os.CopyFS(bad, os.DirFS(adapter)); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(bad, adapterConfigFile)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b2 := bytes.Replace(b, []byte(`"`+field+`": {}`), []byte(`"`+field+`": null`), 1)
			if bytes.Equal(b, b2) {
				t.Fatalf("no empty %s in %s", field, b)
			}
			if err := os.WriteFile(p, b2, 0o644); err != nil {
				t.Fatal(err)
			}
			in, _ := json.Marshal(torchRequest{ModelDir: model, AdapterDir: &bad, Seqs: seqs[:1]})
			cmd := exec.Command(py, filepath.Join("testdata", "torch_check.py"))
			cmd.Stdin = bytes.NewReader(in)
			out, err := cmd.CombinedOutput()
			if err == nil || !bytes.Contains(out, []byte(field+" is null")) {
				t.Errorf("torch_check.py accepted a null %s: %v\n%s", field, err, out)
			}
		}
	})
}

// checkTorch compares the engine's log-probs without and with the adapter,
// and the adapter gradient of Σ w_t·logp_t, with torch_check.py's.
func checkTorch(t *testing.T, py string, c torchCase) {
	e, err := Open(ctx, c.model, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.LoadAdapter(ctx, c.adapter); err != nil {
		t.Fatal(err)
	}

	cmpLogprobs := func(name string, got [][]float32, want [][]float64) {
		t.Helper()
		var worst float64
		for i := range c.seqs {
			if len(got[i]) != len(want[i]) {
				t.Fatalf("%s seq %d: %d log-probs, torch %d", name, i, len(got[i]), len(want[i]))
			}
			for j := range want[i] {
				d := math.Abs(float64(got[i][j]) - want[i][j])
				worst = max(worst, d)
				if !(d <= torchLogprobTol) {
					t.Errorf("%s seq %d pos %d: Go %v, torch %v", name, i, j, got[i][j], want[i][j])
				}
			}
		}
		t.Logf("%s: max |Go − torch| log-prob %.3g", name, worst)
	}
	if !c.skipBase {
		base, err := e.Logprobs(ctx, c.seqs, true)
		if err != nil {
			t.Fatal(err)
		}
		cmpLogprobs("base", base, runTorch(t, py, torchRequest{ModelDir: c.model, Seqs: c.seqs}).Logprobs)
	}

	// Weights in [−1, 1], some zero (backward skips those rows), position 0
	// included (its log-prob is the constant 0 on both sides).
	r := rand.New(rand.NewPCG(uint64(len(c.seqs)), 2))
	weights := make([][]float64, len(c.seqs))
	for i, s := range c.seqs {
		weights[i] = make([]float64, len(s))
		for j := range s {
			if r.IntN(4) != 0 {
				weights[i][j] = 2*r.Float64() - 1
			}
		}
	}
	res := runTorch(t, py, torchRequest{ModelDir: c.model, AdapterDir: &c.adapter, Seqs: c.seqs, LossWeights: weights})
	withAd, err := e.Logprobs(ctx, c.seqs, false)
	if err != nil {
		t.Fatal(err)
	}
	cmpLogprobs("adapter", withAd, res.Logprobs)

	// The Go gradient, as TrainStep computes it (grad_test.go's end-to-end
	// check does the same).
	run := e.runner(false)
	grad := make([]float32, len(e.ad.params))
	for i, s := range c.seqs {
		if len(s) < 2 {
			continue
		}
		sa := run.forward(s, true)
		run.logprobs(sa, make([]float64, len(s)), nil, nil)
		run.backward(sa, weights[i], nil, nil, grad)
	}
	goNames := map[string]bool{}
	var worst float64
	worstName := ""
	for l := range e.ad.slots {
		for m := module(0); m < numModules; m++ {
			if !e.ad.slots[l][m].on {
				continue
			}
			for _, ab := range []struct {
				name string
				g    []float32
			}{{"A", e.ad.A(grad, l, m)}, {"B", e.ad.B(grad, l, m)}} {
				name := tensorName(l, m, ab.name)
				goNames[name] = true
				want, ok := res.Grads[name]
				if !ok {
					t.Errorf("torch has no gradient for %s", name)
					continue
				}
				if len(want) != len(ab.g) {
					t.Errorf("%s: %d gradient components, torch %d", name, len(ab.g), len(want))
					continue
				}
				var scale, d float64
				for i, w := range want {
					scale = max(scale, math.Abs(w))
					d = max(d, math.Abs(float64(ab.g[i])-w))
				}
				if rel := d / scale; rel > worst || worstName == "" {
					worst, worstName = rel, name
				}
				if !(d <= torchGradTol*scale) {
					t.Errorf("%s: max |Go − torch| %.3g, largest component %.3g", name, d, scale)
				}
			}
		}
	}
	for n := range res.Grads {
		if !goNames[n] {
			t.Errorf("torch has a gradient for %s, which the Go adapter lacks", n)
		}
	}
	t.Logf("gradients of %d tensors: max |Go − torch| / largest component %.3g (%s)", len(goNames), worst, worstName)
}
