package mlx_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/mlx/mlxtest"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// tinyModel writes the tiny model to a new directory.
func tinyModel(t *testing.T) (string, native.Config) {
	t.Helper()
	_, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "model")
	if err := native.CreateTiny(dir, cfg, 11); err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

// peftAdapter writes a PEFT adapter for the tiny model with the native
// engine's own writer, then draws its B matrices at random (the fresh
// adapter's are zero), so that it changes the model; dt is the dtype the
// tensors are stored in.
func peftAdapter(t *testing.T, cfg native.Config, lc native.LoRAConfig, rslora bool, dt safetensors.DType, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "peft")
	if err := native.WriteFreshAdapter(dir, cfg, lc, seed, "tiny"); err != nil {
		t.Fatal(err)
	}
	wp := filepath.Join(dir, mlx.PEFTWeightsFile)
	f, err := safetensors.ReadFile(wp)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	var ts []safetensors.Tensor
	for _, name := range f.Names() {
		v, shape, err := f.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(name, "lora_B") {
			for i := range v {
				v[i] = float32(r.NormFloat64() * 0.05)
			}
		}
		tn, err := safetensors.F32Tensor(name, dt, shape, v)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tn)
	}
	if err := safetensors.WriteFile(wp, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if rslora {
		editJSON(t, filepath.Join(dir, mlx.PEFTConfigFile), func(m map[string]any) { m["use_rslora"] = true })
	}
	return dir
}

func editJSON(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// nextToken returns the probability of every token after prompt.
func nextToken(t *testing.T, e *native.Engine, prompt []int, base bool) []float64 {
	t.Helper()
	vocab := e.Info().VocabSize
	seqs := make([][]int, vocab)
	for v := range seqs {
		seqs[v] = append(append([]int(nil), prompt...), v)
	}
	lps, err := e.Logprobs(context.Background(), seqs, base)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, vocab)
	for v, lp := range lps {
		out[v] = math.Exp(float64(lp[len(lp)-1]))
	}
	return out
}

