package native

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// Config is a Qwen3-shaped model's architecture, as HF's config.json spells
// it. Zero fields take defaults where HF has them (HeadDim = Hidden/Heads,
// KVHeads = Heads, RMSNormEps 1e-6, RopeTheta 1e6, MaxPosition 32768).
type Config struct {
	Arch           string  `json:"model_type"`
	VocabSize      int     `json:"vocab_size"`
	Hidden         int     `json:"hidden_size"`
	Intermediate   int     `json:"intermediate_size"`
	Layers         int     `json:"num_hidden_layers"`
	Heads          int     `json:"num_attention_heads"`
	KVHeads        int     `json:"num_key_value_heads"`
	HeadDim        int     `json:"head_dim"`
	RMSNormEps     float64 `json:"rms_norm_eps"`
	RopeTheta      float64 `json:"rope_theta"`
	TiedEmbeddings bool    `json:"tie_word_embeddings"`
	MaxPosition    int     `json:"max_position_embeddings"`
	// EOS lists the end-of-sequence token ids (config.json's eos_token_id,
	// an int or a list).
	EOS []int `json:"-"`
}

func (c *Config) defaults() {
	if c.Arch == "" {
		c.Arch = "qwen3"
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 1e6
	}
	if c.MaxPosition == 0 {
		c.MaxPosition = 32768
	}
}

// Validate checks the shape is one the engine can run.
func (c Config) Validate() error {
	switch {
	case c.VocabSize <= 0, c.Hidden <= 0, c.Intermediate <= 0, c.Layers <= 0, c.Heads <= 0,
		c.KVHeads <= 0, c.HeadDim <= 0, c.MaxPosition <= 0:
		return fmt.Errorf("%w: non-positive dimension in %+v", ErrConfig, c)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%w: %d heads not a multiple of %d kv heads", ErrConfig, c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("%w: odd head_dim %d", ErrConfig, c.HeadDim)
	case c.RMSNormEps <= 0 || c.RopeTheta <= 1:
		return fmt.Errorf("%w: rms_norm_eps %g, rope_theta %g", ErrConfig, c.RMSNormEps, c.RopeTheta)
	}
	for _, e := range c.EOS {
		if e < 0 || e >= c.VocabSize {
			return fmt.Errorf("%w: eos id %d outside vocab", ErrConfig, e)
		}
	}
	return nil
}

type hfConfig struct {
	Config
	Architectures []string        `json:"architectures"`
	EOSRaw        json.RawMessage `json:"eos_token_id,omitempty"`
	TorchDType    string          `json:"torch_dtype,omitempty"`
	// Features the engine does not implement; a model using them is refused
	// rather than run wrongly.
	AttentionBias bool            `json:"attention_bias,omitempty"`
	RopeScaling   json.RawMessage `json:"rope_scaling,omitempty"`
	// RopeParameters is where newer transformers releases write the RoPE
	// settings ({"rope_type": "default", "rope_theta": ...}).
	RopeParameters *struct {
		RopeType  string  `json:"rope_type"`
		RopeTheta float64 `json:"rope_theta"`
	} `json:"rope_parameters,omitempty"`
	UseSlidingWindow bool   `json:"use_sliding_window,omitempty"`
	HiddenAct        string `json:"hidden_act,omitempty"`
}

func (c Config) marshal() ([]byte, error) {
	h := hfConfig{Config: c, Architectures: []string{"Qwen3ForCausalLM"}, TorchDType: "float32"}
	switch len(c.EOS) {
	case 0:
	case 1:
		h.EOSRaw, _ = json.Marshal(c.EOS[0])
	default:
		h.EOSRaw, _ = json.Marshal(c.EOS)
	}
	// Flatten: embed Config's fields plus the extras.
	b, err := json.Marshal(h.Config)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["architectures"] = h.Architectures
	m["torch_dtype"] = h.TorchDType
	m["hidden_act"] = "silu"
	m["attention_bias"] = false
	if h.EOSRaw != nil {
		m["eos_token_id"] = h.EOSRaw
	}
	return json.MarshalIndent(m, "", "  ")
}

// hfQwen3Defaults are transformers' Qwen3Config defaults for the keys where
// they differ from Config.defaults (which serves configs built in Go): a
// config.json that leaves them out means these, as it does to transformers.
var hfQwen3Defaults = Config{KVHeads: 32, HeadDim: 128, RopeTheta: 10000}

