package baseid

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// maxConfig bounds a config.json or adapter_config.json read.
const maxConfig = 4 << 20

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxConfig {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrUnreadable, path, maxConfig)
	}
	return b, nil
}

// hfConfig is what an identity needs of a Hugging Face (or MLX) model
// directory's config.json.
type hfConfig struct {
	NameOrPath    string   `json:"_name_or_path"`
	ModelType     string   `json:"model_type"`
	Architectures []string `json:"architectures"`
	Layers        int      `json:"num_hidden_layers"`
	Hidden        int      `json:"hidden_size"`
	Heads         int      `json:"num_attention_heads"`
	KVHeads       int      `json:"num_key_value_heads"`
	HeadDim       int      `json:"head_dim"`
	Vocab         int      `json:"vocab_size"`
	// Quantization is MLX's ({"group_size": 64, "bits": 4});
	// QuantizationConfig transformers' (bitsandbytes, GPTQ, AWQ).
	Quantization *struct {
		Bits int `json:"bits"`
	} `json:"quantization"`
	QuantizationConfig *struct {
		Bits        int    `json:"bits"`
		QuantMethod string `json:"quant_method"`
	} `json:"quantization_config"`
	// TextConfig holds the language model's shape in multimodal configs.
	TextConfig *hfConfig `json:"text_config"`
}

// FromModelDir reads the identity of a Hugging Face or MLX model directory
// from its config.json: model_type, num_hidden_layers, hidden_size, the
// head counts and head_dim, vocab_size; MLX's "quantization" marks an MLX
// copy. Its names are the directory's and config.json's _name_or_path.
func FromModelDir(dir string) (ID, error) {
	b, err := readSmall(filepath.Join(dir, "config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return ID{}, fmt.Errorf("%w: %s has no config.json (is it a model directory?)", ErrUnreadable, dir)
	}
	if err != nil {
		return ID{}, err
	}
	var c hfConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return ID{}, fmt.Errorf("%w: %s: config.json: %v", ErrUnreadable, dir, err)
	}
	if c.Layers == 0 && c.TextConfig != nil {
		t := *c.TextConfig
		t.NameOrPath, t.Quantization, t.QuantizationConfig = c.NameOrPath, c.Quantization, c.QuantizationConfig
		if t.ModelType == "" {
			t.ModelType = c.ModelType
		}
		c = t
	}
	if c.ModelType == "" || c.Layers <= 0 || c.Hidden <= 0 {
		return ID{}, fmt.Errorf("%w: %s: config.json names no model_type, num_hidden_layers and hidden_size", ErrUnreadable, dir)
	}
	id := ID{Names: dirNames(dir), Arch: NormArch(c.ModelType), Layers: c.Layers, Hidden: c.Hidden,
		Heads: c.Heads, KVHeads: c.KVHeads, Vocab: c.Vocab, Format: "hf"}
	if c.NameOrPath != "" {
		id.Names = append(id.Names, c.NameOrPath)
	}
	if id.KVHeads == 0 {
		id.KVHeads = id.Heads // transformers' default
	}
	if hd := c.HeadDim; c.Heads > 0 {
		if hd == 0 && c.Hidden%c.Heads == 0 {
			hd = c.Hidden / c.Heads
		}
		id.QDim, id.KVDim = c.Heads*hd, id.KVHeads*hd
	}
	switch {
	case c.Quantization != nil:
		id.Format, id.Quant = "mlx", fmt.Sprintf("%dbit", c.Quantization.Bits)
	case c.QuantizationConfig != nil:
		id.Quant = strings.TrimSpace(c.QuantizationConfig.QuantMethod + " " + bitsName(c.QuantizationConfig.Bits))
	}
	return id, nil
}

func bitsName(b int) string {
	if b == 0 {
		return ""
	}
	return fmt.Sprintf("%dbit", b)
}

// hubSnapshot matches a model directory in the Hugging Face hub's cache
// (huggingface_hub's file_download.py: models--ORG--NAME/snapshots/REVISION).
var hubSnapshot = regexp.MustCompile(`models--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\][^/\\]+$`)

// commitRE is a git revision: a snapshot directory's name says nothing of
// the model.
var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// dirNames are the names a model directory goes by: ORG/NAME for a
// snapshot in the Hugging Face hub's cache, else the directory's name
// (none for a bare revision).
func dirNames(dir string) []string {
	clean := filepath.Clean(dir)
	if m := hubSnapshot.FindStringSubmatch(clean); m != nil {
		return []string{m[1] + "/" + m[2]}
	}
	if n := filepath.Base(clean); !commitRE.MatchString(n) {
		return []string{n}
	}
	return nil
}

