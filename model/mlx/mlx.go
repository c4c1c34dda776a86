package mlx

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// Sentinel errors.
var (
	// ErrPEFT: the directory handed to Export is not a PEFT LoRA adapter
	// (missing or malformed files, tensors that do not pair up).
	ErrPEFT = errors.New("mlx: not a PEFT LoRA adapter")
	// ErrUnsupported: the PEFT adapter uses something mlx-lm's LoRALinear
	// cannot express (DoRA, biases, per-module ranks, an embedding, ...).
	ErrUnsupported = errors.New("mlx: the adapter cannot be expressed as an mlx-lm LoRA adapter")
	// ErrFormat: a directory handed to Read is not one mlx-lm's
	// load_adapters would load.
	ErrFormat = errors.New("mlx: not an mlx-lm adapter")
)

// File names of an mlx-lm adapter directory (mlx_lm/tuner/utils.py
// load_adapters) and of a PEFT one.
const (
	ConfigFile      = "adapter_config.json"
	WeightsFile     = "adapters.safetensors"
	PEFTConfigFile  = "adapter_config.json"
	PEFTWeightsFile = "adapter_model.safetensors"
)

// AllLayers is the num_layers that puts LoRA on every decoder layer:
// load_adapters converts model.layers[-max(num_layers, 0):], the whole
// list for -1 (`mlx_lm.lora --num-layers -1`).
const AllLayers = -1

// Config is adapter_config.json as mlx-lm's load_adapters reads it.
type Config struct {
	// FineTuneType is "lora" (load_adapters' default when absent); "dora"
	// and "full" are mlx-lm's other kinds, which Read refuses.
	FineTuneType string `json:"fine_tune_type"`
	// NumLayers: LoRA goes on the last NumLayers decoder layers; 0 or
	// less, or more than the model has, means all of them.
	NumLayers int `json:"num_layers"`
	// LoRAParameters is what linear_to_lora_layers reads.
	LoRAParameters LoRAParameters `json:"lora_parameters"`
	// Model is the base model the adapter was made for (mlx_lm.lora
	// writes its --model here; load_adapters does not read it).
	Model string `json:"model,omitempty"`
}

// LoRAParameters is adapter_config.json's lora_parameters.
type LoRAParameters struct {
	Rank int `json:"rank"`
	// Scale multiplies (x @ lora_a) @ lora_b as it is (LoRALinear.__call__):
	// PEFT's lora_alpha/r, not an alpha.
	Scale   float64 `json:"scale"`
	Dropout float64 `json:"dropout"`
	// Keys are the module paths inside a decoder layer that get LoRA
	// ("self_attn.q_proj"); nil means every linear layer of it.
	Keys []string `json:"keys"`
}

// Module is one adapted linear layer as mlx-lm's LoRALinear holds it.
type Module struct {
	Layer int    // the decoder layer's index
	Key   string // the module's path inside the layer, "self_attn.q_proj"
	// In, Out and Rank are the dimensions: lora_a is [In, Rank], lora_b
	// [Rank, Out], the base weight [Out, In].
	In, Out, Rank int
	A, B          []float32 // lora_a and lora_b, row-major
	Scale         float64
}

// Name is the module's parameter path in mlx-lm's model:
// "model.layers.3.self_attn.q_proj".
func (m Module) Name() string { return fmt.Sprintf("model.layers.%d.%s", m.Layer, m.Key) }

// Delta returns what LoRALinear.fuse adds to the module's weight:
// (scale·lora_bᵀ) @ lora_aᵀ, [Out, In] row-major, in float64.
func (m Module) Delta() []float64 {
	d := make([]float64, m.Out*m.In)
	for o := range m.Out {
		for i := range m.In {
			var s float64
			for k := range m.Rank {
				s += float64(m.A[i*m.Rank+k]) * float64(m.B[k*m.Out+o])
			}
			d[o*m.In+i] = m.Scale * s
		}
	}
	return d
}

// Adapter is an mlx-lm adapter directory as Read finds it.
type Adapter struct {
	Config  Config
	Modules []Module // by layer, then key
}

// --- Export ---