func maxDiff(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

func open(t *testing.T, dir string) *native.Engine {
	t.Helper()
	e, err := native.Open(context.Background(), dir, native.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestExportFollowsMLX checks the layout against the native engine: the
// next-token distribution of the native engine running the PEFT adapter
// equals, to 1e-5 in every token's probability, that of the base model with the weights that mlx-lm's
// loading code (as mlx.Read follows it: names, transposes, scale) rebuilds
// from the exported directory merged in, while the adapter moves it by far
// more. A wrong scale or a missing transpose fails it.
func TestExportFollowsMLX(t *testing.T) {
	modelDir, cfg := tinyModel(t)
	base := open(t, modelDir)
	prompts := [][]int{{1, 2, 3}, {7, 40, 9, 12, 5}}
	for _, c := range []struct {
		name   string
		lc     native.LoRAConfig
		rslora bool
		dt     safetensors.DType
	}{
		{"all projections", native.LoRAConfig{Rank: 4, Alpha: 8}, false, safetensors.F32},
		{"some projections, rsLoRA", native.LoRAConfig{Rank: 8, Alpha: 4, Targets: []string{"q_proj", "v_proj", "down_proj"}}, true, safetensors.F32},
		{"bf16", native.LoRAConfig{Rank: 2, Alpha: 7, Targets: []string{"o_proj", "gate_proj", "up_proj", "k_proj"}}, false, safetensors.BF16},
	} {
		t.Run(c.name, func(t *testing.T) {
			peft := peftAdapter(t, cfg, c.lc, c.rslora, c.dt, 5)
			withPEFT := open(t, modelDir)
			if err := withPEFT.LoadAdapter(context.Background(), peft); err != nil {
				t.Fatal(err)
			}

			out := filepath.Join(t.TempDir(), "mlx")
			if err := mlx.Export(peft, out); err != nil {
				t.Fatal(err)
			}
			ad, err := mlx.Read(out)
			if err != nil {
				t.Fatal(err)
			}
			m, _, err := mlxtest.ReadModel(modelDir)
			if err != nil {
				t.Fatal(err)
			}
			if err := ad.Check(m.Layers, m.Dims); err != nil {
				t.Fatal(err)
			}
			wantScale := c.lc.Alpha / float64(c.lc.Rank)
			if c.rslora {
				wantScale = c.lc.Alpha / math.Sqrt(float64(c.lc.Rank))
			}
			lp := ad.Config.LoRAParameters
			if lp.Scale != wantScale || lp.Rank != c.lc.Rank || ad.Config.NumLayers != mlx.AllLayers || ad.Config.FineTuneType != "lora" {
				t.Fatalf("config %+v, want rank %d scale %g on all layers", ad.Config, c.lc.Rank, wantScale)
			}
			targets := c.lc.Targets
			if targets == nil {
				targets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
			}
			if len(lp.Keys) != len(targets) || len(ad.Modules) != len(targets)*cfg.Layers {
				t.Fatalf("keys %v and %d modules for targets %v", lp.Keys, len(ad.Modules), targets)
			}
			f, err := safetensors.ReadFile(filepath.Join(out, mlx.WeightsFile))
			if err != nil {
				t.Fatal(err)
			}
			for _, ti := range f.Tensors {
				if ti.DType != c.dt {
					t.Fatalf("exported %s, want the adapter's %s", ti.DType, c.dt)
				}
			}

			merged := filepath.Join(t.TempDir(), "merged")
			if err := mlxtest.Merge(modelDir, out, merged); err != nil {
				t.Fatal(err)
			}
			fused := open(t, merged)
			for _, p := range prompts {
				want := nextToken(t, withPEFT, p, false)
				got := nextToken(t, fused, p, true)
				if d := maxDiff(got, want); d > 1e-5 {
					t.Errorf("prompt %v: the mlx-lm adapter's next-token probabilities differ from PEFT's by %g", p, d)
				}
				if d := maxDiff(nextToken(t, base, p, true), want); d < 1e-2 {
					t.Errorf("prompt %v: the adapter moves the probabilities by only %g", p, d)
				}
			}

			// Read as mlx-lm would with the scale a reader mistaking it for
			// an alpha would write: the distribution no longer matches.
			editJSON(t, filepath.Join(out, mlx.ConfigFile), func(m map[string]any) {
				m["lora_parameters"].(map[string]any)["scale"] = c.lc.Alpha
			})
			wrong := filepath.Join(t.TempDir(), "wrong")
			if err := mlxtest.Merge(modelDir, out, wrong); err != nil {
				t.Fatal(err)
			}
			if d := maxDiff(nextToken(t, open(t, wrong), prompts[0], true), nextToken(t, withPEFT, prompts[0], false)); d < 1e-3 {
				t.Errorf("a scale of lora_alpha matches PEFT to %g: the check cannot see the scale", d)
			}
		})
	}
}

// TestExportRefuses checks that what mlx-lm's LoRALinear cannot express is
// refused with ErrUnsupported naming it, and a broken adapter with ErrPEFT.
func TestExportRefuses(t *testing.T) {
	_, cfg := tinyModel(t)
	for _, c := range []struct {
		name string
		edit func(t *testing.T, dir string)
		want error
		says string
	}{
		{"dora", func(t *testing.T, dir string) { setConfig(t, dir, "use_dora", true) }, mlx.ErrUnsupported, "use_dora"},
		{"bias", func(t *testing.T, dir string) { setConfig(t, dir, "bias", "lora_only") }, mlx.ErrUnsupported, "bias"},
		{"rank pattern", func(t *testing.T, dir string) {
			setConfig(t, dir, "rank_pattern", map[string]int{"q_proj": 16})
		}, mlx.ErrUnsupported, "rank_pattern"},
		{"modules to save", func(t *testing.T, dir string) { setConfig(t, dir, "modules_to_save", []string{"lm_head"}) }, mlx.ErrUnsupported, "modules_to_save"},
		{"lm head", func(t *testing.T, dir string) {
			addTensor(t, dir, "base_model.model.lm_head.lora_A.weight", []int{2, 64})
		}, mlx.ErrUnsupported, "lm_head"},
		{"embedding", func(t *testing.T, dir string) {
			addTensor(t, dir, "base_model.model.model.embed_tokens.lora_embedding_A", []int{2, 64})
		}, mlx.ErrUnsupported, "embedding"},
		{"unpaired", func(t *testing.T, dir string) {
			addTensor(t, dir, "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", []int{2, 64})
		}, mlx.ErrPEFT, "mlp.up_proj"},
		{"no config", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, mlx.PEFTConfigFile)) }, mlx.ErrPEFT, "adapter_config.json"},
		{"not finite", func(t *testing.T, dir string) {
			name := "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
			f, err := safetensors.ReadFile(filepath.Join(dir, mlx.PEFTWeightsFile))
			if err != nil {
				t.Fatal(err)
			}
			var ts []safetensors.Tensor
			for _, n := range f.Names() {
				v, shape, _ := f.Float32(n)
				if n == name {
					v[3] = float32(math.Inf(1))
				}
				tn, _ := safetensors.F32Tensor(n, safetensors.F32, shape, v)
				ts = append(ts, tn)
			}
			if err := safetensors.WriteFile(filepath.Join(dir, mlx.PEFTWeightsFile), ts, nil); err != nil {
				t.Fatal(err)
			}
		}, mlx.ErrPEFT, "lora_B.weight is not finite"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := peftAdapter(t, cfg, native.LoRAConfig{Rank: 2, Targets: []string{"q_proj"}}, false, safetensors.F32, 1)
			c.edit(t, dir)
			out := filepath.Join(t.TempDir(), "mlx")
			err := mlx.Export(dir, out)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Export: %v, want %v saying %q", err, c.want, c.says)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused export left %s", out)
			}
		})
	}
}