// peftConfig is what an identity needs of adapter_config.json.
type peftConfig struct {
	BaseModel         string          `json:"base_model_name_or_path"`
	LayersToTransform json.RawMessage `json:"layers_to_transform"`
}

// loraRE reads a PEFT tensor name: the layer, the module and A or B.
var loraRE = regexp.MustCompile(`\.layers\.(\d+)\.(?:[a-z_]+\.)?([a-z_]+_proj)\.lora_([AB])(?:\.[a-z_]+)?\.weight$`)

// FromAdapter reads the identity of the base a PEFT adapter was trained
// on: base_model_name_or_path from adapter_config.json, and from the
// tensor shapes in adapter_model.safetensors's header the layers (the
// highest layer adapted, plus one) and the widths: hidden size (the input
// of q/k/v/gate/up_proj's A), query width (q_proj's B) and key/value width
// (k_proj's and v_proj's B). Only the header is read.
func FromAdapter(dir string) (ID, error) {
	b, err := readSmall(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		return ID{}, fmt.Errorf("%w: %s: %v", ErrUnreadable, dir, err)
	}
	var c peftConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return ID{}, fmt.Errorf("%w: %s: adapter_config.json: %v", ErrUnreadable, dir, err)
	}
	h, err := readSafetensorsHeader(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		return ID{}, fmt.Errorf("%w: %s: %v", ErrUnreadable, dir, err)
	}
	id := ID{Format: "adapter"}
	if n := strings.TrimSpace(c.BaseModel); n != "" {
		id.Names = []string{n}
	}
	if l := strings.TrimSpace(string(c.LayersToTransform)); l != "" && l != "null" && l != "[]" {
		id.Partial = true
	}
	set := func(dst *int, v int, what, name string) error {
		if *dst != 0 && *dst != v {
			return fmt.Errorf("%w: %s: %s is %d in %s, %d elsewhere", ErrUnreadable, dir, what, v, name, *dst)
		}
		*dst = v
		return nil
	}
	for name, ti := range h.Tensors {
		m := loraRE.FindStringSubmatch(name)
		if m == nil || len(ti.Shape) != 2 {
			continue
		}
		layer, _ := strconv.Atoi(m[1])
		id.Layers = max(id.Layers, layer+1)
		mod, ab := m[2], m[3]
		var err error
		switch {
		case ab == "A" && (mod == "q_proj" || mod == "k_proj" || mod == "v_proj" || mod == "gate_proj" || mod == "up_proj"):
			err = set(&id.Hidden, ti.Shape[1], "the hidden size", name)
		case ab == "B" && mod == "q_proj":
			err = set(&id.QDim, ti.Shape[0], "the query width", name)
		case ab == "B" && (mod == "k_proj" || mod == "v_proj"):
			err = set(&id.KVDim, ti.Shape[0], "the key/value width", name)
		case ab == "B" && mod == "o_proj":
			err = set(&id.Hidden, ti.Shape[0], "the hidden size", name)
		}
		if err != nil {
			return ID{}, err
		}
	}
	if id.Layers == 0 {
		return ID{}, fmt.Errorf("%w: %s: adapter_model.safetensors holds no LoRA tensor of a layer", ErrUnreadable, dir)
	}
	return id, nil
}