// peftConfig is what Export reads of PEFT's LoraConfig.
type peftConfig struct {
	PeftType      string                     `json:"peft_type"`
	R             int                        `json:"r"`
	LoraAlpha     float64                    `json:"lora_alpha"`
	LoraDropout   float64                    `json:"lora_dropout"`
	UseRSLoRA     bool                       `json:"use_rslora"`
	UseDoRA       bool                       `json:"use_dora"`
	Bias          string                     `json:"bias"`
	FanInFanOut   bool                       `json:"fan_in_fan_out"`
	ModulesToSave []string                   `json:"modules_to_save"`
	RankPattern   map[string]json.RawMessage `json:"rank_pattern"`
	AlphaPattern  map[string]json.RawMessage `json:"alpha_pattern"`
	BaseModel     string                     `json:"base_model_name_or_path"`
}

// peftName matches a PEFT LoRA tensor of a decoder layer's projection, as
// PEFT saves it for a *ForCausalLM (the "default" adapter name dropped):
// base_model.model.model.layers.<L>.<key>.lora_<A|B>.weight. The seven keys
// are the projections mlx-lm's qwen3, qwen2 and llama models name alike.
var peftName = regexp.MustCompile(`^base_model\.model\.model\.layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)\.lora_([AB])\.weight$`)

// layerKeys are the module paths inside a decoder layer that Export maps:
// mlx-lm's Qwen3, Qwen2 and Llama name them as Hugging Face does.
var layerKeys = [...]string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
	"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}

// maxConfig bounds the adapter_config.json either reader accepts.
const maxConfig = 1 << 20

// Export reads the PEFT LoRA adapter in peftDir and writes it to outDir
// (created if missing) as an mlx-lm adapter directory: adapter_config.json
// and adapters.safetensors (each written to a temporary file and renamed
// into place). What mlx-lm cannot express is refused with ErrUnsupported,
// a malformed adapter with ErrPEFT.
func Export(peftDir, outDir string) error {
	pc, f, err := readPEFT(peftDir)
	if err != nil {
		return err
	}
	scale := pc.LoraAlpha / float64(pc.R)
	if pc.UseRSLoRA {
		scale = pc.LoraAlpha / math.Sqrt(float64(pc.R))
	}
	type pair struct{ a, b string }
	mods := map[[2]string]*pair{} // (layer, key) → tensor names
	var order [][2]string
	for _, name := range f.Names() {
		m := peftName.FindStringSubmatch(name)
		if m == nil {
			return fmt.Errorf("%w: tensor %q: %s", ErrUnsupported, name, whyNot(name))
		}
		id := [2]string{m[1], m[2]}
		p := mods[id]
		if p == nil {
			p = &pair{}
			mods[id] = p
			order = append(order, id)
		}
		if m[3] == "A" {
			p.a = name
		} else {
			p.b = name
		}
	}
	if len(order) == 0 {
		return fmt.Errorf("%w: %s holds no LoRA tensors", ErrPEFT, PEFTWeightsFile)
	}
	var ts []safetensors.Tensor
	keys := map[string]bool{}
	for _, id := range order {
		p := mods[id]
		if p.a == "" || p.b == "" {
			return fmt.Errorf("%w: layer %s %s has lora_A without lora_B or the reverse", ErrPEFT, id[0], id[1])
		}
		ta, a, err := f.Raw(p.a)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPEFT, err)
		}
		tb, b, err := f.Raw(p.b)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPEFT, err)
		}
		// PEFT: lora_A.weight [r, in], lora_B.weight [out, r].
		if len(ta.Shape) != 2 || len(tb.Shape) != 2 || ta.Shape[1] <= 0 || tb.Shape[0] <= 0 {
			return fmt.Errorf("%w: %s has shape %v and %s %v, want [r, in] and [out, r]", ErrPEFT, p.a, ta.Shape, p.b, tb.Shape)
		}
		if ta.Shape[0] != pc.R || tb.Shape[1] != pc.R {
			return fmt.Errorf("%w: %s has rank %d and %s rank %d where r is %d: mlx-lm has one rank per adapter", ErrUnsupported, p.a, ta.Shape[0], p.b, tb.Shape[1], pc.R)
		}
		for _, t := range []struct {
			name string
			ti   safetensors.TensorInfo
		}{{p.a, ta}, {p.b, tb}} {
			if !floatType(t.ti.DType) {
				return fmt.Errorf("%w: %s is %s; mlx-lm adapters hold F32, F16 or BF16", ErrUnsupported, t.name, t.ti.DType)
			}
			v, _, err := f.Float32(t.name)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrPEFT, err)
			}
			for _, x := range v {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return fmt.Errorf("%w: %s is not finite", ErrPEFT, t.name)
				}
			}
		}
		in, out := ta.Shape[1], tb.Shape[0]
		base := "model.layers." + id[0] + "." + id[1]
		// mlx-lm: lora_a [in, r] = Aᵀ, lora_b [r, out] = Bᵀ.
		ts = append(ts,
			safetensors.Tensor{Name: base + ".lora_a", DType: ta.DType, Shape: []int{in, pc.R}, Data: transpose(a, pc.R, in, ta.DType.Size())},
			safetensors.Tensor{Name: base + ".lora_b", DType: tb.DType, Shape: []int{pc.R, out}, Data: transpose(b, out, pc.R, tb.DType.Size())})
		keys[id[1]] = true
	}
	sort.Slice(ts, func(i, j int) bool { return tensorLess(ts[i].Name, ts[j].Name) })
	cfg := Config{
		FineTuneType: "lora",
		NumLayers:    AllLayers,
		LoRAParameters: LoRAParameters{
			Rank: pc.R, Scale: scale, Dropout: pc.LoraDropout,
			Keys: slices.DeleteFunc(slices.Clone(layerKeys[:]), func(k string) bool { return !keys[k] }),
		},
		Model: pc.BaseModel,
	}
	cb, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	if err := safetensors.WriteFile(filepath.Join(outDir, WeightsFile), ts, map[string]string{"format": "mlx"}); err != nil {
		return err
	}
	return writeFile(filepath.Join(outDir, ConfigFile), append(cb, '\n'))
}

