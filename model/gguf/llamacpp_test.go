package gguf_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/llamacpp"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// tinyModel writes the tiny Qwen3 model (random weights, the tiny
// tokenizer, a tokenizer_config.json as Qwen3's names its special tokens
// and template) to a new directory and returns it with its shape.
func tinyModel(t *testing.T) (string, native.Config) {
	t.Helper()
	text, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "tiny-qwen3")
	if err := native.CreateTiny(dir, cfg, 7); err != nil {
		t.Fatal(err)
	}
	if err := text.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
		t.Fatal(err)
	}
	tc, _ := json.Marshal(map[string]any{
		"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": nil,
		"add_bos_token": false, "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
	})
	if err := os.WriteFile(filepath.Join(dir, modeldir.TokenizerConfigFile), tc, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

// moduleDims are a projection's (out, in) in a model of shape c.
func moduleDims(c native.Config, m string) (int, int) {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	switch m {
	case "q_proj":
		return q, c.Hidden
	case "k_proj", "v_proj":
		return kv, c.Hidden
	case "o_proj":
		return c.Hidden, q
	case "gate_proj", "up_proj":
		return c.Intermediate, c.Hidden
	case "down_proj":
		return c.Hidden, c.Intermediate
	}
	panic(m)
}

var allTargets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

// writePEFT writes a PEFT adapter for a model of shape c whose A and B are
// both random (B nonzero, so the adapter changes the model), stored as dt.
func writePEFT(t testing.TB, dir string, c native.Config, rank int, alpha float64, rslora bool, targets []string, dt safetensors.DType, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 99))
	var ts []safetensors.Tensor
	for l := range c.Layers {
		for _, m := range targets {
			out, in := moduleDims(c, m)
			part := "self_attn"
			if strings.Contains(m, "_proj") && (m == "gate_proj" || m == "up_proj" || m == "down_proj") {
				part = "mlp"
			}
			for _, ab := range []struct {
				name  string
				shape []int
				scale float64
			}{{"A", []int{rank, in}, 1 / math.Sqrt(float64(in))}, {"B", []int{out, rank}, 0.5 / math.Sqrt(float64(rank))}} {
				v := make([]float32, ab.shape[0]*ab.shape[1])
				for i := range v {
					v[i] = float32(r.NormFloat64() * ab.scale)
				}
				name := fmt.Sprintf("base_model.model.model.layers.%d.%s.%s.lora_%s.weight", l, part, m, ab.name)
				tn, err := safetensors.F32Tensor(name, dt, ab.shape, v)
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
	if err := safetensors.WriteFile(filepath.Join(dir, gguf.AdapterWeightsFile), ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	cb, _ := json.Marshal(map[string]any{
		"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "target_modules": targets,
		"base_model_name_or_path": "Qwen/Qwen3-0.6B", "bias": "none", "use_rslora": rslora, "use_dora": false,
		"fan_in_fan_out": false, "rank_pattern": map[string]any{}, "alpha_pattern": map[string]any{},
	})
	if err := os.WriteFile(filepath.Join(dir, gguf.AdapterConfigFile), cb, 0o644); err != nil {
		t.Fatal(err)
	}
}

// trainAdapter trains the engine's adapter a few steps towards sequences
// of the prompts and writes it, as a version is, to dir.
func trainAdapter(t *testing.T, e *native.Engine, prompts [][]int, dir string) {
	t.Helper()
	ctx := context.Background()
	var batch []engine.TrainSample
	for _, p := range prompts {
		if len(p) < 2 {
			continue
		}
		s := engine.TrainSample{Tokens: p, LossMask: make([]bool, len(p)), Advantages: make([]float32, len(p))}
		for i := 1; i < len(p); i++ {
			s.LossMask[i], s.Advantages[i] = true, 1
		}
		batch = append(batch, s)
	}
	for range 5 {
		if _, err := e.TrainStep(ctx, batch, engine.Recipe{LR: 2e-2}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.ExportAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
}

// nativeNext returns the native engine's next-token log-probabilities after
// each prompt, over the whole vocabulary (from the log-prob of each token
// appended to the prompt).
func nativeNext(t *testing.T, e *native.Engine, prompts [][]int, base bool) [][]float64 {
	t.Helper()
	vocab := e.Info().VocabSize
	out := make([][]float64, len(prompts))
	for i, p := range prompts {
		seqs := make([][]int, vocab)
		for tok := range vocab {
			seqs[tok] = append(append([]int(nil), p...), tok)
		}
		lps, err := e.Logprobs(context.Background(), seqs, base)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = make([]float64, vocab)
		for tok := range vocab {
			out[i][tok] = float64(lps[tok][len(p)])
		}
	}
	return out
}

type probeLoRA struct {
	Path  string  `json:"path"`
	Scale float64 `json:"scale"`
}

type probeCase struct {
	LoRAs   []probeLoRA `json:"loras"`
	Prompts [][]int     `json:"prompts"`
}

// probe runs llama.cpp on model with each case's adapters and returns the
// next-token log-probabilities after each prompt.
func probe(t *testing.T, node, model string, cases []probeCase) [][][]float64 {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"model": model, "cases": cases})
	rp := filepath.Join(t.TempDir(), "probe.json")
	if err := os.WriteFile(rp, req, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, llamacpp.Probe(), rp)
	cmd.Dir = llamacpp.Dir()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("llama.cpp probe: %v\n%s", err, stderr.String())
	}
	var res struct {
		Vocab int `json:"vocab"`
		Cases []struct {
			Probs [][]float64 `json:"probs"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("probe output: %v\n%.300s", err, out)
	}
	if len(res.Cases) != len(cases) {
		t.Fatalf("probe answered %d cases of %d", len(res.Cases), len(cases))
	}
	lps := make([][][]float64, len(cases))
	for i, c := range res.Cases {
		for _, p := range c.Probs {
			lp := make([]float64, len(p))
			for j, v := range p {
				lp[j] = math.Log(v)
			}
			lps[i] = append(lps[i], lp)
		}
	}
	return lps
}

// maxTV is the largest total variation distance (half the sum of the
// absolute differences of the probabilities) between two sets of
// next-token distributions given as log-probabilities.
func maxTV(a, b [][]float64) float64 {
	var d float64
	for i := range a {
		var s float64
		for j := range a[i] {
			s += math.Abs(math.Exp(a[i][j]) - math.Exp(b[i][j]))
		}
		d = max(d, s/2)
	}
	return d
}

// maxDiff is the largest difference of two sets of next-token
// log-probabilities.
func maxDiff(t *testing.T, a, b [][]float64) float64 {
	t.Helper()
	var d float64
	if len(a) != len(b) {
		t.Fatalf("%d distributions against %d", len(a), len(b))
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			t.Fatalf("a distribution over %d tokens against one over %d", len(a[i]), len(b[i]))
		}
		for j := range a[i] {
			d = max(d, math.Abs(a[i][j]-b[i][j]))
		}
	}
	return d
}

// TestLlamaCppMatchesNative exports the tiny Qwen3 model and adapters of
// it to GGUF and checks that real llama.cpp gives the next-token
// distributions the native engine gives, with and without each adapter:
// two with random nonzero B (one rsLoRA on three projections, applied at
// scale 0.5), one trained five steps by the engine.
//
// Two measures, each the largest over three prompts: the largest
// difference of a next-token log-probability over the whole vocabulary,
// and the total variation distance. The F32 export is compared with the
// engine on the original weights: only float32 rounding in another order
// of summation remains (the probe gives llama.cpp an F32 KV cache), about
// 1e-5 in log-probability and 1e-6 in total variation; the tolerances are
// ten times that. An F16, BF16 or Q8_0 export is compared with the engine
// on its weights as they read back (so the export's rounding is not
// counted twice): what remains is llama.cpp's rounding of the activations
// it multiplies those weights by (to F16, BF16 or Q8_0 blocks), measured
// at 6e-3, 8e-2 and 0.25 in log-probability, 1e-3, 8e-3 and 3e-2 in total
// variation; the tolerances are two to three times that. A wrong layout,
// orientation, name or scale moves the distribution by far more: each
// adapter changes it by more than ten times every tolerance (asserted),
// so the test cannot pass with an adapter ignored or scaled wrongly.
// version is an adapter and the scale llama.cpp applies it at.
type version struct {
	name  string
	dir   string
	scale float64
}

// expected returns the native engine's next-token log-probabilities after
// each prompt, for the base model ("base") and with each version.
func expected(t *testing.T, e *native.Engine, prompts [][]int, versions []version, work string) map[string][][]float64 {
	t.Helper()
	ctx := context.Background()
	want := map[string][][]float64{"base": nativeNext(t, e, prompts, true)}
	for _, v := range versions {
		dir := v.dir
		if v.scale != 1 {
			// llama.cpp's scale multiplies the adapter's delta; the engine
			// has none, so the adapter's alpha is scaled instead.
			dir = filepath.Join(work, v.name)
			rescale(t, v.dir, dir, v.scale)
		}
		if err := e.LoadAdapter(ctx, dir); err != nil {
			t.Fatal(err)
		}
		want[v.name] = nativeNext(t, e, prompts, false)
	}
	return want
}

func TestLlamaCppMatchesNative(t *testing.T) {
	node := llamacpp.Require(t)
	dir, cfg := tinyModel(t)
	ctx := context.Background()
	e, err := native.Open(ctx, dir, native.Options{LoRA: native.LoRAConfig{Rank: 8, Alpha: 16}, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompts := [][]int{{1, 2, 3}, {cfg.VocabSize - 8, 40, 41, 300, 7, 9}, {100}}

	// The versions: two with random nonzero B (one rsLoRA on a subset of
	// the projections, applied at scale 0.5), one trained by the engine.
	work := t.TempDir()
	versions := []version{
		{"random", filepath.Join(work, "random"), 1},
		{"rslora-subset", filepath.Join(work, "rslora"), 0.5},
		{"trained", filepath.Join(work, "trained"), 1},
	}
	writePEFT(t, versions[0].dir, cfg, 8, 16, false, allTargets, safetensors.F32, 1)
	writePEFT(t, versions[1].dir, cfg, 4, 6, true, []string{"q_proj", "v_proj", "down_proj"}, safetensors.BF16, 2)
	trainAdapter(t, e, prompts, versions[2].dir)

	want := expected(t, e, prompts, versions, filepath.Join(work, "scaled"))
	for _, c := range []struct {
		typ          gguf.TensorType
		tolLP, tolTV float64
	}{
		{gguf.TypeF32, 1e-4, 1e-5},
		{gguf.TypeF16, 2e-2, 3e-3},
		{gguf.TypeBF16, 0.2, 2.5e-2},
		{gguf.TypeQ8_0, 0.6, 8e-2},
	} {
		t.Run(c.typ.String(), func(t *testing.T) {
			model := filepath.Join(work, "tiny-"+c.typ.String()+".gguf")
			if err := gguf.ExportBase(dir, model, gguf.BaseOptions{Type: c.typ}); err != nil {
				t.Fatal(err)
			}
			cases := []probeCase{{Prompts: prompts}}
			for _, v := range versions {
				out := filepath.Join(work, v.name+"-"+c.typ.String()+".gguf")
				if err := gguf.ExportLoRA(v.dir, out, gguf.LoRAOptions{Type: c.typ}); err != nil {
					t.Fatal(err)
				}
				cases = append(cases, probeCase{LoRAs: []probeLoRA{{out, v.scale}}, Prompts: prompts})
			}
			got := probe(t, node, model, cases)
			ref := want
			if c.typ != gguf.TypeF32 {
				ref = readBackExpected(t, dir, model, versions, c.typ, prompts)
			}
			check := func(name string, got, want [][]float64) {
				t.Helper()
				lp, tv := maxDiff(t, got, want), maxTV(got, want)
				t.Logf("%s %s: max |Δ log p| %.2e (tolerance %.0e), total variation %.2e (tolerance %.0e)", c.typ, name, lp, c.tolLP, tv, c.tolTV)
				if lp > c.tolLP || tv > c.tolTV {
					t.Errorf("%s %s: llama.cpp differs from the native engine by %.3g in log-probability, %.3g in total variation; tolerances %.3g, %.3g",
						c.typ, name, lp, tv, c.tolLP, c.tolTV)
				}
			}
			check("base", got[0], ref["base"])
			for i, v := range versions {
				check(v.name, got[i+1], ref[v.name])
				lp, tv := maxDiff(t, want[v.name], want["base"]), maxTV(want[v.name], want["base"])
				if lp < 10*c.tolLP || tv < 10*c.tolTV {
					t.Errorf("%s: the adapter changes log-probabilities by only %.3g and total variation by %.3g, not far above the tolerances", v.name, lp, tv)
				}
			}
		})
	}
	for _, v := range versions {
		t.Logf("%s: the adapter moves log-probabilities by up to %.3g, total variation %.3g", v.name,
			maxDiff(t, want[v.name], want["base"]), maxTV(want[v.name], want["base"]))
	}
}

// readBackExpected is expected for the weights of the exported GGUF files
// as they read back (rounded to typ): a native engine on the base model
// read back from model, with the adapters read back from their exports.
func readBackExpected(t *testing.T, modelDir, model string, versions []version, typ gguf.TensorType, prompts [][]int) map[string][][]float64 {
	t.Helper()
	work := t.TempDir()
	base := filepath.Join(work, "model")
	copyFiles(t, modelDir, base, "config.json", modeldir.TokenizerFile)
	readBack(t, model, filepath.Join(base, "model.safetensors"), func(n string) string {
		return hfName(t, strings.TrimSuffix(n, ".weight")) + ".weight"
	})
	var back []version
	for _, v := range versions {
		out := filepath.Join(work, v.name+".gguf")
		if err := gguf.ExportLoRA(v.dir, out, gguf.LoRAOptions{Type: typ}); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(work, v.name)
		copyFiles(t, v.dir, dir, gguf.AdapterConfigFile)
		readBack(t, out, filepath.Join(dir, gguf.AdapterWeightsFile), func(n string) string {
			stem, ab, _ := strings.Cut(n, ".weight.lora_")
			return "base_model.model." + hfName(t, stem) + ".lora_" + strings.ToUpper(ab) + ".weight"
		})
		back = append(back, version{v.name, dir, v.scale})
	}
	e, err := native.Open(context.Background(), base, native.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	return expected(t, e, prompts, back, filepath.Join(work, "scaled"))
}

// hfNames maps llama.cpp's per-layer tensor names back to Hugging Face's.
var hfNames = map[string]string{
	"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
	"attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
	"attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
	"ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}

// hfName maps a llama.cpp tensor name (less its ".weight") back.
func hfName(t *testing.T, name string) string {
	t.Helper()
	switch name {
	case "token_embd":
		return "model.embed_tokens"
	case "output_norm":
		return "model.norm"
	case "output":
		return "lm_head"
	}
	parts := strings.SplitN(name, ".", 3) // blk, N, tensor
	if len(parts) != 3 || parts[0] != "blk" || hfNames[parts[2]] == "" {
		t.Fatalf("unexpected tensor %q", name)
	}
	return "model.layers." + parts[1] + "." + hfNames[parts[2]]
}

// readBack decodes every tensor of the GGUF file at path to float32 and
// writes them, under Hugging Face's names, to dst as safetensors: the
// weights llama.cpp computes with, for the native engine to run.
func readBack(t *testing.T, path, dst string, name func(string) string) {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []safetensors.Tensor
	for _, ti := range f.Tensors {
		v, _, err := f.TensorFloat32(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		shape := make([]int, len(ti.Shape))
		for i, d := range ti.Shape {
			shape[len(shape)-1-i] = int(d)
		}
		tn, err := safetensors.F32Tensor(name(ti.Name), safetensors.F32, shape, v)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tn)
	}
	if err := safetensors.WriteFile(dst, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
}

// copyFiles copies the named files of src into dst.
func copyFiles(t *testing.T, src, dst string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// rescale copies the PEFT adapter in src to dst with its alpha times s.
func rescale(t *testing.T, src, dst string, s float64) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(src, gguf.AdapterWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, gguf.AdapterWeightsFile), w, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(src, gguf.AdapterConfigFile))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["lora_alpha"] = cfg["lora_alpha"].(float64) * s
	b, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dst, gguf.AdapterConfigFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}