func parseConfig(b []byte) (Config, error) {
	h := hfConfig{Config: hfQwen3Defaults} // what the JSON does not set stays
	if err := json.Unmarshal(b, &h); err != nil {
		return Config{}, fmt.Errorf("%w: config.json: %v", ErrConfig, err)
	}
	// hfConfig embeds Config, whose fields decode through the embedding.
	c := h.Config
	if rp := h.RopeParameters; rp != nil {
		if rp.RopeType != "" && rp.RopeType != "default" {
			return Config{}, fmt.Errorf("%w: unsupported feature (rope_parameters.rope_type %q)", ErrConfig, rp.RopeType)
		}
		if rp.RopeTheta != 0 {
			c.RopeTheta = rp.RopeTheta
		}
	}
	if h.AttentionBias || h.UseSlidingWindow || (len(h.RopeScaling) > 0 && string(h.RopeScaling) != "null") ||
		(h.HiddenAct != "" && h.HiddenAct != "silu") {
		return Config{}, fmt.Errorf("%w: unsupported feature (attention bias, sliding window, rope scaling or activation %q)", ErrConfig, h.HiddenAct)
	}
	if len(h.EOSRaw) > 0 && string(h.EOSRaw) != "null" {
		var one int
		if json.Unmarshal(h.EOSRaw, &one) == nil {
			c.EOS = []int{one}
		} else if err := json.Unmarshal(h.EOSRaw, &c.EOS); err != nil {
			return Config{}, fmt.Errorf("%w: eos_token_id: %v", ErrConfig, err)
		}
	}
	c.defaults()
	return c, c.Validate()
}

// layerWeights are one decoder layer's frozen weights, [out, in] row-major.
type layerWeights struct {
	attnNorm, mlpNorm []float32 // [H]
	qNorm, kNorm      []float32 // [D]
	proj              [numModules][]float32
}

// weights are the frozen base model.
type weights struct {
	cfg    Config
	embed  []float32 // [V, H]
	layers []layerWeights
	norm   []float32 // [H]
	lmHead []float32 // [V, H]; aliases embed when tied
}

// module indexes the seven projections LoRA can adapt.
type module int

const (
	modQ module = iota
	modK
	modV
	modO
	modGate
	modUp
	modDown
	numModules
)

var moduleNames = [numModules]string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

func (m module) hfName() string {
	if m <= modO {
		return "self_attn." + moduleNames[m]
	}
	return "mlp." + moduleNames[m]
}

// dims returns a module's (out, in).
func (c Config) dims(m module) (int, int) {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	switch m {
	case modQ:
		return q, c.Hidden
	case modK, modV:
		return kv, c.Hidden
	case modO:
		return c.Hidden, q
	case modGate, modUp:
		return c.Intermediate, c.Hidden
	default:
		return c.Hidden, c.Intermediate
	}
}

// tensorShapes lists every HF tensor name of the model with its shape.
func (c Config) tensorShapes() map[string][]int {
	s := map[string][]int{
		"model.embed_tokens.weight": {c.VocabSize, c.Hidden},
		"model.norm.weight":         {c.Hidden},
	}
	if !c.TiedEmbeddings {
		s["lm_head.weight"] = []int{c.VocabSize, c.Hidden}
	}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		s[p+"input_layernorm.weight"] = []int{c.Hidden}
		s[p+"post_attention_layernorm.weight"] = []int{c.Hidden}
		s[p+"self_attn.q_norm.weight"] = []int{c.HeadDim}
		s[p+"self_attn.k_norm.weight"] = []int{c.HeadDim}
		for m := module(0); m < numModules; m++ {
			out, in := c.dims(m)
			s[p+m.hfName()+".weight"] = []int{out, in}
		}
	}
	return s
}

