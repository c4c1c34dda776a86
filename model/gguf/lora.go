package gguf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// The files of a PEFT LoRA adapter directory.
const (
	AdapterConfigFile  = "adapter_config.json"
	AdapterWeightsFile = "adapter_model.safetensors"
)

// ErrUnsupported reports an input the exports cannot convert faithfully.
var ErrUnsupported = errors.New("gguf: unsupported")

// LoRAOptions configure ExportLoRA. The zero value takes everything from
// the adapter directory.
type LoRAOptions struct {
	// Arch is the base model's llama.cpp architecture (ArchQwen3, ArchQwen2
	// or ArchLlama). Empty: found from adapter_config.json's
	// base_model_name_or_path, a model directory's config.json or a model
	// id ("Qwen/Qwen3-4B").
	Arch string
	// BaseDir is the base model's directory, whose config.json gives the
	// architecture and the head counts (llama's q and k are permuted by
	// head). Empty: base_model_name_or_path when it is a directory.
	BaseDir string
	// Type is the tensors' type: TypeF32 (the zero value, as
	// convert_lora_to_gguf.py's default --outtype f32), TypeF16, TypeBF16
	// or TypeQ8_0 (a tensor whose rows are not whole Q8_0 blocks falls back
	// to F16, as the converter does).
	Type TensorType
	// Name is written as general.name. Empty: the adapter directory's name.
	Name string
}

// peftConfig is what ExportLoRA reads of adapter_config.json.
type peftConfig struct {
	PeftType      string                     `json:"peft_type"`
	R             int                        `json:"r"`
	LoraAlpha     float64                    `json:"lora_alpha"`
	BaseModel     string                     `json:"base_model_name_or_path"`
	Bias          string                     `json:"bias"`
	FanInFanOut   bool                       `json:"fan_in_fan_out"`
	UseRSLoRA     bool                       `json:"use_rslora"`
	UseDoRA       bool                       `json:"use_dora"`
	ModulesToSave []string                   `json:"modules_to_save"`
	RankPattern   map[string]json.RawMessage `json:"rank_pattern"`
	AlphaPattern  map[string]json.RawMessage `json:"alpha_pattern"`
}

var peftName = regexp.MustCompile(`^(?:base_model\.model\.)?model\.layers\.(\d+)\.(.+)\.lora_([AB])\.weight$`)

// loraPair is one adapted projection.
type loraPair struct {
	layer  int
	module string // "self_attn.q_proj"
	a, b   string // the PEFT tensor names
}