// readSafetensorsHeader reads and checks a safetensors file's header, not
// its data.
func readSafetensorsHeader(path string) (safetensors.Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return safetensors.Header{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return safetensors.Header{}, err
	}
	var lenb [8]byte
	if _, err := io.ReadFull(f, lenb[:]); err != nil {
		return safetensors.Header{}, fmt.Errorf("%s: %w: %v", filepath.Base(path), safetensors.ErrInvalid, err)
	}
	n := binary.LittleEndian.Uint64(lenb[:])
	if n > safetensors.MaxHeaderSize || int64(n) > fi.Size()-8 {
		return safetensors.Header{}, fmt.Errorf("%s: %w: header length %d", filepath.Base(path), safetensors.ErrInvalid, n)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(f, js); err != nil {
		return safetensors.Header{}, err
	}
	h, err := safetensors.DecodeHeader(js, fi.Size()-8-int64(n))
	if err != nil {
		return safetensors.Header{}, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return h, nil
}

// fileTypes names llama.cpp's general.file_type values (enum llama_ftype
// in include/llama.h).
var fileTypes = map[int]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
	10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
	16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}

// FromGGUFMetadata reads a GGUF's identity from its metadata, as get
// returns each key's value (ok false when the file has no such key):
// general.architecture; general.name, general.basename with
// general.size_label and general.finetune; ARCH.block_count,
// ARCH.embedding_length, ARCH.attention.head_count,
// ARCH.attention.head_count_kv, ARCH.attention.key_length; ARCH.vocab_size
// or the length of tokenizer.ggml.tokens; general.file_type. (The keys are
// llama.cpp's gguf-py/gguf/constants.py Keys.)
func FromGGUFMetadata(get func(key string) (any, bool)) (ID, error) {
	str := func(k string) string {
		if v, ok := get(k); ok {
			if s, ok := v.(string); ok {
				return strings.TrimSpace(s)
			}
		}
		return ""
	}
	num := func(k string) int {
		if v, ok := get(k); ok {
			return toInt(v)
		}
		return 0
	}
	arch := str("general.architecture")
	if arch == "" {
		return ID{}, fmt.Errorf("%w: the GGUF has no general.architecture", ErrUnreadable)
	}
	if t := str("general.type"); t != "" && t != "model" {
		return ID{}, fmt.Errorf("%w: the GGUF is a %s, not a model", ErrUnreadable, t)
	}
	id := ID{Arch: NormArch(arch), Format: "gguf",
		Layers: num(arch + ".block_count"), Hidden: num(arch + ".embedding_length"),
		Heads: num(arch + ".attention.head_count"), KVHeads: num(arch + ".attention.head_count_kv"),
		Vocab: num(arch + ".vocab_size")}
	if id.Vocab == 0 {
		if v, ok := get("tokenizer.ggml.tokens"); ok {
			if a, ok := v.(interface{ Len() int }); ok {
				id.Vocab = a.Len()
			} else if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
				id.Vocab = rv.Len()
			}
		}
	}
	if id.KVHeads == 0 {
		id.KVHeads = id.Heads
	}
	if hd := num(arch + ".attention.key_length"); id.Heads > 0 {
		if hd == 0 && id.Hidden%id.Heads == 0 {
			hd = id.Hidden / id.Heads
		}
		id.QDim, id.KVDim = id.Heads*hd, id.KVHeads*hd
	}
	if n := str("general.name"); n != "" {
		id.Names = append(id.Names, n)
	}
	if b := str("general.basename"); b != "" {
		n := b
		if s := str("general.size_label"); s != "" {
			n += "-" + s
		}
		id.Names = append(id.Names, n)
		if f := str("general.finetune"); f != "" {
			id.Names = append(id.Names, n+"-"+f)
		}
	}
	if v, ok := get("general.file_type"); ok {
		ft := toInt(v)
		if q, ok := fileTypes[ft]; ok {
			id.Quant = q
		} else {
			id.Quant = fmt.Sprintf("file type %d", ft)
		}
	}
	if id.Layers <= 0 || id.Hidden <= 0 {
		return ID{}, fmt.Errorf("%w: the GGUF has no %s.block_count and %s.embedding_length", ErrUnreadable, arch, arch)
	}
	return id, nil
}

// FromGGUF reads the identity of the GGUF model file at path from its
// metadata (FromGGUFMetadata); its file name is one more of its names.
func FromGGUF(path string) (ID, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return ID{}, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	defer f.Close()
	id, err := FromGGUFMetadata(f.Get)
	if err != nil {
		return ID{}, fmt.Errorf("%s: %w", path, err)
	}
	if n := filepath.Base(path); strings.HasSuffix(n, ".gguf") {
		id.Names = append(id.Names, n)
	}
	return id, nil
}

// Read reads the identity of what path holds: a GGUF file (by its magic),
// an adapter directory (adapter_config.json), or a Hugging Face or MLX
// model directory (config.json).
func Read(path string) (ID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return ID{}, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	if !fi.IsDir() {
		return FromGGUF(path)
	}
	if _, err := os.Stat(filepath.Join(path, "adapter_config.json")); err == nil {
		return FromAdapter(path)
	}
	return FromModelDir(path)
}

// toInt reads an integer metadata value of any width (0 for anything
// else).
func toInt(v any) int {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return int(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int(rv.Uint())
	}
	return 0
}