// readPEFT reads and checks a PEFT adapter directory's config and weights.
func readPEFT(dir string) (peftConfig, *safetensors.File, error) {
	var pc peftConfig
	cb, err := readLimited(filepath.Join(dir, PEFTConfigFile), maxConfig)
	if err != nil {
		return pc, nil, fmt.Errorf("%w: %v", ErrPEFT, err)
	}
	if err := json.Unmarshal(cb, &pc); err != nil {
		return pc, nil, fmt.Errorf("%w: %s: %v", ErrPEFT, PEFTConfigFile, err)
	}
	switch {
	case pc.PeftType != "" && pc.PeftType != "LORA":
		return pc, nil, fmt.Errorf("%w: peft_type %q (only LORA)", ErrUnsupported, pc.PeftType)
	case pc.UseDoRA:
		return pc, nil, fmt.Errorf("%w: use_dora: mlx-lm's DoRA keeps its magnitude in another form", ErrUnsupported)
	case pc.Bias != "" && pc.Bias != "none":
		return pc, nil, fmt.Errorf("%w: bias %q: mlx-lm's LoRALinear trains no bias", ErrUnsupported, pc.Bias)
	case pc.FanInFanOut:
		return pc, nil, fmt.Errorf("%w: fan_in_fan_out (Conv1D weights)", ErrUnsupported)
	case len(pc.ModulesToSave) > 0:
		return pc, nil, fmt.Errorf("%w: modules_to_save %v: an mlx-lm LoRA adapter holds no whole modules", ErrUnsupported, pc.ModulesToSave)
	case len(pc.RankPattern) > 0 || len(pc.AlphaPattern) > 0:
		return pc, nil, fmt.Errorf("%w: rank_pattern or alpha_pattern: mlx-lm has one rank and one scale per adapter", ErrUnsupported)
	case pc.R <= 0 || pc.R > 1<<16:
		return pc, nil, fmt.Errorf("%w: r %d", ErrPEFT, pc.R)
	case !(pc.LoraAlpha > 0) || math.IsInf(pc.LoraAlpha, 0):
		return pc, nil, fmt.Errorf("%w: lora_alpha %g", ErrPEFT, pc.LoraAlpha)
	case pc.LoraDropout < 0 || pc.LoraDropout >= 1:
		return pc, nil, fmt.Errorf("%w: lora_dropout %g", ErrPEFT, pc.LoraDropout)
	}
	f, err := safetensors.ReadFile(filepath.Join(dir, PEFTWeightsFile))
	if err != nil {
		return pc, nil, fmt.Errorf("%w: %v", ErrPEFT, err)
	}
	return pc, f, nil
}

