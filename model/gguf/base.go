package gguf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// BaseOptions configure ExportBase.
type BaseOptions struct {
	// Type is the type of the 2-D weights: TypeF32 (the zero value),
	// TypeF16, TypeBF16 or TypeQ8_0. Vectors and norms are always F32, and
	// a weight whose rows are not whole Q8_0 blocks falls back to F16, as
	// convert_hf_to_gguf.py does.
	Type TensorType
	// Name is written as general.name. Empty: the model directory's name.
	Name string
}

// fileTypes are llama.cpp's LlamaFileType numbers for general.file_type.
var fileTypes = map[TensorType]uint32{TypeF32: 0, TypeF16: 1, TypeQ8_0: 7, TypeBF16: 32}

// Token types of tokenizer.ggml.token_type (gguf-py TokenType).
const (
	tokenNormal      = 1
	tokenControl     = 3
	tokenUserDefined = 4
	tokenUnused      = 5
)

// ExportBase writes the Hugging Face model directory modelDir (config.json;
// model.safetensors, or shards listed by model.safetensors.index.json;
// tokenizer.json; tokenizer_config.json's chat_template and special tokens)
// to outPath as a GGUF model, as convert_hf_to_gguf.py writes a Qwen3:
// the hyperparameters under "qwen3.", the gpt2 BPE tokenizer (pre-tokenizer
// "qwen2", tokens, token types, merges, special token ids), the tensors
// under llama.cpp's names. A model with tied embeddings has no
// output.weight: llama.cpp uses token_embd.weight for both.
func ExportBase(modelDir, outPath string, o BaseOptions) error {
	ft, ok := fileTypes[o.Type]
	if !ok {
		return fmt.Errorf("%w: tensor type %s (F32, F16, BF16 or Q8_0)", ErrUnsupported, o.Type)
	}
	c, err := readHFConfig(modelDir)
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if arch := c.arch(); arch != ArchQwen3 {
		return fmt.Errorf("%w: model architecture %v (model_type %q): only Qwen3ForCausalLM is exported", ErrUnsupported, c.Architectures, c.ModelType)
	}
	ropeTheta := c.RopeTheta
	if rp := c.RopeParameters; rp != nil {
		if rp.RopeType != "" && rp.RopeType != "default" {
			return fmt.Errorf("%w: rope_parameters.rope_type %q", ErrUnsupported, rp.RopeType)
		}
		if rp.RopeTheta != 0 {
			ropeTheta = rp.RopeTheta
		}
	}
	if len(c.RopeScaling) > 0 && string(c.RopeScaling) != "null" {
		return fmt.Errorf("%w: rope_scaling %s", ErrUnsupported, c.RopeScaling)
	}
	if c.Layers <= 0 || c.Hidden <= 0 || c.Heads <= 0 || c.VocabSize <= 0 || c.Intermediate <= 0 {
		return fmt.Errorf("%w: config.json lacks a dimension (%+v)", ErrUnsupported, c)
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	headDim := c.HeadDim
	if headDim == 0 {
		headDim = c.Hidden / c.Heads
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if ropeTheta == 0 {
		ropeTheta = 10000 // transformers' Qwen3Config default
	}
	name := o.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(modelDir))
	}
	const a = ArchQwen3
	kv := []KV{
		{KeyArchitecture, a},
		{KeyType, "model"},
		{KeyName, name},
		{a + ".block_count", uint32(c.Layers)},
	}
	if c.MaxPosition > 0 {
		kv = append(kv, KV{a + ".context_length", uint32(c.MaxPosition)})
	}
	kv = append(kv,
		KV{a + ".embedding_length", uint32(c.Hidden)},
		KV{a + ".feed_forward_length", uint32(c.Intermediate)},
		KV{a + ".attention.head_count", uint32(c.Heads)},
		KV{a + ".attention.head_count_kv", uint32(c.KVHeads)},
		KV{a + ".rope.freq_base", float32(ropeTheta)},
		KV{a + ".attention.layer_norm_rms_epsilon", float32(c.RMSNormEps)},
		KV{a + ".attention.key_length", uint32(headDim)},
		KV{a + ".attention.value_length", uint32(headDim)},
		KV{KeyFileType, ft},
		KV{KeyQuantizationVersion, quantVersion},
	)
	tok, err := readTokenizer(modelDir, c)
	if err != nil {
		return err
	}
	kv = append(kv, tok...)

	files, err := openWeights(modelDir)
	if err != nil {
		return err
	}
	type job struct {
		f   *safetensors.File
		src string
	}
	var infos []TensorInfo
	var jobs []job
	seen := map[string]bool{}
	for _, f := range files {
		for _, src := range f.Names() {
			if src == "lm_head.weight" && c.TiedEmbeddings {
				continue // tied: llama.cpp reads token_embd.weight for the output
			}
			if strings.HasSuffix(src, ".rotary_emb.inv_freq") {
				continue // convert_hf_to_gguf.py skips these buffers too
			}
			dst, ok := tensorName(src)
			if !ok {
				return fmt.Errorf("%w: tensor %s has no llama.cpp name", ErrUnsupported, src)
			}
			if seen[dst] {
				return fmt.Errorf("%w: tensor %s appears twice", ErrUnsupported, src)
			}
			seen[dst] = true
			ti := f.Tensors[src]
			ne := make([]uint64, len(ti.Shape))
			for i, d := range ti.Shape {
				ne[len(ne)-1-i] = uint64(d)
			}
			if len(ne) == 0 || len(ne) > MaxDims {
				return fmt.Errorf("%w: tensor %s has shape %v", ErrUnsupported, src, ti.Shape)
			}
			typ := o.Type
			if len(ne) <= 1 || strings.HasSuffix(dst, "_norm.weight") {
				typ = TypeF32
			} else if typ == TypeQ8_0 && ne[0]%q8Block != 0 {
				typ = TypeF16
			}
			infos = append(infos, TensorInfo{Name: dst, Shape: ne, Type: typ})
			jobs = append(jobs, job{f, src})
		}
	}
	need := []string{"token_embd.weight", "output_norm.weight"}
	if !c.TiedEmbeddings {
		need = append(need, "output.weight")
	}
	for l := range c.Layers {
		for _, t := range layerTensors {
			need = append(need, fmt.Sprintf("blk.%d.%s.weight", l, t))
		}
	}
	for _, n := range need {
		if !seen[n] {
			return fmt.Errorf("%w: the model lacks %s", ErrUnsupported, n)
		}
	}
	if len(seen) != len(need) {
		return fmt.Errorf("%w: %d tensors, a Qwen3 of %d layers has %d", ErrUnsupported, len(seen), c.Layers, len(need))
	}
	identity := func(v []float32) []float32 { return v }
	return createFile(outPath, func(w io.Writer) error {
		gw, err := NewWriter(w, kv, infos)
		if err != nil {
			return err
		}
		for i, j := range jobs {
			data, err := tensorBytes(j.f, j.src, infos[i].Type, identity, true)
			if err != nil {
				return err
			}
			if err := gw.WriteTensor(data); err != nil {
				return err
			}
		}
		return gw.Close()
	})
}

