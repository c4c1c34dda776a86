package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/clawmesh/clawmesh/internal/llamacpp"
	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/modeldir"
)

// TestWeightsExportLlamaCpp: what `weights export` writes, real llama.cpp
// runs: the tiny base as a GGUF model, and an installed version as a LoRA
// adapter on it, give the next-token distributions the native engine gives
// for the base and for the version (F32, so to float rounding).
func TestWeightsExportLlamaCpp(t *testing.T) {
	node := llamacpp.Require(t)
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG"} {
		t.Setenv(v, "")
	}
	data := t.TempDir()
	d1, _ := tinyAdapter(t, 0.05)
	keepVersion(t, data, d1, 1, true)
	out := t.TempDir()
	model, lora := filepath.Join(out, "tiny.gguf"), filepath.Join(out, "v1.gguf")
	cli(t, "weights", "export", "base", "--format", "gguf", "--type", "f32", "--out", model, "--data", data)
	cli(t, "weights", "export", "v1", "--format", "gguf", "--out", lora, "--data", data)

	prompts := [][]int{{1, 2, 3}, {40, 41, 300, 7}}
	res := llamaProbe(t, node, model, prompts, lora)
	// The native engine on the base the trainers build (the mesh's seed,
	// 1), then with the installed version.
	_, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	e, err := native.NewTiny(cfg, 1, native.Options{Name: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	next := func(base bool) [][]float64 {
		out := make([][]float64, len(prompts))
		for i, p := range prompts {
			seqs := make([][]int, cfg.VocabSize)
			for tok := range seqs {
				seqs[tok] = append(append([]int(nil), p...), tok)
			}
			lps, err := e.Logprobs(context.Background(), seqs, base)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = make([]float64, cfg.VocabSize)
			for tok := range out[i] {
				out[i][tok] = float64(lps[tok][len(p)])
			}
		}
		return out
	}
	wantBase := next(true)
	if err := e.LoadAdapter(context.Background(), filepath.Join(data, "adapters", "v1")); err != nil {
		t.Fatal(err)
	}
	wantV1 := next(false)
	maxDiff := func(probs [][]float64, lps [][]float64) float64 {
		var m float64
		for i := range lps {
			if len(probs[i]) != len(lps[i]) {
				t.Fatalf("llama.cpp's vocabulary is %d, the engine's %d", len(probs[i]), len(lps[i]))
			}
			for tok, lp := range lps[i] {
				m = max(m, math.Abs(math.Log(max(probs[i][tok], 1e-30))-lp))
			}
		}
		return m
	}
	shift := 0.0
	for i := range wantBase {
		for tok := range wantBase[i] {
			shift = max(shift, math.Abs(wantV1[i][tok]-wantBase[i][tok]))
		}
	}
	db, dv := maxDiff(res[0], wantBase), maxDiff(res[1], wantV1)
	t.Logf("max |Δ log p|: base %.2e, v1 %.2e; v1 moves the base's by %.2e", db, dv, shift)
	if db > 1e-3 || dv > 1e-3 {
		t.Fatalf("llama.cpp differs from the native engine: base %.3g, v1 %.3g in log-probability", db, dv)
	}
	if shift < 1e-2 {
		t.Fatalf("the version moves log-probabilities by only %.3g: the check shows nothing", shift)
	}
}

// llamaProbe runs real llama.cpp on model: the next-token distributions
// after each prompt, with no adapter, then with each adapter in loras.
func llamaProbe(t *testing.T, node, model string, prompts [][]int, loras ...string) [][][]float64 {
	t.Helper()
	cases := []any{map[string]any{"prompts": prompts}}
	for _, l := range loras {
		cases = append(cases, map[string]any{"loras": []any{map[string]any{"path": l, "scale": 1}}, "prompts": prompts})
	}
	req, _ := json.Marshal(map[string]any{"model": model, "cases": cases})
	rp := filepath.Join(t.TempDir(), "req.json")
	os.WriteFile(rp, req, 0o600)
	cmd := exec.Command(node, llamacpp.Probe(), rp)
	cmd.Dir = llamacpp.Dir()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("llama.cpp: %v\n%s", err, stderr.String())
	}
	var res struct {
		Cases []struct {
			Probs [][]float64 `json:"probs"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.Cases) != len(cases) {
		t.Fatalf("llama.cpp's answer: %v", err)
	}
	out := make([][][]float64, len(res.Cases))
	for i, c := range res.Cases {
		out[i] = c.Probs
	}
	return out
}

// TestSetupOllamaLlamaCpp: the GGUF setup ollama finds in Ollama's store
// (here the tiny base, quantized to Q8_0 as Ollama's models are
// quantized) is the mesh's base by its identity, and real llama.cpp runs
// it with a version exported as GGUF, as llama-server will.
func TestSetupOllamaLlamaCpp(t *testing.T) {
	node := llamacpp.Require(t)
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG", "CLAWMESH_SERVE_BIN"} {
		t.Setenv(v, "")
	}
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	tiny := filepath.Join(t.TempDir(), "tiny")
	if err := native.CreateTiny(tiny, cfg, 1); err != nil {
		t.Fatal(err)
	}
	if err := txt.Tokenizer.Save(filepath.Join(tiny, modeldir.TokenizerFile)); err != nil {
		t.Fatal(err)
	}
	g := filepath.Join(t.TempDir(), "tiny-q8_0.gguf")
	if err := gguf.ExportBase(tiny, g, gguf.BaseOptions{Type: gguf.TypeQ8_0}); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "models")
	t.Setenv("OLLAMA_MODELS", store)
	blob := putOllamaModel(t, store, "tiny:q8_0", g)

	data := t.TempDir()
	d1, _ := tinyAdapter(t, 0.05)
	keepVersion(t, data, d1, 1, true)
	out := cli(t, "setup", "ollama", "--model", "tiny:q8_0", "--data", data)
	if !strings.Contains(out, "Q8_0") || strings.Contains(out, "WARNING") {
		t.Errorf("setup does not name the quantization, or warns of the mesh's own base: %s", out)
	}
	var fc fileConfig
	if _, err := toml.DecodeFile(filepath.Join(data, "config.toml"), &fc); err != nil {
		t.Fatal(err)
	}
	if fc.Model != blob || fc.Serve != "llama-server" {
		t.Fatalf("config: serve %q, model %q; want the blob %s", fc.Serve, fc.Model, blob)
	}
	served, err := baseid.FromGGUF(fc.Model)
	if err != nil {
		t.Fatal(err)
	}
	trained, err := baseid.FromAdapter(filepath.Join(data, "adapters", "v1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := baseid.Same(trained, served); err != nil {
		t.Fatalf("Ollama's tiny and the version's base: %v", err)
	}

	lora := filepath.Join(t.TempDir(), "v1.gguf")
	cli(t, "weights", "export", "v1", "--format", "gguf", "--out", lora, "--data", data)
	res := llamaProbe(t, node, fc.Model, [][]int{{1, 2, 3}}, lora)
	var shift float64
	for c := range res {
		var sum float64
		for _, p := range res[c][0] {
			sum += p
		}
		if len(res[c][0]) != cfg.VocabSize || math.Abs(sum-1) > 1e-3 {
			t.Fatalf("case %d: %d probabilities summing to %v", c, len(res[c][0]), sum)
		}
	}
	for tok := range res[0][0] {
		shift = max(shift, math.Abs(res[1][0][tok]-res[0][0][tok]))
	}
	if shift < 1e-3 {
		t.Fatalf("the version changes llama.cpp's distribution by only %.3g", shift)
	}
}