// bind fills the weight struct from a name → tensor lookup.
func bind(c Config, get func(name string, shape []int) ([]float32, error)) (*weights, error) {
	w := &weights{cfg: c, layers: make([]layerWeights, c.Layers)}
	shapes := c.tensorShapes()
	g := func(name string) ([]float32, error) { return get(name, shapes[name]) }
	var err error
	if w.embed, err = g("model.embed_tokens.weight"); err != nil {
		return nil, err
	}
	if w.norm, err = g("model.norm.weight"); err != nil {
		return nil, err
	}
	if c.TiedEmbeddings {
		w.lmHead = w.embed
	} else if w.lmHead, err = g("lm_head.weight"); err != nil {
		return nil, err
	}
	for l := range w.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		lw := &w.layers[l]
		for _, t := range []struct {
			dst  *[]float32
			name string
		}{{&lw.attnNorm, "input_layernorm"}, {&lw.mlpNorm, "post_attention_layernorm"},
			{&lw.qNorm, "self_attn.q_norm"}, {&lw.kNorm, "self_attn.k_norm"}} {
			if *t.dst, err = g(p + t.name + ".weight"); err != nil {
				return nil, err
			}
		}
		for m := module(0); m < numModules; m++ {
			if lw.proj[m], err = g(p + m.hfName() + ".weight"); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}

// ReadConfig reads the architecture of the HF model directory dir (its
// config.json), refusing what the engine cannot run.
func ReadConfig(dir string) (Config, error) {
	cb, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return parseConfig(cb)
}

// loadDir reads an HF model directory: config.json and model.safetensors, or
// shards listed in model.safetensors.index.json. F32, BF16 and F16 tensors
// are widened to float32.
func loadDir(dir string) (*weights, error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	files := map[string]*safetensors.File{}
	shardOf := func(string) string { return "model.safetensors" }
	if ib, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(ib, &idx); err != nil {
			return nil, fmt.Errorf("%w: index: %v", ErrModel, err)
		}
		shardOf = func(n string) string { return idx.WeightMap[n] }
	}
	get := func(name string, shape []int) ([]float32, error) {
		shard := shardOf(name)
		if shard == "" || filepath.Base(shard) != shard {
			return nil, fmt.Errorf("%w: no shard for %s", ErrModel, name)
		}
		f := files[shard]
		if f == nil {
			if f, err = safetensors.ReadFile(filepath.Join(dir, shard)); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrModel, err)
			}
			files[shard] = f
		}
		v, got, err := f.Float32(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrModel, err)
		}
		if !sameShape(got, shape) {
			return nil, fmt.Errorf("%w: %s has shape %v, config says %v", ErrModel, name, got, shape)
		}
		return v, nil
	}
	return bind(cfg, get)
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// randomWeights builds a random model: projections normal with std
// 1/√fan_in, embeddings with std 3/√Hidden (so tied logits have a spread of
// a few nats), norm weights near 1 (perturbed, so that tests see them).
func randomWeights(c Config, seed uint64) *weights {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	std := float32(1 / math.Sqrt(float64(c.Hidden)))
	get := func(name string, shape []int) ([]float32, error) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		if len(shape) == 1 {
			for i := range v {
				v[i] = 1 + 0.1*float32(r.NormFloat64())
			}
			return v, nil
		}
		s := std
		if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
			s = 3 * std
		} else if shape[1] != c.Hidden {
			s = float32(1 / math.Sqrt(float64(shape[1])))
		}
		for i := range v {
			v[i] = s * float32(r.NormFloat64())
		}
		return v, nil
	}
	w, _ := bind(c, get)
	return w
}

// save writes the model as an HF directory in dtype dt.
func (w *weights) save(dir string, dt safetensors.DType) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cb, err := w.cfg.marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cb, 0o644); err != nil {
		return err
	}
	shapes := w.cfg.tensorShapes()
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	vals := map[string][]float32{"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm}
	if !w.cfg.TiedEmbeddings {
		vals["lm_head.weight"] = w.lmHead
	}
	for l, lw := range w.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		vals[p+"input_layernorm.weight"] = lw.attnNorm
		vals[p+"post_attention_layernorm.weight"] = lw.mlpNorm
		vals[p+"self_attn.q_norm.weight"] = lw.qNorm
		vals[p+"self_attn.k_norm.weight"] = lw.kNorm
		for m := module(0); m < numModules; m++ {
			vals[p+m.hfName()+".weight"] = lw.proj[m]
		}
	}
	ts := make([]safetensors.Tensor, 0, len(names))
	for _, n := range names {
		t, err := safetensors.F32Tensor(n, dt, shapes[n], vals[n])
		if err != nil {
			return err
		}
		ts = append(ts, t)
	}
	return safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"})
}

// TinyConfig is the default tiny model: small enough to train in a test.
func TinyConfig(vocab int) Config {
	c := Config{VocabSize: vocab, Hidden: 64, Intermediate: 128, Layers: 2, Heads: 4, KVHeads: 2,
		HeadDim: 16, RopeTheta: 10000, RMSNormEps: 1e-6, TiedEmbeddings: true, MaxPosition: 2048}
	if vocab > 0 {
		c.EOS = []int{vocab - 1}
	}
	c.defaults()
	return c
}

// CreateTiny writes a random model of shape cfg (see TinyConfig) to dir as
// an HF model directory (config.json + model.safetensors, F32).
func CreateTiny(dir string, cfg Config, seed uint64) error {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	return randomWeights(cfg, seed).save(dir, safetensors.F32)
}
