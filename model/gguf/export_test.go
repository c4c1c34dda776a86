package gguf_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

func TestExportBaseMetadata(t *testing.T) {
	dir, cfg := tinyModel(t)
	out := filepath.Join(t.TempDir(), "m.gguf")
	if err := gguf.ExportBase(dir, out, gguf.BaseOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := f.Info()
	if ins, err := gguf.Inspect(out); err != nil || ins != in {
		t.Errorf("Inspect = %+v, %v; want %+v", ins, err, in)
	}
	want := gguf.Info{Arch: "qwen3", Type: "model", Name: "tiny-qwen3", FileType: 0, BlockCount: cfg.Layers,
		ContextLength: cfg.MaxPosition, EmbeddingLength: cfg.Hidden, FeedForwardLength: cfg.Intermediate,
		HeadCount: cfg.Heads, HeadCountKV: cfg.KVHeads, KeyLength: cfg.HeadDim, ValueLength: cfg.HeadDim,
		VocabSize: cfg.VocabSize, Tensors: 2 + 11*cfg.Layers} // tied: no output.weight
	in.Elems, in.DataBytes = 0, 0
	if in != want {
		t.Errorf("info\n got %+v\nwant %+v", in, want)
	}
	// The tokenizer as convert_hf_to_gguf.py writes Qwen3's.
	for key, v := range map[string]any{
		"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
		"qwen3.rope.freq_base": float32(cfg.RopeTheta), "qwen3.attention.layer_norm_rms_epsilon": float32(cfg.RMSNormEps),
		"general.quantization_version": uint32(2), "tokenizer.ggml.add_bos_token": false,
	} {
		if got, ok := f.Get(key); !ok || got != v {
			t.Errorf("%s = %v, want %v", key, got, v)
		}
	}
	toks, _ := f.Array("tokenizer.ggml.tokens")
	types, _ := f.Array("tokenizer.ggml.token_type")
	tokens, tt := toks.Values.([]string), types.Values.([]int32)
	id := func(s string) int {
		i := strings.Index(strings.Join(tokens, "\x00")+"\x00", s+"\x00")
		return strings.Count(strings.Join(tokens, "\x00")[:i], "\x00")
	}
	imEnd, eot, think := id("<|im_end|>"), id("<|endoftext|>"), id("<think>")
	if tt[imEnd] != 3 || tt[eot] != 3 || tt[think] != 4 || tt[0] != 1 {
		t.Errorf("token types: <|im_end|> %d, <|endoftext|> %d, <think> %d, byte 0 %d; want 3, 3, 4, 1", tt[imEnd], tt[eot], tt[think], tt[0])
	}
	if e, _ := f.Uint32("tokenizer.ggml.eos_token_id"); int(e) != imEnd || cfg.EOS[0] != imEnd {
		t.Errorf("eos %d, want <|im_end|> %d", e, imEnd)
	}
	if p, _ := f.Uint32("tokenizer.ggml.padding_token_id"); int(p) != eot {
		t.Errorf("padding %d, want <|endoftext|> %d", p, eot)
	}
	if _, ok := f.Get("tokenizer.ggml.bos_token_id"); ok {
		t.Error("a bos token id, though the model has none")
	}
	var tj struct {
		Model struct {
			Merges [][2]string `json:"merges"`
		} `json:"model"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err := json.Unmarshal(b, &tj); err != nil {
		t.Fatal(err)
	}
	merges, _ := f.Array("tokenizer.ggml.merges")
	if m := merges.Values.([]string); len(m) != len(tj.Model.Merges) || m[0] != tj.Model.Merges[0][0]+" "+tj.Model.Merges[0][1] {
		t.Errorf("%d merges, want %d", len(m), len(tj.Model.Merges))
	}
	if tmpl, err := f.String("tokenizer.chat_template"); err != nil || !strings.Contains(tmpl, "<|im_start|>") {
		t.Errorf("chat template %q, %v", tmpl, err)
	}
	// Tied embeddings: no output.weight. F32 data is the model's own.
	if _, ok := f.Tensor("output.weight"); ok {
		t.Error("output.weight written for tied embeddings")
	}
	st, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{
		"model.embed_tokens.weight": "token_embd.weight", "model.layers.1.self_attn.k_norm.weight": "blk.1.attn_k_norm.weight",
		"model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight", "model.norm.weight": "output_norm.weight",
	} {
		v, shape, _ := st.Float32(src)
		got, ti, err := f.TensorFloat32(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, v) || int(ti.Shape[0]) != shape[len(shape)-1] {
			t.Errorf("%s: data or shape %v differ from %s %v", dst, ti.Shape, src, shape)
		}
	}

	// Q8_0: the 2-D weights are Q8_0, the norms stay F32.
	q := filepath.Join(t.TempDir(), "q.gguf")
	if err := gguf.ExportBase(dir, q, gguf.BaseOptions{Type: gguf.TypeQ8_0, Name: "tiny"}); err != nil {
		t.Fatal(err)
	}
	qf, err := gguf.Open(q)
	if err != nil {
		t.Fatal(err)
	}
	defer qf.Close()
	if in := qf.Info(); in.FileType != 7 || in.Name != "tiny" {
		t.Errorf("Q8_0 file type %d name %q", in.FileType, in.Name)
	}
	for _, ti := range qf.Tensors {
		want := gguf.TypeQ8_0
		if len(ti.Shape) == 1 {
			want = gguf.TypeF32
		}
		if ti.Type != want {
			t.Errorf("%s is %s, want %s", ti.Name, ti.Type, want)
		}
	}
}

// TestExportBaseShardedUntied exports a model whose weights are split in
// two shards with an index, with an untied output head.
func TestExportBaseShardedUntied(t *testing.T) {
	dir, _ := tinyModel(t)
	var conf map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	conf["tie_word_embeddings"] = false
	b, _ = json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	shards := [2][]safetensors.Tensor{}
	index := map[string]string{}
	for i, name := range append(st.Names(), "lm_head.weight") {
		src := name
		if name == "lm_head.weight" {
			src = "model.embed_tokens.weight"
		}
		ti, data, _ := st.Raw(src)
		if name == "lm_head.weight" {
			data = bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, len(data)/4) // ones
		}
		shards[i%2] = append(shards[i%2], safetensors.Tensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: data})
		index[name] = []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[i%2]
	}
	for i, s := range shards {
		if err := safetensors.WriteFile(filepath.Join(dir, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[i]), s, nil); err != nil {
			t.Fatal(err)
		}
	}
	ib, _ := json.Marshal(map[string]any{"weight_map": index})
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "m.gguf")
	if err := gguf.ExportBase(dir, out, gguf.BaseOptions{Type: gguf.TypeBF16}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, ti, err := f.TensorFloat32("output.weight")
	if err != nil || ti.Type != gguf.TypeBF16 || v[0] != 1 || v[len(v)-1] != 1 {
		t.Fatalf("output.weight: %v %v", ti, err)
	}
	if f.Info().FileType != 32 {
		t.Errorf("BF16 file type %d, want 32", f.Info().FileType)
	}
}

func TestExportBaseRefuses(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(t *testing.T, dir string)
		opt   gguf.BaseOptions
		match string
	}{
		{"another architecture", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) { m["architectures"] = []string{"MistralForCausalLM"} })
		}, gguf.BaseOptions{}, "only Qwen3ForCausalLM"},
		{"rope scaling", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) { m["rope_scaling"] = map[string]any{"type": "yarn", "factor": 4} })
		}, gguf.BaseOptions{}, "rope_scaling"},
		{"an unknown tensor", func(t *testing.T, dir string) {
			addTensor(t, dir, "model.layers.0.mlp.experts.0.up_proj.weight")
		}, gguf.BaseOptions{}, "no llama.cpp name"},
		{"no tokenizer", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "tokenizer.json")) }, gguf.BaseOptions{}, "tokenizer.json"},
		{"no weights", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "model.safetensors")) }, gguf.BaseOptions{}, "neither"},
		{"a quantized type it does not write", func(*testing.T, string) {}, gguf.BaseOptions{Type: gguf.TypeQ4_K}, "Q4_K"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := tinyModel(t)
			c.edit(t, dir)
			out := filepath.Join(t.TempDir(), "m.gguf")
			err := gguf.ExportBase(dir, out, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.match) {
				t.Fatalf("err = %v, want one saying %q", err, c.match)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("a refused export left a file")
			}
		})
	}
}

func editJSON(t *testing.T, path string, fn func(map[string]any)) {
	t.Helper()
	var m map[string]any
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// addTensor adds a small tensor called name to dir's model.safetensors.
func addTensor(t *testing.T, dir, name string) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	st, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, n := range st.Names() {
		ti, d, _ := st.Raw(n)
		ts = append(ts, safetensors.Tensor{Name: n, DType: ti.DType, Shape: ti.Shape, Data: d})
	}
	ts = append(ts, safetensors.Tensor{Name: name, DType: safetensors.F32, Shape: []int{2}, Data: make([]byte, 8)})
	if err := safetensors.WriteFile(path, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func TestExportLoRAMetadata(t *testing.T) {
	_, cfg := tinyModel(t)
	dir := filepath.Join(t.TempDir(), "v7")
	writePEFT(t, dir, cfg, 8, 16, true, []string{"q_proj", "down_proj"}, safetensors.F16, 5)
	out := filepath.Join(t.TempDir(), "a.gguf")
	if err := gguf.ExportLoRA(dir, out, gguf.LoRAOptions{Type: gguf.TypeQ8_0}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := f.Info()
	// rsLoRA: PEFT scales by 16/√8, llama.cpp by alpha/8, so alpha = 16·√8.
	if in.Arch != "qwen3" || in.Type != "adapter" || in.AdapterType != "lora" || in.Name != "v7" ||
		in.LoRAAlpha != float32(16*2.8284271247461903) || in.Tensors != 2*2*cfg.Layers {
		t.Fatalf("info %+v", in)
	}
	st, err := safetensors.ReadFile(filepath.Join(dir, gguf.AdapterWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, src string
		shape     []uint64
		typ       gguf.TensorType
	}{
		{"blk.0.attn_q.weight.lora_a", "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", []uint64{uint64(cfg.Hidden), 8}, gguf.TypeQ8_0},
		// B's rows of 8 (the rank) are no whole Q8_0 block: F16.
		{"blk.1.ffn_down.weight.lora_b", "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", []uint64{8, uint64(cfg.Hidden)}, gguf.TypeF16},
	} {
		ti, ok := f.Tensor(c.name)
		if !ok || !reflect.DeepEqual(ti.Shape, c.shape) || ti.Type != c.typ {
			t.Fatalf("%s: %+v, want shape %v of %s", c.name, ti, c.shape, c.typ)
		}
		if c.typ == gguf.TypeF16 {
			_, raw, _ := st.Raw(c.src)
			_, data, _ := f.TensorData(c.name)
			if !bytes.Equal(raw, data) {
				t.Fatalf("%s: F16 data not copied as is", c.name)
			}
		}
	}
}

// TestExportLoRALlamaPermutes checks that a llama adapter's q and k B rows
// are permuted by head as convert_hf_to_gguf.py permutes llama's q and k
// weights, and nothing else is.
func TestExportLoRALlamaPermutes(t *testing.T) {
	cfg := native.Config{VocabSize: 10, Hidden: 16, Intermediate: 32, Layers: 1, Heads: 4, KVHeads: 2, HeadDim: 4}
	base := t.TempDir()
	cb, _ := json.Marshal(map[string]any{"architectures": []string{"LlamaForCausalLM"}, "num_attention_heads": 4, "num_key_value_heads": 2})
	if err := os.WriteFile(filepath.Join(base, "config.json"), cb, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "a")
	writePEFT(t, dir, cfg, 2, 4, false, []string{"q_proj", "k_proj", "v_proj"}, safetensors.F32, 1)
	out := filepath.Join(t.TempDir(), "a.gguf")
	if err := gguf.ExportLoRA(dir, out, gguf.LoRAOptions{BaseDir: base}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if a, _ := f.String("general.architecture"); a != "llama" {
		t.Fatalf("architecture %q", a)
	}
	st, _ := safetensors.ReadFile(filepath.Join(dir, gguf.AdapterWeightsFile))
	const r = 2
	for _, c := range []struct {
		module, tensor string
		heads          int // 0: not permuted
	}{{"q_proj", "attn_q", 4}, {"k_proj", "attn_k", 2}, {"v_proj", "attn_v", 0}} {
		src, _, _ := st.Float32("base_model.model.model.layers.0.self_attn." + c.module + ".lora_B.weight")
		got, _, err := f.TensorFloat32("blk.0." + c.tensor + ".weight.lora_b")
		if err != nil {
			t.Fatal(err)
		}
		rows := len(src) / r
		for row := range rows {
			from := row
			if c.heads > 0 {
				// Row (h, j, i) of the output, i the rotary half, is row
				// (h, i, j) of the input.
				per := rows / c.heads
				h, rest := row/per, row%per
				j, i := rest/2, rest%2
				from = h*per + i*(per/2) + j
			}
			if !reflect.DeepEqual(got[row*r:row*r+r], src[from*r:from*r+r]) {
				t.Fatalf("%s: row %d is not input row %d", c.tensor, row, from)
			}
		}
		a, _, _ := st.Float32("base_model.model.model.layers.0.self_attn." + c.module + ".lora_A.weight")
		ga, _, _ := f.TensorFloat32("blk.0." + c.tensor + ".weight.lora_a")
		if !reflect.DeepEqual(a, ga) {
			t.Fatalf("%s: lora_a changed", c.tensor)
		}
	}
}

func TestExportLoRARefuses(t *testing.T) {
	_, cfg := tinyModel(t)
	for _, c := range []struct {
		name  string
		edit  func(t *testing.T, dir string)
		opt   gguf.LoRAOptions
		match string
	}{
		{"DoRA", func(t *testing.T, dir string) { editCfg(t, dir, "use_dora", true) }, gguf.LoRAOptions{}, "DoRA"},
		{"rank pattern", func(t *testing.T, dir string) { editCfg(t, dir, "rank_pattern", map[string]int{"q_proj": 4}) }, gguf.LoRAOptions{}, "rank_pattern"},
		{"saved modules", func(t *testing.T, dir string) { editCfg(t, dir, "modules_to_save", []string{"lm_head"}) }, gguf.LoRAOptions{}, "modules_to_save"},
		{"bias", func(t *testing.T, dir string) { editCfg(t, dir, "bias", "lora_only") }, gguf.LoRAOptions{}, "bias"},
		{"fan_in_fan_out", func(t *testing.T, dir string) { editCfg(t, dir, "fan_in_fan_out", true) }, gguf.LoRAOptions{}, "fan_in_fan_out"},
		{"another peft type", func(t *testing.T, dir string) { editCfg(t, dir, "peft_type", "IA3") }, gguf.LoRAOptions{}, "IA3"},
		{"an unknown base model", func(t *testing.T, dir string) { editCfg(t, dir, "base_model_name_or_path", "mistralai/Mistral-7B") }, gguf.LoRAOptions{}, "cannot tell the architecture"},
		{"a mixture of experts", func(t *testing.T, dir string) { editCfg(t, dir, "base_model_name_or_path", "Qwen/Qwen3-30B-A3B") }, gguf.LoRAOptions{}, "cannot tell the architecture"},
		{"an unknown architecture", func(*testing.T, string) {}, gguf.LoRAOptions{Arch: "gemma3"}, "gemma3"},
		{"llama without its config", func(*testing.T, string) {}, gguf.LoRAOptions{Arch: "llama"}, "head counts"},
		{"a quantized type it does not write", func(*testing.T, string) {}, gguf.LoRAOptions{Type: gguf.TypeQ4_0}, "Q4_0"},
		{"an unknown module", func(t *testing.T, dir string) {
			rewriteAdapter(t, dir, func(n string) string { return strings.Replace(n, "q_proj", "qkv_proj", 1) })
		}, gguf.LoRAOptions{}, "qkv_proj"},
		{"embeddings", func(t *testing.T, dir string) {
			rewriteAdapter(t, dir, func(n string) string {
				return strings.Replace(n, "model.layers.0.self_attn.q_proj.lora_A.weight", "model.embed_tokens.weight", 1)
			})
		}, gguf.LoRAOptions{}, "embeddings"},
		{"an unpaired A", func(t *testing.T, dir string) {
			rewriteAdapter(t, dir, func(n string) string {
				if strings.Contains(n, "layers.1.self_attn.q_proj.lora_B") {
					return ""
				}
				return n
			})
		}, gguf.LoRAOptions{}, "only one of"},
		{"a rank unlike r", func(t *testing.T, dir string) { editCfg(t, dir, "r", 4) }, gguf.LoRAOptions{}, "rank 8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "v")
			writePEFT(t, dir, cfg, 8, 16, false, allTargets, safetensors.F32, 1)
			c.edit(t, dir)
			out := filepath.Join(t.TempDir(), "a.gguf")
			err := gguf.ExportLoRA(dir, out, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.match) {
				t.Fatalf("err = %v, want one saying %q", err, c.match)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("a refused export left a file")
			}
		})
	}
}

func editCfg(t *testing.T, dir, key string, v any) {
	t.Helper()
	editJSON(t, filepath.Join(dir, gguf.AdapterConfigFile), func(m map[string]any) { m[key] = v })
}

// rewriteAdapter renames the adapter's tensors by fn ("" drops one).
func rewriteAdapter(t *testing.T, dir string, fn func(string) string) {
	t.Helper()
	path := filepath.Join(dir, gguf.AdapterWeightsFile)
	st, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, n := range st.Names() {
		ti, d, _ := st.Raw(n)
		if name := fn(n); name != "" {
			ts = append(ts, safetensors.Tensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: d})
		}
	}
	if err := safetensors.WriteFile(path, ts, nil); err != nil {
		t.Fatal(err)
	}
}