// whyNot says why a PEFT tensor name has no mlx-lm LoRALinear to go to.
func whyNot(name string) string {
	switch {
	case strings.Contains(name, "lora_magnitude_vector"):
		return "a DoRA magnitude"
	case strings.Contains(name, "lora_embedding_"):
		return "a LoRA on an embedding"
	case strings.Contains(name, "lm_head") || strings.Contains(name, "embed_tokens"):
		return "the LM head or the embeddings are not a decoder layer's projection"
	case strings.HasSuffix(name, ".bias"):
		return "a bias: mlx-lm's LoRALinear trains none"
	case !strings.HasPrefix(name, "base_model.model.model.layers."):
		return "not a decoder layer's LoRA tensor (want base_model.model.model.layers.<L>.<module>.lora_A|lora_B.weight)"
	}
	return "mlx-lm's LoRA maps only " + strings.Join(layerKeys[:], ", ")
}

func floatType(d safetensors.DType) bool {
	return d == safetensors.F32 || d == safetensors.F16 || d == safetensors.BF16
}

// transpose returns the [cols, rows] transpose of the [rows, cols]
// row-major matrix b of es-byte elements.
func transpose(b []byte, rows, cols, es int) []byte {
	t := make([]byte, len(b))
	for r := range rows {
		for c := range cols {
			copy(t[(c*rows+r)*es:(c*rows+r+1)*es], b[(r*cols+c)*es:(r*cols+c+1)*es])
		}
	}
	return t
}

// tensorLess orders tensor names by layer number, then by name.
func tensorLess(a, b string) bool {
	la, _ := layerOf(a)
	lb, _ := layerOf(b)
	if la != lb {
		return la < lb
	}
	return a < b
}

func layerOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return -1, false
	}
	n, _, _ := strings.Cut(rest, ".")
	l, err := strconv.Atoi(n)
	return l, err == nil
}

func readLimited(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > n {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, n)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return nil, err
	}
	return b, nil
}

// writeFile writes b to path through a temporary file renamed into place.
func writeFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// --- Read ---

// mlxName matches an adapter parameter: model.layers.<L>.<key>.<leaf>.
var mlxName = regexp.MustCompile(`^model\.layers\.(\d+)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\.([A-Za-z_0-9]+)$`)

