package peft_test

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/llamacpp"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/modeldir"
)

// tinyModelDir writes the tiny Qwen3 model (random weights, the tiny
// tokenizer, a tokenizer_config.json naming Qwen3's special tokens) to a
// new directory.
func tinyModelDir(t *testing.T) (string, native.Config) {
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

type probeLoRA struct {
	Path  string  `json:"path"`
	Scale float64 `json:"scale"`
}

type probeCase struct {
	LoRAs   []probeLoRA `json:"loras"`
	Prompts [][]int     `json:"prompts"`
}

// probe runs llama.cpp (internal/llamacpp's probe.mjs) on model with each
// case's adapters and returns the next-token log-probabilities after each
// prompt.
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

// maxDiff is the largest difference of two sets of next-token
// log-probabilities.
func maxDiff(t *testing.T, a, b [][]float64) float64 {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d distributions against %d", len(a), len(b))
	}
	var d float64
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

// TestStackLlamaCpp runs real llama.cpp on the tiny model exported to GGUF
// (F32) twice: with the two adapters' GGUFs loaded together, and with the
// stacked adapter's GGUF alone. The next-token log-probabilities agree to
// float32 rounding in another order of summation (measured 5e-6; the
// tolerance is 1e-4), while each adapter moves them by far more (asserted).
// Skipped unless internal/llamacpp's node_modules is installed;
// CLAWMESH_REQUIRE_LLAMACPP=1 makes it required.
func TestStackLlamaCpp(t *testing.T) {
	node := llamacpp.Require(t)
	dir, cfg := tinyModelDir(t)
	a, b := twoAdapters(t, shapeOf(cfg))
	out := stackInto(t, a, b)
	work := t.TempDir()
	model := filepath.Join(work, "tiny.gguf")
	if err := gguf.ExportBase(dir, model, gguf.BaseOptions{}); err != nil {
		t.Fatal(err)
	}
	lora := func(name, src string) probeLoRA {
		t.Helper()
		p := filepath.Join(work, name+".gguf")
		if err := gguf.ExportLoRA(src, p, gguf.LoRAOptions{Arch: gguf.ArchQwen3}); err != nil {
			t.Fatal(err)
		}
		return probeLoRA{Path: p, Scale: 1}
	}
	la, lb, ls := lora("a", a), lora("b", b), lora("stacked", out)
	prompts := [][]int{{1, 2, 3}, {cfg.VocabSize - 8, 40, 41, 300, 7, 9}, {100}}
	got := probe(t, node, model, []probeCase{
		{Prompts: prompts},
		{LoRAs: []probeLoRA{la}, Prompts: prompts},
		{LoRAs: []probeLoRA{la, lb}, Prompts: prompts},
		{LoRAs: []probeLoRA{ls}, Prompts: prompts},
	})
	base, onlyA, both, stacked := got[0], got[1], got[2], got[3]
	const tol = 1e-4
	d := maxDiff(t, stacked, both)
	t.Logf("llama.cpp: stacked against both adapters loaded: max |Δ log p| %.2e (tolerance %g)", d, tol)
	if d > tol {
		t.Errorf("llama.cpp: the stacked adapter differs from the two loaded together by %.3g in log-probability", d)
	}
	if d := maxDiff(t, onlyA, base); d < 100*tol {
		t.Errorf("adapter a moves llama.cpp's log-probabilities by only %.3g", d)
	}
	if d := maxDiff(t, both, onlyA); d < 100*tol {
		t.Errorf("adapter b moves llama.cpp's log-probabilities by only %.3g", d)
	}
}