func setConfig(t *testing.T, dir, key string, v any) {
	editJSON(t, filepath.Join(dir, mlx.PEFTConfigFile), func(m map[string]any) { m[key] = v })
}

func addTensor(t *testing.T, dir, name string, shape []int) {
	t.Helper()
	wp := filepath.Join(dir, mlx.PEFTWeightsFile)
	f, err := safetensors.ReadFile(wp)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, n := range f.Names() {
		ti, b, _ := f.Raw(n)
		ts = append(ts, safetensors.Tensor{Name: n, DType: ti.DType, Shape: ti.Shape, Data: b})
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	tn, err := safetensors.F32Tensor(name, safetensors.F32, shape, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(wp, append(ts, tn), nil); err != nil {
		t.Fatal(err)
	}
}

// TestReadFollowsLoadAdapters checks that Read and Check refuse what
// mlx-lm's load_adapters refuses.
func TestReadFollowsLoadAdapters(t *testing.T) {
	modelDir, cfg := tinyModel(t)
	m, _, err := mlxtest.ReadModel(modelDir)
	if err != nil {
		t.Fatal(err)
	}
	fresh := func(t *testing.T) string {
		peft := peftAdapter(t, cfg, native.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj", "down_proj"}}, false, safetensors.F32, 3)
		out := filepath.Join(t.TempDir(), "mlx")
		if err := mlx.Export(peft, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	t.Run("num_layers", func(t *testing.T) {
		dir := fresh(t)
		editJSON(t, filepath.Join(dir, mlx.ConfigFile), func(m map[string]any) { m["num_layers"] = 1 })
		ad, err := mlx.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		// Only the last layer gets LoRA: layer 0's tensors have no place.
		if err := ad.Check(m.Layers, m.Dims); !errors.Is(err, mlx.ErrFormat) || !strings.Contains(err.Error(), "model.layers.0.") {
			t.Fatalf("Check with num_layers 1: %v", err)
		}
	})
	t.Run("keys", func(t *testing.T) {
		dir := fresh(t)
		editJSON(t, filepath.Join(dir, mlx.ConfigFile), func(m map[string]any) {
			m["lora_parameters"].(map[string]any)["keys"] = []string{"self_attn.q_proj"}
		})
		if _, err := mlx.Read(dir); !errors.Is(err, mlx.ErrFormat) || !strings.Contains(err.Error(), "mlp.down_proj") {
			t.Fatalf("Read of a tensor outside keys: %v", err)
		}
	})
	t.Run("no num_layers", func(t *testing.T) {
		dir := fresh(t)
		editJSON(t, filepath.Join(dir, mlx.ConfigFile), func(m map[string]any) { delete(m, "num_layers") })
		if _, err := mlx.Read(dir); !errors.Is(err, mlx.ErrFormat) || !strings.Contains(err.Error(), "num_layers") {
			t.Fatalf("Read without num_layers: %v", err)
		}
	})
	t.Run("another model", func(t *testing.T) {
		ad, err := mlx.Read(fresh(t))
		if err != nil {
			t.Fatal(err)
		}
		// A model twice as wide.
		wide := func(key string) (int, int, bool) {
			out, in, ok := m.Dims(key)
			return 2 * out, 2 * in, ok
		}
		if err := ad.Check(m.Layers, wide); !errors.Is(err, mlx.ErrFormat) || !strings.Contains(err.Error(), "do not match") {
			t.Fatalf("Check against a model of another shape: %v", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, err := mlx.Read(t.TempDir()); !errors.Is(err, mlx.ErrFormat) || !strings.Contains(err.Error(), mlx.ConfigFile) {
			t.Fatalf("Read of an empty directory: %v", err)
		}
	})
}
