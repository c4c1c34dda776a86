// Package baseid says whether two copies of a model are the same base
// model, whatever their file formats: the bf16 Hugging Face directory the
// trainers train on, a quantized GGUF a device serves with llama-server or
// Ollama, an MLX 4-bit copy, or the base an adapter was trained on. Bytes
// cannot tell (every format and quantization writes other bytes), so a
// base is known by its identity: its architecture, its shape (layers,
// hidden size, attention heads, vocabulary) and its name with the format
// and quantization suffixes left out ("Qwen/Qwen3-4B", "Qwen3-4B-4bit",
// "qwen3-4b-q4_k_m.gguf" and a GGUF whose general.basename is "Qwen3" and
// size_label "4B" all name qwen3-4b; "-Instruct" is kept, as an instruct
// model is another base).
//
// The package reads only what it needs of each format: a GGUF's metadata
// (model/gguf), a model directory's config.json, an adapter's
// adapter_config.json and the tensor shapes in its safetensors header. It
// does no other I/O and keeps no state.
package baseid

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// ErrDifferent: two models are not the same base.
var ErrDifferent = errors.New("baseid: a different base model")

// ErrUnreadable: a file or directory says too little to know its model.
var ErrUnreadable = errors.New("baseid: cannot tell the model")

// ID is a model's identity. A zero field is not known (an adapter does not
// say its architecture; a config.json may leave the head size out), and
// is not compared.
type ID struct {
	// Names are the model's names as found (general.name, basename and
	// size label, a directory's name, base_model_name_or_path), the first
	// the one to show.
	Names []string
	// Arch is the architecture as llama.cpp names it ("qwen3", "llama").
	Arch string
	// Layers is the number of transformer blocks; Hidden the embedding
	// width; Vocab the vocabulary size.
	Layers, Hidden, Vocab int
	// QDim and KVDim are the widths of the query and of the key/value
	// projections (heads times head size).
	QDim, KVDim int
	// Heads and KVHeads are the attention head counts.
	Heads, KVHeads int
	// Format says where the identity was read: "gguf", "hf", "mlx" or
	// "adapter"; Quant the quantization, where the format says one
	// ("Q4_K_M", "4bit").
	Format, Quant string
	// Partial marks an adapter that adapts only some layers
	// (layers_to_transform): Layers is then a lower bound.
	Partial bool
}

// Name is the name to show: the first of Names, or "an unnamed model".
func (id ID) Name() string {
	if len(id.Names) == 0 || id.Names[0] == "" {
		return "an unnamed model"
	}
	return id.Names[0]
}

// String describes the identity for messages: "Qwen3-4B (qwen3, 36
// layers, hidden 2560)".
func (id ID) String() string {
	var parts []string
	if id.Arch != "" {
		parts = append(parts, id.Arch)
	}
	if id.Layers > 0 {
		l := fmt.Sprintf("%d layers", id.Layers)
		if id.Partial {
			l = fmt.Sprintf("layers up to %d", id.Layers)
		}
		parts = append(parts, l)
	}
	if id.Hidden > 0 {
		parts = append(parts, fmt.Sprintf("hidden %d", id.Hidden))
	}
	if id.Quant != "" {
		parts = append(parts, id.Quant)
	}
	if len(parts) == 0 {
		return id.Name()
	}
	return id.Name() + " (" + strings.Join(parts, ", ") + ")"
}

// archAliases maps the names Hugging Face's model_type gives an
// architecture to llama.cpp's (convert_hf_to_gguf.py registers Mistral's
// checkpoints as "llama"; Gemma 3's text model is "gemma3").
var archAliases = map[string]string{
	"mistral":     "llama",
	"gemma3_text": "gemma3",
}

// NormArch is an architecture name as llama.cpp spells it.
func NormArch(a string) string {
	a = strings.ToLower(strings.TrimSpace(a))
	if b, ok := archAliases[a]; ok {
		return b
	}
	return a
}