// ExportLoRA writes the PEFT LoRA adapter in peftDir (adapter_config.json
// and adapter_model.safetensors, F32, F16 or BF16 tensors) to outPath as a
// llama.cpp LoRA adapter GGUF, as convert_lora_to_gguf.py writes one:
// general.type "adapter", adapter.type "lora", adapter.lora.alpha, and for
// each adapted projection blk.N.<tensor>.weight.lora_a, of ggml shape
// {in, r}, and .lora_b, of shape {r, out} (PEFT's A [r, in] and B [out, r]
// as they are; src/llama-adapter.cpp checks the shapes against the base).
//
// llama.cpp scales an adapter by alpha/r, r being lora_b's first
// dimension. An rsLoRA adapter (use_rslora), which PEFT scales by
// alpha/√r, is written with alpha·√r so llama.cpp applies the same scale
// (convert_lora_to_gguf.py does not read use_rslora and would write alpha).
// What cannot be expressed so is refused: DoRA, biases, per-module ranks
// or alphas, saved whole modules, fan_in_fan_out, targets other than the
// seven attention and MLP projections.
func ExportLoRA(peftDir, outPath string, o LoRAOptions) error {
	cb, err := os.ReadFile(filepath.Join(peftDir, AdapterConfigFile))
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	var pc peftConfig
	if err := json.Unmarshal(cb, &pc); err != nil {
		return fmt.Errorf("gguf: %s: %w", AdapterConfigFile, err)
	}
	switch {
	case pc.PeftType != "LORA":
		return fmt.Errorf("%w: peft_type %q (only LORA)", ErrUnsupported, pc.PeftType)
	case pc.UseDoRA:
		return fmt.Errorf("%w: DoRA (use_dora), which llama.cpp does not apply", ErrUnsupported)
	case pc.Bias != "" && pc.Bias != "none":
		return fmt.Errorf("%w: bias %q", ErrUnsupported, pc.Bias)
	case pc.FanInFanOut:
		return fmt.Errorf("%w: fan_in_fan_out", ErrUnsupported)
	case len(pc.ModulesToSave) > 0:
		return fmt.Errorf("%w: modules_to_save %v (whole modules saved beside the adapter)", ErrUnsupported, pc.ModulesToSave)
	case len(pc.RankPattern) > 0 || len(pc.AlphaPattern) > 0:
		return fmt.Errorf("%w: rank_pattern or alpha_pattern (llama.cpp has one alpha per adapter)", ErrUnsupported)
	case pc.R <= 0 || !(pc.LoraAlpha > 0) || math.IsInf(pc.LoraAlpha, 0):
		return fmt.Errorf("%w: r %d, lora_alpha %g", ErrUnsupported, pc.R, pc.LoraAlpha)
	}
	switch o.Type {
	case TypeF32, TypeF16, TypeBF16, TypeQ8_0:
	default:
		return fmt.Errorf("%w: tensor type %s (F32, F16, BF16 or Q8_0)", ErrUnsupported, o.Type)
	}
	base := o.BaseDir
	if base == "" && pc.BaseModel != "" {
		if st, err := os.Stat(filepath.Join(pc.BaseModel, "config.json")); err == nil && !st.IsDir() {
			base = pc.BaseModel
		}
	}
	var bc hfConfig
	if base != "" {
		if bc, err = readHFConfig(base); err != nil {
			return fmt.Errorf("gguf: the base model: %w", err)
		}
	}
	arch := o.Arch
	if arch == "" && base != "" {
		if arch = bc.arch(); arch == "" {
			return fmt.Errorf("%w: base model %s has architecture %v (model_type %q); qwen3, qwen2 and llama are exported",
				ErrUnsupported, base, bc.Architectures, bc.ModelType)
		}
	}
	if arch == "" {
		if arch = archFromName(pc.BaseModel); arch == "" {
			return fmt.Errorf("%w: cannot tell the architecture of base model %q: set the architecture (qwen3, qwen2 or llama) or the base model's directory",
				ErrUnsupported, pc.BaseModel)
		}
	}
	if arch != ArchQwen3 && arch != ArchQwen2 && arch != ArchLlama {
		return fmt.Errorf("%w: architecture %q (qwen3, qwen2 or llama)", ErrUnsupported, arch)
	}
	if arch == ArchLlama && (bc.Heads <= 0) {
		return fmt.Errorf("%w: a llama adapter needs its base model's config.json (the head counts its q and k are permuted by): set the base model's directory", ErrUnsupported)
	}

	st, err := safetensors.ReadFile(filepath.Join(peftDir, AdapterWeightsFile))
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	pairs, err := loraPairs(st)
	if err != nil {
		return err
	}
	name := o.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(peftDir))
	}
	alpha := pc.LoraAlpha
	if pc.UseRSLoRA {
		alpha *= math.Sqrt(float64(pc.R))
	}
	kv := []KV{
		{KeyArchitecture, arch},
		{KeyType, "adapter"},
		{KeyName, name},
		{KeyAdapterType, "lora"},
		{KeyLoRAAlpha, float32(alpha)},
		{KeyQuantizationVersion, quantVersion},
	}

	type job struct {
		src   string
		perm  int // heads to permute the rows by (llama's q and k); 0: none
		shape []int
	}
	var infos []TensorInfo
	var jobs []job
	for _, p := range pairs {
		ai, bi := st.Tensors[p.a], st.Tensors[p.b]
		if len(ai.Shape) != 2 || len(bi.Shape) != 2 || ai.Shape[0] != bi.Shape[1] {
			return fmt.Errorf("%w: %s %v and %s %v are not a LoRA pair (A [r, in], B [out, r])", ErrUnsupported, p.a, ai.Shape, p.b, bi.Shape)
		}
		if ai.Shape[0] != pc.R {
			return fmt.Errorf("%w: %s has rank %d, adapter_config.json says r = %d", ErrUnsupported, p.a, ai.Shape[0], pc.R)
		}
		dst := "blk." + strconv.Itoa(p.layer) + "." + layerTensors[p.module] + ".weight"
		perm := 0
		if arch == ArchLlama {
			// convert_hf_to_gguf.py LlamaModel.modify_tensors permutes q and
			// k by head; on a LoRA pair the permutation falls on B's rows.
			switch p.module {
			case "self_attn.q_proj":
				perm = bc.Heads
			case "self_attn.k_proj":
				perm = bc.Heads
				if bc.KVHeads > 0 {
					perm = bc.KVHeads
				}
			}
			if perm > 0 && bi.Shape[0]%(2*perm) != 0 {
				return fmt.Errorf("%w: %s has %d rows, not a whole number of %d heads", ErrUnsupported, p.b, bi.Shape[0], perm)
			}
		}
		for _, t := range []struct {
			src, dst string
			shape    []int
			perm     int
		}{{p.a, dst + ".lora_a", ai.Shape, 0}, {p.b, dst + ".lora_b", bi.Shape, perm}} {
			ne := []uint64{uint64(t.shape[1]), uint64(t.shape[0])}
			typ := o.Type
			if typ == TypeQ8_0 && ne[0]%q8Block != 0 {
				typ = TypeF16 // convert_hf_to_gguf.py: a QuantError falls back to F16
			}
			infos = append(infos, TensorInfo{Name: t.dst, Shape: ne, Type: typ})
			jobs = append(jobs, job{src: t.src, perm: t.perm, shape: t.shape})
		}
	}
	return createFile(outPath, func(w io.Writer) error {
		gw, err := NewWriter(w, kv, infos)
		if err != nil {
			return err
		}
		for i, j := range jobs {
			data, err := tensorBytes(st, j.src, infos[i].Type, func(v []float32) []float32 {
				if j.perm == 0 {
					return v
				}
				return permuteRows(v, j.shape[0], j.shape[1], j.perm)
			}, j.perm == 0)
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

// loraPairs finds the adapter's LoRA pairs, ordered by layer and module,
// and refuses any other tensor.
func loraPairs(st *safetensors.File) ([]loraPair, error) {
	byKey := map[string]*loraPair{}
	for name := range st.Tensors {
		m := peftName.FindStringSubmatch(name)
		if m == nil {
			if strings.Contains(name, "embed_tokens") || strings.Contains(name, "lm_head") {
				return nil, fmt.Errorf("%w: %s: embeddings in the adapter", ErrUnsupported, name)
			}
			return nil, fmt.Errorf("%w: %s is not a LoRA A or B weight of a decoder layer", ErrUnsupported, name)
		}
		if !loraModules[m[2]] {
			return nil, fmt.Errorf("%w: %s adapts module %q; llama.cpp's names cover q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj", ErrUnsupported, name, m[2])
		}
		layer, err := strconv.Atoi(m[1])
		if err != nil || layer > 1<<20 {
			return nil, fmt.Errorf("%w: %s: layer %q", ErrUnsupported, name, m[1])
		}
		key := m[1] + "." + m[2]
		p := byKey[key]
		if p == nil {
			p = &loraPair{layer: layer, module: m[2]}
			byKey[key] = p
		}
		if m[3] == "A" {
			p.a = name
		} else {
			p.b = name
		}
	}
	var pairs []loraPair
	for _, p := range byKey {
		if p.a == "" || p.b == "" {
			return nil, fmt.Errorf("%w: layer %d %s has only one of lora_A and lora_B", ErrUnsupported, p.layer, p.module)
		}
		pairs = append(pairs, *p)
	}
	if len(pairs) == 0 {
		return nil, fmt.Errorf("%w: the adapter has no LoRA weights", ErrUnsupported)
	}
	order := map[string]int{"self_attn.q_proj": 0, "self_attn.k_proj": 1, "self_attn.v_proj": 2, "self_attn.o_proj": 3,
		"mlp.gate_proj": 4, "mlp.up_proj": 5, "mlp.down_proj": 6}
	slices.SortFunc(pairs, func(x, y loraPair) int {
		if x.layer != y.layer {
			return x.layer - y.layer
		}
		return order[x.module] - order[y.module]
	})
	return pairs, nil
}

// tensorBytes returns the safetensors tensor src as data of type t, through
// float32 and fn; when raw, a tensor already of type t is copied as is.
func tensorBytes(st *safetensors.File, src string, t TensorType, fn func([]float32) []float32, raw bool) ([]byte, error) {
	ti, b, err := st.Raw(src)
	if err != nil {
		return nil, err
	}
	same := (ti.DType == safetensors.F32 && t == TypeF32) || (ti.DType == safetensors.F16 && t == TypeF16) ||
		(ti.DType == safetensors.BF16 && t == TypeBF16)
	if raw && same {
		return b, nil
	}
	switch ti.DType {
	case safetensors.F32, safetensors.F16, safetensors.BF16:
	default:
		return nil, fmt.Errorf("%w: %s is %s (F32, F16 or BF16)", ErrUnsupported, src, ti.DType)
	}
	v := make([]float32, ti.Elems())
	if err := safetensors.Decode(v, ti.DType, b); err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", src, err)
	}
	return Encode(t, fn(v))
}

// permuteRows reorders the rows of v ([rows, cols]) as
// convert_hf_to_gguf.py LlamaModel.permute does: within each of heads
// blocks of rows, the two interleaved halves of the rotary pairs are
// brought together (reshape(heads, 2, rows/heads/2, cols).swapaxes(1, 2)).
func permuteRows(v []float32, rows, cols, heads int) []float32 {
	out := make([]float32, len(v))
	half := rows / heads / 2
	for h := range heads {
		for i := range 2 {
			for j := range half {
				src := (h*2*half + i*half + j) * cols
				dst := (h*2*half + j*2 + i) * cols
				copy(out[dst:dst+cols], v[src:src+cols])
			}
		}
	}
	return out
}