// Read reads the mlx-lm adapter directory dir as load_adapters does: the
// config's fine_tune_type (absent: "lora"), num_layers and lora_parameters
// (rank, scale, dropout required; keys optional), then every tensor of
// adapters.safetensors, which must be a lora_a [in, rank] or lora_b
// [rank, out] of a module in keys, both present for each module. It does
// not know the model: Adapter.Check adds load_adapters' checks against
// one. DoRA and full fine-tunes are refused.
func Read(dir string) (*Adapter, error) {
	cb, err := readLimited(filepath.Join(dir, ConfigFile), maxConfig)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	// load_adapters reads config.num_layers and lora_parameters["rank"],
	// ["scale"], ["dropout"] without defaults: missing ones fail there.
	var raw struct {
		FineTuneType *string `json:"fine_tune_type"`
		NumLayers    *int    `json:"num_layers"`
		LoRA         *struct {
			Rank    *int     `json:"rank"`
			Scale   *float64 `json:"scale"`
			Dropout *float64 `json:"dropout"`
			Keys    []string `json:"keys"`
		} `json:"lora_parameters"`
		Model string `json:"model"`
	}
	if err := json.Unmarshal(cb, &raw); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, ConfigFile, err)
	}
	ad := &Adapter{Config: Config{FineTuneType: "lora", Model: raw.Model}}
	if raw.FineTuneType != nil {
		ad.Config.FineTuneType = *raw.FineTuneType
	}
	switch {
	case ad.Config.FineTuneType != "lora":
		return nil, fmt.Errorf("%w: fine_tune_type %q (this reader follows LoRA only)", ErrFormat, ad.Config.FineTuneType)
	case raw.NumLayers == nil:
		return nil, fmt.Errorf("%w: %s has no num_layers", ErrFormat, ConfigFile)
	case raw.LoRA == nil || raw.LoRA.Rank == nil || raw.LoRA.Scale == nil || raw.LoRA.Dropout == nil:
		return nil, fmt.Errorf("%w: %s: lora_parameters needs rank, scale and dropout", ErrFormat, ConfigFile)
	case *raw.LoRA.Rank <= 0 || math.IsNaN(*raw.LoRA.Scale) || math.IsInf(*raw.LoRA.Scale, 0):
		return nil, fmt.Errorf("%w: lora_parameters rank %d scale %g", ErrFormat, *raw.LoRA.Rank, *raw.LoRA.Scale)
	}
	ad.Config.NumLayers = *raw.NumLayers
	lp := LoRAParameters{Rank: *raw.LoRA.Rank, Scale: *raw.LoRA.Scale, Dropout: *raw.LoRA.Dropout, Keys: raw.LoRA.Keys}
	ad.Config.LoRAParameters = lp
	f, err := safetensors.ReadFile(filepath.Join(dir, WeightsFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	type half struct {
		v     []float32
		shape []int
	}
	found := map[string]map[string]half{} // module name → leaf → tensor
	for _, name := range f.Names() {
		m := mlxName.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("%w: %s: not an adapter parameter of a decoder layer", ErrFormat, name)
		}
		if m[3] != "lora_a" && m[3] != "lora_b" {
			return nil, fmt.Errorf("%w: %s: not a LoRA parameter (lora_a, lora_b)", ErrFormat, name)
		}
		if lp.Keys != nil && !slices.Contains(lp.Keys, m[2]) {
			return nil, fmt.Errorf("%w: %s: module %s is not among lora_parameters.keys %v, so mlx-lm puts no LoRA on it", ErrFormat, name, m[2], lp.Keys)
		}
		v, shape, err := f.Float32(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFormat, err)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("%w: %s is not finite", ErrFormat, name)
			}
		}
		mod := strings.TrimSuffix(name, "."+m[3])
		if found[mod] == nil {
			found[mod] = map[string]half{}
		}
		found[mod][m[3]] = half{v, shape}
	}
	for mod, h := range found {
		a, okA := h["lora_a"]
		b, okB := h["lora_b"]
		if !okA || !okB {
			// mlx-lm would keep the fresh lora_a (random) or lora_b (zero)
			// of the one missing: no adapter means that.
			return nil, fmt.Errorf("%w: %s has only one of lora_a and lora_b", ErrFormat, mod)
		}
		if len(a.shape) != 2 || len(b.shape) != 2 || a.shape[1] != lp.Rank || b.shape[0] != lp.Rank {
			return nil, fmt.Errorf("%w: %s: lora_a %v and lora_b %v, want [in, %d] and [%d, out]", ErrFormat, mod, a.shape, b.shape, lp.Rank, lp.Rank)
		}
		m := mlxName.FindStringSubmatch(mod + ".x")
		l, _ := strconv.Atoi(m[1])
		ad.Modules = append(ad.Modules, Module{Layer: l, Key: m[2], In: a.shape[0], Out: b.shape[1], Rank: lp.Rank,
			A: a.v, B: b.v, Scale: lp.Scale})
	}
	if len(ad.Modules) == 0 {
		return nil, fmt.Errorf("%w: %s holds no LoRA tensors", ErrFormat, WeightsFile)
	}
	sort.Slice(ad.Modules, func(i, j int) bool {
		x, y := ad.Modules[i], ad.Modules[j]
		if x.Layer != y.Layer {
			return x.Layer < y.Layer
		}
		return x.Key < y.Key
	})
	return ad, nil
}

// Check does what load_adapters checks against a model of layers decoder
// layers whose linear module at key (inside a layer) has weight [out, in]
// (ok false: no such linear module): every module must be one that
// linear_to_lora_layers converted (its layer among the last num_layers,
// its key among lora_parameters.keys or, without keys, any linear module)
// and its lora_a and lora_b shapes must match LoRALinear's.
func (a *Adapter) Check(layers int, dims func(key string) (out, in int, ok bool)) error {
	first := 0 // model.layers[-max(num_layers, 0):]
	if n := a.Config.NumLayers; n > 0 && n < layers {
		first = layers - n
	}
	for _, m := range a.Modules {
		if m.Layer >= layers || m.Layer < first {
			return fmt.Errorf("%w: %s: not an adapter parameter in the model (LoRA is on layers %d to %d)", ErrFormat, m.Name(), first, layers-1)
		}
		out, in, ok := dims(m.Key)
		if !ok {
			return fmt.Errorf("%w: %s: the model has no linear module %s", ErrFormat, m.Name(), m.Key)
		}
		if in != m.In || out != m.Out {
			return fmt.Errorf("%w: %s: lora_a [%d, %d] and lora_b [%d, %d] do not match the model's [%d, %d] weight", ErrFormat, m.Name(), m.In, m.Rank, m.Rank, m.Out, out, in)
		}
	}
	return nil
}