// openWeights reads model.safetensors, or the shards its index lists.
func openWeights(dir string) ([]*safetensors.File, error) {
	one := filepath.Join(dir, "model.safetensors")
	if _, err := os.Stat(one); err == nil {
		f, err := safetensors.ReadFile(one)
		if err != nil {
			return nil, fmt.Errorf("gguf: %w", err)
		}
		return []*safetensors.File{f}, nil
	}
	ib, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("gguf: %s has neither model.safetensors nor model.safetensors.index.json", dir)
	} else if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(ib, &idx); err != nil {
		return nil, fmt.Errorf("gguf: model.safetensors.index.json: %w", err)
	}
	var shards []string
	for _, s := range idx.WeightMap {
		if s != filepath.Base(s) || s == "." || s == ".." {
			return nil, fmt.Errorf("gguf: model.safetensors.index.json names shard %q outside the directory", s)
		}
		if !slices.Contains(shards, s) {
			shards = append(shards, s)
		}
	}
	slices.Sort(shards)
	var files []*safetensors.File
	for _, s := range shards {
		f, err := safetensors.ReadFile(filepath.Join(dir, s))
		if err != nil {
			return nil, fmt.Errorf("gguf: %w", err)
		}
		for name := range f.Tensors {
			if idx.WeightMap[name] != s {
				return nil, fmt.Errorf("gguf: shard %s holds %s, which the index places in %q", s, name, idx.WeightMap[name])
			}
		}
		files = append(files, f)
	}
	return files, nil
}

// tokenizerJSON is what readTokenizer reads of tokenizer.json.
type tokenizerJSON struct {
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Model struct {
		Type   string          `json:"type"`
		Vocab  map[string]int  `json:"vocab"`
		Merges json.RawMessage `json:"merges"`
	} `json:"model"`
}

