package baseid

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
)

func TestNormName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Qwen/Qwen3-4B", "qwen3-4b"},
		{"/home/ann/models/Qwen3-4B/", "qwen3-4b"},
		{"mlx-community/Qwen3-4B-4bit", "qwen3-4b"},
		{"Qwen3-4B-MLX-8bit", "qwen3-4b"},
		{"mlx-community/Qwen3-4B-bf16", "qwen3-4b"},
		{"qwen3-4b-q4_k_m.gguf", "qwen3-4b"},
		{"Qwen3-4B-GGUF", "qwen3-4b"},
		{"unsloth/Qwen3-4B-GGUF:IQ3_XXS", "qwen3-4b"},
		{"qwen3:4b", "qwen3-4b"},
		{"qwen3:4b-q4_K_M", "qwen3-4b"},
		{"Qwen3 4B", "qwen3-4b"},
		{"Qwen3-4B-Instruct-2507-GGUF", "qwen3-4b-instruct-2507"},
		{"meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b-instruct"},
		{"tiny", "tiny"},
	} {
		if got := NormName(c.in); got != c.want {
			t.Errorf("NormName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Separators do not tell models apart; "-Instruct" does.
	if !compatibleNames([]string{"llama3.2:1b"}, []string{"meta-llama/Llama-3.2-1B"}) {
		t.Error("llama3.2:1b and Llama-3.2-1B differ")
	}
	if compatibleNames([]string{"Qwen2.5-7B-Instruct"}, []string{"Qwen/Qwen2.5-7B"}) {
		t.Error("an instruct model is taken for its base")
	}
}

// tinyCfg is the shape of the tiny model the demo mesh trains.
func tinyCfg() native.Config { return native.TinyConfig(96) }

// writeGGUF writes a model GGUF whose metadata says the given shape, as
// llama.cpp's converter names its keys, with one small tensor.
func writeGGUF(t *testing.T, path, arch, name string, layers, hidden, heads, kvHeads, headDim, vocab int, fileType uint32, extra ...gguf.KV) {
	t.Helper()
	toks := make([]string, vocab)
	for i := range toks {
		toks[i] = string(rune('a' + i%26))
	}
	kv := []gguf.KV{
		{Key: "general.architecture", Value: arch},
		{Key: "general.type", Value: "model"},
		{Key: "general.name", Value: name},
		{Key: "general.file_type", Value: fileType},
		{Key: arch + ".block_count", Value: uint32(layers)},
		{Key: arch + ".embedding_length", Value: uint32(hidden)},
		{Key: arch + ".attention.head_count", Value: uint32(heads)},
		{Key: arch + ".attention.head_count_kv", Value: uint32(kvHeads)},
		{Key: arch + ".attention.key_length", Value: uint32(headDim)},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Strings(toks)},
	}
	kv = append(kv, extra...)
	data := make([]byte, 4*hidden)
	ten := gguf.Tensor{Info: gguf.TensorInfo{Name: "output_norm.weight", Shape: []uint64{uint64(hidden)}, Type: gguf.TypeF32}, Data: data}
	if err := gguf.WriteFile(path, kv, []gguf.Tensor{ten}); err != nil {
		t.Fatal(err)
	}
}

// copies writes the tiny base in each format a device may hold it in: the
// HF directory the trainers train on (F32), an MLX 4-bit copy (its
// config.json with MLX's quantization), a Q4_K_M GGUF, and an adapter
// trained on it.
func copies(t *testing.T) (hf, mlx, ggufPath, adapter string) {
	t.Helper()
	root := t.TempDir()
	c := tinyCfg()
	hf = filepath.Join(root, "tiny")
	if err := native.CreateTiny(hf, c, 1); err != nil {
		t.Fatal(err)
	}
	mlx = filepath.Join(root, "tiny-4bit")
	os.Mkdir(mlx, 0o755)
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(hf, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["quantization"] = map[string]any{"group_size": 64, "bits": 4}
	b, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(mlx, "config.json"), b, 0o644)
	ggufPath = filepath.Join(root, "tiny-Q4_K_M.gguf")
	writeGGUF(t, ggufPath, "qwen3", "tiny", c.Layers, c.Hidden, c.Heads, c.KVHeads, c.HeadDim, c.VocabSize, 15)
	adapter = filepath.Join(root, "v3")
	if err := native.WriteFreshAdapter(adapter, c, native.LoRAConfig{}, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	return hf, mlx, ggufPath, adapter
}

// TestSameAcrossFormats: the tiny base as the trainers hold it, as an MLX
// 4-bit copy, as a quantized GGUF, and as the base of an adapter trained
// on it, is one base model, read from each format.
func TestSameAcrossFormats(t *testing.T) {
	hf, mlx, gg, ad := copies(t)
	ids := map[string]ID{}
	for name, p := range map[string]string{"hf": hf, "mlx": mlx, "gguf": gg, "adapter": ad} {
		id, err := Read(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ids[name] = id
	}
	c := tinyCfg()
	if id := ids["gguf"]; id.Arch != "qwen3" || id.Layers != c.Layers || id.Hidden != c.Hidden || id.Vocab != c.VocabSize ||
		id.QDim != c.Heads*c.HeadDim || id.KVDim != c.KVHeads*c.HeadDim || id.Quant != "Q4_K_M" || id.Format != "gguf" {
		t.Fatalf("GGUF identity %+v", id)
	}
	if id := ids["mlx"]; id.Format != "mlx" || id.Quant != "4bit" || id.Arch != "qwen3" || id.Layers != c.Layers {
		t.Fatalf("MLX identity %+v", id)
	}
	if id := ids["adapter"]; id.Layers != c.Layers || id.Hidden != c.Hidden || id.QDim != c.Heads*c.HeadDim || id.KVDim != c.KVHeads*c.HeadDim || id.Arch != "" {
		t.Fatalf("adapter identity %+v", id)
	}
	for a, x := range ids {
		for b, y := range ids {
			if err := Same(x, y); err != nil {
				t.Errorf("%s vs %s: %v", a, b, err)
			}
		}
	}
}

// TestDifferentBase: a base of another shape, architecture or name is
// refused, with a message that names both and what differs.
func TestDifferentBase(t *testing.T) {
	hf, _, _, ad := copies(t)
	tiny, err := Read(hf)
	if err != nil {
		t.Fatal(err)
	}
	adapter, err := Read(ad)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := tinyCfg()
	for _, x := range []struct {
		name, arch, model string
		layers, hidden    int
		says              []string
	}{
		{"more layers", "qwen3", "tiny", c.Layers + 2, c.Hidden, []string{"4 layers, not 2", "tiny (qwen3, 4 layers"}},
		{"wider", "qwen3", "tiny", c.Layers, 2 * c.Hidden, []string{"hidden size 128, not 64"}},
		{"another architecture", "llama", "tiny", c.Layers, c.Hidden, []string{"architecture llama, not qwen3"}},
		{"another name", "qwen3", "Qwen3 4B", c.Layers, c.Hidden, []string{"named qwen3-4b", "not tiny"}},
	} {
		t.Run(x.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(x.name, " ", "-")+".gguf")
			writeGGUF(t, p, x.arch, x.model, x.layers, x.hidden, c.Heads, c.KVHeads, c.HeadDim, c.VocabSize, 15)
			id, err := FromGGUF(p)
			if err != nil {
				t.Fatal(err)
			}
			err = Same(id, tiny)
			if !errors.Is(err, ErrDifferent) {
				t.Fatalf("Same: %v", err)
			}
			t.Log(err)
			for _, s := range x.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
			// The adapter knows no architecture, but its shape and name.
			if x.name != "another architecture" {
				if err := Same(id, adapter); !errors.Is(err, ErrDifferent) {
					t.Errorf("adapter on %s: %v", x.name, err)
				}
			}
		})
	}
	// An adapter trained on another shape does not go on the tiny base.
	other := c
	other.Hidden, other.HeadDim = 128, 32
	od := filepath.Join(dir, "other")
	if err := native.WriteFreshAdapter(od, other, native.LoRAConfig{}, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	oid, err := FromAdapter(od)
	if err != nil {
		t.Fatal(err)
	}
	if err := Same(oid, tiny); !errors.Is(err, ErrDifferent) || !strings.Contains(err.Error(), "hidden size 128, not 64") {
		t.Fatalf("an adapter of another width: %v", err)
	}
}

// TestUnreadable: what says too little to name a model is refused.
func TestUnreadable(t *testing.T) {
	dir := t.TempDir()
	adapterGGUF := filepath.Join(dir, "adapter.gguf")
	writeGGUF(t, adapterGGUF, "qwen3", "tiny", 2, 64, 4, 2, 16, 96, 0, gguf.KV{Key: "adapter.type", Value: "lora"})
	// general.type is written once; an adapter says "adapter".
	f, err := gguf.Open(adapterGGUF)
	if err != nil {
		t.Fatal(err)
	}
	kv := f.KV
	f.Close()
	for i := range kv {
		if kv[i].Key == "general.type" {
			kv[i].Value = "adapter"
		}
	}
	if err := gguf.WriteFile(adapterGGUF, kv, []gguf.Tensor{{Info: gguf.TensorInfo{Name: "x", Shape: []uint64{4}, Type: gguf.TypeF32}, Data: make([]byte, 16)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := FromGGUF(adapterGGUF); !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "adapter, not a model") {
		t.Errorf("an adapter GGUF: %v", err)
	}
	notGGUF := filepath.Join(dir, "x.gguf")
	os.WriteFile(notGGUF, []byte("not a gguf at all"), 0o644)
	if _, err := Read(notGGUF); !errors.Is(err, ErrUnreadable) {
		t.Errorf("a file that is no GGUF: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "qwen3"}`), 0o644)
	if _, err := Read(dir); !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "num_hidden_layers") {
		t.Errorf("a config.json without a shape: %v", err)
	}
	if _, err := Read(t.TempDir()); !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "no config.json") {
		t.Errorf("an empty directory: %v", err)
	}
}

// FuzzNormName: names come from files and servers; normalising never
// panics and a normal name is its own normal form.
func FuzzNormName(f *testing.F) {
	for _, s := range []string{"Qwen/Qwen3-4B-GGUF:Q4_K_M", "x_q4", "a-gguf_", "..", "/", "qwen3:4b-q4_K_M", "Ǆ-4BIT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := NormName(s)
		if again := NormName(n); again != n {
			t.Fatalf("NormName(%q) = %q, and again %q", s, n, again)
		}
	})
}

// TestHubCacheNames: a model in the Hugging Face hub's cache is named by
// its repository, not by its snapshot's revision.
func TestHubCacheNames(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "hub", "models--Qwen--Qwen3-4B", "snapshots", strings.Repeat("ab12", 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}`), 0o644)
	id, err := FromModelDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(id.Names) != 1 || id.Names[0] != "Qwen/Qwen3-4B" || id.QDim != 4096 || id.KVDim != 1024 {
		t.Fatalf("identity %+v", id)
	}
	if err := Same(id, ID{Names: []string{"/srv/models/Qwen3-4B"}, Layers: 36, Hidden: 2560}); err != nil {
		t.Fatal(err)
	}
	// A bare revision names nothing: only the shape is compared.
	bare := filepath.Join(root, strings.Repeat("0f", 20))
	os.MkdirAll(bare, 0o755)
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	os.WriteFile(filepath.Join(bare, "config.json"), b, 0o644)
	if id, err := FromModelDir(bare); err != nil || len(id.Names) != 0 {
		t.Fatalf("a directory named by a revision: %+v %v", id, err)
	}
}
