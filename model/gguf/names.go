package gguf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Metadata keys this package writes and reads (gguf-py/gguf/constants.py
// Keys; src/llama-arch.cpp LLM_KV_NAMES).
const (
	KeyArchitecture        = "general.architecture"
	KeyType                = "general.type"
	KeyName                = "general.name"
	KeyBasename            = "general.basename"
	KeyFileType            = "general.file_type"
	KeyQuantizationVersion = "general.quantization_version"
	KeyAdapterType         = "adapter.type"
	KeyLoRAAlpha           = "adapter.lora.alpha"
)

// quantVersion is ggml's GGML_QNT_VERSION, which converters write as
// general.quantization_version.
const quantVersion = uint32(2)

// The architectures whose models and adapters this package exports, as
// llama.cpp names them (src/llama-arch.cpp LLM_ARCH_NAMES).
const (
	ArchQwen3 = "qwen3"
	ArchQwen2 = "qwen2"
	ArchLlama = "llama"
)

// hfArchs maps a Hugging Face config's architectures[0] to llama.cpp's
// architecture (the registrations of convert_hf_to_gguf.py's model classes).
var hfArchs = map[string]string{
	"Qwen3ForCausalLM": ArchQwen3,
	"Qwen2ForCausalLM": ArchQwen2,
	"LlamaForCausalLM": ArchLlama,
}

// modelTypes maps config.json's model_type the same way.
var modelTypes = map[string]string{"qwen3": ArchQwen3, "qwen2": ArchQwen2, "llama": ArchLlama}

// layerTensors maps the per-layer Hugging Face module paths of the three
// architectures (which share them) to llama.cpp's tensor names
// (gguf-py/gguf/tensor_mapping.py TensorNameMap; MODEL_TENSOR_NAMES in
// constants.py).
var layerTensors = map[string]string{
	"input_layernorm":          "attn_norm",
	"self_attn.q_proj":         "attn_q",
	"self_attn.k_proj":         "attn_k",
	"self_attn.v_proj":         "attn_v",
	"self_attn.o_proj":         "attn_output",
	"self_attn.q_norm":         "attn_q_norm",
	"self_attn.k_norm":         "attn_k_norm",
	"post_attention_layernorm": "ffn_norm",
	"mlp.gate_proj":            "ffn_gate",
	"mlp.up_proj":              "ffn_up",
	"mlp.down_proj":            "ffn_down",
}

// loraModules are the module paths a LoRA adapter may adapt: the seven
// projections.
var loraModules = map[string]bool{
	"self_attn.q_proj": true, "self_attn.k_proj": true, "self_attn.v_proj": true, "self_attn.o_proj": true,
	"mlp.gate_proj": true, "mlp.up_proj": true, "mlp.down_proj": true,
}

var layerName = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)\.(weight|bias)$`)

// tensorName maps a Hugging Face tensor name of a qwen3, qwen2 or llama
// model to llama.cpp's ("model.layers.3.mlp.up_proj.weight" →
// "blk.3.ffn_up.weight").
func tensorName(hf string) (string, bool) {
	switch hf {
	case "model.embed_tokens.weight":
		return "token_embd.weight", true
	case "model.norm.weight":
		return "output_norm.weight", true
	case "lm_head.weight":
		return "output.weight", true
	}
	m := layerName.FindStringSubmatch(hf)
	if m == nil {
		return "", false
	}
	t, ok := layerTensors[m[2]]
	if !ok {
		return "", false
	}
	return "blk." + m[1] + "." + t + "." + m[3], true
}

// hfConfig is what the exports read of a Hugging Face config.json.
type hfConfig struct {
	Architectures  []string        `json:"architectures"`
	ModelType      string          `json:"model_type"`
	VocabSize      int             `json:"vocab_size"`
	Hidden         int             `json:"hidden_size"`
	Intermediate   int             `json:"intermediate_size"`
	Layers         int             `json:"num_hidden_layers"`
	Heads          int             `json:"num_attention_heads"`
	KVHeads        int             `json:"num_key_value_heads"`
	HeadDim        int             `json:"head_dim"`
	RMSNormEps     float64         `json:"rms_norm_eps"`
	RopeTheta      float64         `json:"rope_theta"`
	MaxPosition    int             `json:"max_position_embeddings"`
	TiedEmbeddings bool            `json:"tie_word_embeddings"`
	RopeScaling    json.RawMessage `json:"rope_scaling"`
	RopeParameters *struct {
		RopeType  string  `json:"rope_type"`
		RopeTheta float64 `json:"rope_theta"`
	} `json:"rope_parameters"`
	BOS json.RawMessage `json:"bos_token_id"`
	EOS json.RawMessage `json:"eos_token_id"`
	PAD json.RawMessage `json:"pad_token_id"`
	UNK json.RawMessage `json:"unk_token_id"`
}

// arch returns the config's llama.cpp architecture, or "".
func (c hfConfig) arch() string {
	if len(c.Architectures) > 0 {
		if a, ok := hfArchs[c.Architectures[0]]; ok {
			return a
		}
		return ""
	}
	return modelTypes[c.ModelType]
}

func readHFConfig(dir string) (hfConfig, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return hfConfig{}, err
	}
	var c hfConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return hfConfig{}, fmt.Errorf("gguf: %s: %w", filepath.Join(dir, "config.json"), err)
	}
	return c, nil
}

var activeParams = regexp.MustCompile(`-a\d+(\.\d+)?b`)

// archFromName guesses the architecture of a Hugging Face model id such as
// "Qwen/Qwen3-4B": the dense families this package exports, never their
// mixture-of-experts kin ("Qwen3-30B-A3B", "…-MoE"), whose projections are
// named otherwise.
func archFromName(id string) string {
	s := strings.ToLower(id)
	if strings.Contains(s, "moe") || activeParams.MatchString(s) {
		return ""
	}
	switch {
	case strings.Contains(s, "qwen3"):
		if strings.Contains(s, "qwen3-next") || strings.Contains(s, "qwen3-vl") || strings.Contains(s, "qwen3-omni") {
			return ""
		}
		return ArchQwen3
	case strings.Contains(s, "qwen2"):
		if strings.Contains(s, "-vl") || strings.Contains(s, "audio") {
			return ""
		}
		return ArchQwen2
	case strings.Contains(s, "llama"):
		if strings.Contains(s, "llama-4") || strings.Contains(s, "llama4") {
			return ""
		}
		return ArchLlama
	}
	return ""
}