// suffixRE matches one format or quantization suffix of a model name:
// GGUF and MLX repository suffixes, llama.cpp's quantization types
// (Q4_K_M, IQ3_XXS, Q8_0), MLX's bit widths, and the float types.
var suffixRE = regexp.MustCompile(`[-_.](gguf|mlx|safetensors|hf|(i?q\d[a-z0-9_]*)|(\d+-?bits?)|bf16|fp16|f16|fp32|f32|fp8|int4|int8|awq|gptq)$`)

// NormName is a model name with what does not change the model left out:
// the case, a path or an organisation ("Qwen/"), an Ollama tag's colon
// (qwen3:4b is qwen3-4b), spaces and underscores (as '-'), and format and
// quantization suffixes ("-GGUF", "-Q4_K_M", "-4bit", "-bf16"). What names
// another model ("-Instruct", "-Base", a size) stays.
func NormName(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimRight(s, "/")
	if i := strings.LastIndexAny(s, `/\`); i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimSuffix(s, ".gguf")
	s = strings.TrimSuffix(s, ":latest")
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, ":", "-")), "-")
	for {
		t := suffixRE.ReplaceAllString(s, "")
		t = strings.TrimRight(t, "-_.")
		if t == s {
			break
		}
		s = t
	}
	return strings.ReplaceAll(s, "_", "-")
}

// nameKey is what names are compared by: NormName without its separators,
// so that Ollama's llama3.2:1b and Hugging Face's Llama-3.2-1B agree.
func nameKey(s string) string {
	return strings.NewReplacer("-", "", ".", "").Replace(NormName(s))
}

// compatibleNames says whether two lists of names share a name, once
// normalised; a side with no names is compatible with anything.
func compatibleNames(a, b []string) bool {
	var ka, kb []string
	for _, n := range a {
		if k := nameKey(n); k != "" {
			ka = append(ka, k)
		}
	}
	for _, n := range b {
		if k := nameKey(n); k != "" {
			kb = append(kb, k)
		}
	}
	if len(ka) == 0 || len(kb) == 0 {
		return true
	}
	for _, x := range ka {
		if slices.Contains(kb, x) {
			return true
		}
	}
	return false
}

func normAll(names []string) []string {
	var out []string
	for _, n := range names {
		if m := NormName(n); m != "" && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// Same says whether a and b are the same base model: the same
// architecture and shape where both say them, and a name in common once
// normalised (where both have names). The error wraps ErrDifferent and
// names both, with what differs.
func Same(a, b ID) error {
	var diffs []string
	if a.Arch != "" && b.Arch != "" && NormArch(a.Arch) != NormArch(b.Arch) {
		diffs = append(diffs, fmt.Sprintf("architecture %s, not %s", a.Arch, b.Arch))
	}
	if a.Layers > 0 && b.Layers > 0 {
		switch {
		case a.Partial && !b.Partial && a.Layers > b.Layers,
			b.Partial && !a.Partial && b.Layers > a.Layers,
			!a.Partial && !b.Partial && a.Layers != b.Layers:
			diffs = append(diffs, fmt.Sprintf("%d layers, not %d", a.Layers, b.Layers))
		}
	}
	num := func(what string, x, y int) {
		if x > 0 && y > 0 && x != y {
			diffs = append(diffs, fmt.Sprintf("%s %d, not %d", what, x, y))
		}
	}
	num("hidden size", a.Hidden, b.Hidden)
	num("query width", a.QDim, b.QDim)
	num("key/value width", a.KVDim, b.KVDim)
	num("attention heads", a.Heads, b.Heads)
	num("key/value heads", a.KVHeads, b.KVHeads)
	num("vocabulary", a.Vocab, b.Vocab)
	if !compatibleNames(a.Names, b.Names) {
		diffs = append(diffs, fmt.Sprintf("named %s, not %s", strings.Join(normAll(a.Names), " or "), strings.Join(normAll(b.Names), " or ")))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s is not %s: %s", ErrDifferent, a, b, strings.Join(diffs, "; "))
}

// dirName is the name a model directory or file goes by: its base name
// without .gguf.
func dirName(path string) string {
	return strings.TrimSuffix(filepath.Base(filepath.Clean(path)), ".gguf")
}