// readTokenizer builds the tokenizer metadata as convert_hf_to_gguf.py's
// _set_vocab_gpt2 and gguf-py's SpecialVocab do.
func readTokenizer(dir string, c hfConfig) ([]KV, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, fmt.Errorf("gguf: tokenizer.json: %w", err)
	}
	if tj.Model.Type != "BPE" {
		return nil, fmt.Errorf("%w: tokenizer model %q (a BPE tokenizer.json is exported)", ErrUnsupported, tj.Model.Type)
	}
	n := c.VocabSize
	tokens := make([]string, n)
	types := make([]int32, n)
	set := make([]bool, n)
	put := func(id int, s string, typ int32) error {
		if id < 0 || id >= n {
			return fmt.Errorf("%w: token %q has id %d outside the vocabulary of %d", ErrUnsupported, s, id, n)
		}
		tokens[id], types[id], set[id] = s, typ, true
		return nil
	}
	for s, id := range tj.Model.Vocab {
		if err := put(id, s, tokenNormal); err != nil {
			return nil, err
		}
	}
	for _, at := range tj.AddedTokens {
		typ := int32(tokenUserDefined)
		if at.Special || looksSpecial(at.Content) {
			typ = tokenControl
		}
		if err := put(at.ID, at.Content, typ); err != nil {
			return nil, err
		}
	}
	for i := range n {
		if !set[i] {
			tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), tokenUnused
		}
	}
	merges, err := readMerges(tj.Model.Merges)
	if err != nil {
		return nil, err
	}
	kv := []KV{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", "qwen2"},
		{"tokenizer.ggml.tokens", Strings(tokens)},
		{"tokenizer.ggml.token_type", Int32s(types)},
		{"tokenizer.ggml.merges", Strings(merges)},
	}

	// Special tokens: tokenizer_config.json's <typ>_token matched against
	// the added tokens, then config.json's <typ>_token_id (an int);
	// add_<typ>_token flags from tokenizer_config.json.
	var tc map[string]json.RawMessage
	if b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		if err := json.Unmarshal(b, &tc); err != nil {
			return nil, fmt.Errorf("gguf: tokenizer_config.json: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	ids := map[string]int{}
	var adds []KV
	fromConfig := map[string]json.RawMessage{"bos": c.BOS, "eos": c.EOS, "pad": c.PAD, "unk": c.UNK}
	keyOf := map[string]string{"bos": "bos", "eos": "eos", "unk": "unknown", "sep": "seperator", "pad": "padding", "cls": "cls", "mask": "mask"}
	for _, typ := range []string{"bos", "eos", "unk", "sep", "pad", "cls", "mask"} {
		var add bool
		if json.Unmarshal(tc["add_"+typ+"_token"], &add) == nil && tc["add_"+typ+"_token"] != nil {
			adds = append(adds, KV{"tokenizer.ggml.add_" + typ + "_token", add})
		}
		content := ""
		var s string
		var obj struct {
			Content string `json:"content"`
		}
		if json.Unmarshal(tc[typ+"_token"], &s) == nil {
			content = s
		} else if json.Unmarshal(tc[typ+"_token"], &obj) == nil {
			content = obj.Content
		}
		if content != "" {
			for _, at := range tj.AddedTokens {
				if at.Content == content {
					if at.ID < n {
						ids[typ] = at.ID
					}
					break
				}
			}
		}
		if _, ok := ids[typ]; !ok {
			var id int
			if raw := fromConfig[typ]; raw != nil && json.Unmarshal(raw, &id) == nil && id >= 0 && id < n {
				ids[typ] = id
			}
		}
	}
	for _, typ := range []string{"bos", "eos", "unk", "sep", "pad", "cls", "mask"} {
		if id, ok := ids[typ]; ok {
			kv = append(kv, KV{"tokenizer.ggml." + keyOf[typ] + "_token_id", uint32(id)})
		}
	}
	kv = append(kv, adds...)
	var tmpl string
	if json.Unmarshal(tc["chat_template"], &tmpl) == nil && tmpl != "" {
		kv = append(kv, KV{"tokenizer.chat_template", tmpl})
	} else if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		kv = append(kv, KV{"tokenizer.chat_template", string(b)})
	}
	return kv, nil
}

// readMerges reads tokenizer.json's merges, "a b" strings or ["a", "b"]
// pairs; a space inside a pair's token is written as U+0120, as gguf-py's
// SpecialVocab does.
func readMerges(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("%w: tokenizer.json has no merges", ErrUnsupported)
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		return strs, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("gguf: tokenizer.json merges: %w", err)
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = strings.ReplaceAll(p[0], " ", "\u0120") + " " + strings.ReplaceAll(p[1], " ", "\u0120")
	}
	return out, nil
}

// looksSpecial is convert_hf_to_gguf.py's does_token_look_special.
func looksSpecial(s string) bool {
	switch s {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return (strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>")) ||
		(strings.HasPrefix(s, "<｜") && strings.HasSuffix(s, "｜>")) ||
		(strings.HasPrefix(s, "<unused") && strings.HasSuffix(s, ">"))
}
