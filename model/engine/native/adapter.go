package native

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// LoRAConfig shapes the adapter. The zero value means rank 8, alpha 16, all
// seven projections.
type LoRAConfig struct {
	// Rank is r, the adapter's inner dimension (default 8).
	Rank int
	// Alpha scales the adapter's output by Alpha/Rank (default 2·Rank).
	Alpha float64
	// Targets names the adapted projections among q_proj, k_proj, v_proj,
	// o_proj, gate_proj, up_proj, down_proj (default: all).
	Targets []string
}

func (c LoRAConfig) withDefaults() LoRAConfig {
	if c.Rank == 0 {
		c.Rank = 8
	}
	if c.Alpha == 0 {
		c.Alpha = 2 * float64(c.Rank)
	}
	if len(c.Targets) == 0 {
		c.Targets = moduleNames[:]
	}
	return c
}

func (c LoRAConfig) validate() error {
	if c.Rank <= 0 || c.Rank > 4096 || !(c.Alpha > 0) || math.IsInf(c.Alpha, 0) {
		return fmt.Errorf("%w: lora rank %d alpha %g", ErrConfig, c.Rank, c.Alpha)
	}
	for _, t := range c.Targets {
		if !slices.Contains(moduleNames[:], t) {
			return fmt.Errorf("%w: unknown lora target %q", ErrConfig, t)
		}
	}
	return nil
}

// slot locates one module's A [r, in] and B [out, r] in the flat parameter
// vector.
type slot struct {
	on      bool
	a, b    int
	in, out int
}

// adapter is a LoRA adapter: every trainable parameter in one flat vector,
// so that the optimizer, clipping, copying and export see one array.
type adapter struct {
	rank   int
	alpha  float64
	scale  float32
	rslora bool
	params []float32
	slots  [][numModules]slot
}

func newAdapter(c Config, lc LoRAConfig) *adapter {
	ad := &adapter{rank: lc.Rank, alpha: lc.Alpha, scale: float32(lc.Alpha / float64(lc.Rank))}
	ad.slots = make([][numModules]slot, c.Layers)
	n := 0
	for l := range ad.slots {
		for m := module(0); m < numModules; m++ {
			if !slices.Contains(lc.Targets, moduleNames[m]) {
				continue
			}
			out, in := c.dims(m)
			ad.slots[l][m] = slot{on: true, a: n, b: n + lc.Rank*in, in: in, out: out}
			n += lc.Rank * (in + out)
		}
	}
	ad.params = make([]float32, n)
	return ad
}

// init draws A uniform in ±1/√in (PEFT's kaiming_uniform with a=√5) and
// zeroes B, so a fresh adapter leaves the model unchanged.
func (ad *adapter) init(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x243f6a8885a308d3))
	clear(ad.params)
	for l := range ad.slots {
		for _, s := range ad.slots[l] {
			if !s.on {
				continue
			}
			bound := 1 / math.Sqrt(float64(s.in))
			a := ad.params[s.a : s.a+ad.rank*s.in]
			for i := range a {
				a[i] = float32((2*r.Float64() - 1) * bound)
			}
		}
	}
}

func (ad *adapter) A(p []float32, l int, m module) []float32 {
	s := ad.slots[l][m]
	return p[s.a : s.a+ad.rank*s.in]
}

func (ad *adapter) B(p []float32, l int, m module) []float32 {
	s := ad.slots[l][m]
	return p[s.b : s.b+s.out*ad.rank]
}

func (ad *adapter) clone() *adapter {
	c := *ad
	c.params = slices.Clone(ad.params)
	return &c
}

func (ad *adapter) targets() []string {
	var t []string
	if len(ad.slots) == 0 {
		return t
	}
	for m := module(0); m < numModules; m++ {
		if ad.slots[0][m].on {
			t = append(t, moduleNames[m])
		}
	}
	return t
}

const (
	adapterConfigFile  = "adapter_config.json"
	adapterWeightsFile = "adapter_model.safetensors"
	peftPrefix         = "base_model.model.model.layers."
)

// peftConfig is the subset of PEFT's LoraConfig the engine writes and reads.
// Every field written has the type PEFT's LoraConfig gives it: PEFT keeps a
// JSON null as None, so a null where PEFT's default is a dict or a bool
// would break the code that loads the adapter (rank_pattern and
// alpha_pattern are read with .keys() when the adapter is injected).
type peftConfig struct {
	PeftType          string   `json:"peft_type"`
	TaskType          string   `json:"task_type"`
	R                 int      `json:"r"`
	LoraAlpha         float64  `json:"lora_alpha"`
	LoraDropout       float64  `json:"lora_dropout"`
	TargetModules     []string `json:"target_modules"`
	BaseModel         string   `json:"base_model_name_or_path"`
	Bias              string   `json:"bias"`
	FanInFanOut       bool     `json:"fan_in_fan_out"`
	InferenceMode     bool     `json:"inference_mode"`
	UseRSLoRA         bool     `json:"use_rslora"`
	UseDoRA           bool     `json:"use_dora"`
	ModulesToSave     []string `json:"modules_to_save"`
	LayersToTransform []int    `json:"layers_to_transform"`
	// Per-module overrides of the rank and scale: refused, since a loader
	// that ignored them would apply the wrong scale without an error. PEFT's
	// default is an empty dict, which export writes ({}, never null).
	RankPattern  map[string]json.RawMessage `json:"rank_pattern"`
	AlphaPattern map[string]json.RawMessage `json:"alpha_pattern"`
}

func tensorName(l int, m module, ab string) string {
	return fmt.Sprintf("%s%d.%s.lora_%s.weight", peftPrefix, l, m.hfName(), ab)
}

// export writes the adapter as a PEFT directory (F32 tensors, so a reload
// is bit-identical).
func (ad *adapter) export(dir, baseModel string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pc := peftConfig{PeftType: "LORA", TaskType: "CAUSAL_LM", R: ad.rank, LoraAlpha: ad.alpha,
		TargetModules: ad.targets(), BaseModel: baseModel, Bias: "none", InferenceMode: true,
		UseRSLoRA: ad.rslora, RankPattern: map[string]json.RawMessage{}, AlphaPattern: map[string]json.RawMessage{}}
	cb, err := json.MarshalIndent(pc, "", "  ")
	if err != nil {
		return err
	}
	var ts []safetensors.Tensor
	for l := range ad.slots {
		for m := module(0); m < numModules; m++ {
			s := ad.slots[l][m]
			if !s.on {
				continue
			}
			a, err := safetensors.F32Tensor(tensorName(l, m, "A"), safetensors.F32, []int{ad.rank, s.in}, ad.A(ad.params, l, m))
			if err != nil {
				return err
			}
			b, err := safetensors.F32Tensor(tensorName(l, m, "B"), safetensors.F32, []int{s.out, ad.rank}, ad.B(ad.params, l, m))
			if err != nil {
				return err
			}
			ts = append(ts, a, b)
		}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, adapterWeightsFile), ts, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, adapterConfigFile), cb, 0o644)
}

// loadAdapter reads a PEFT LoRA directory for a model of shape c. It accepts
// target modules given as short names ("q_proj") and F32, BF16 or F16
// tensors; it rejects DoRA, biases, layer subsets, extra saved modules and
// per-module rank or alpha patterns, which the engine does not implement.
func loadAdapter(dir string, c Config) (*adapter, error) {
	cb, err := os.ReadFile(filepath.Join(dir, adapterConfigFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", engine.ErrAdapter, err)
	}
	var pc peftConfig
	if err := json.Unmarshal(cb, &pc); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", engine.ErrAdapter, adapterConfigFile, err)
	}
	if pc.PeftType != "LORA" || pc.UseDoRA || (pc.Bias != "" && pc.Bias != "none") ||
		len(pc.ModulesToSave) > 0 || len(pc.LayersToTransform) > 0 || pc.FanInFanOut ||
		len(pc.RankPattern) > 0 || len(pc.AlphaPattern) > 0 {
		return nil, fmt.Errorf("%w: unsupported peft config %s", engine.ErrAdapter, cb)
	}
	lc := LoRAConfig{Rank: pc.R, Alpha: pc.LoraAlpha, Targets: pc.TargetModules}
	if len(lc.Targets) == 0 {
		return nil, fmt.Errorf("%w: no target modules", engine.ErrAdapter)
	}
	if err := lc.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrAdapter, err)
	}
	f, err := safetensors.ReadFile(filepath.Join(dir, adapterWeightsFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrAdapter, err)
	}
	ad := newAdapter(c, lc)
	if pc.UseRSLoRA {
		ad.rslora = true
		ad.scale = float32(pc.LoraAlpha / math.Sqrt(float64(pc.R)))
	}
	want := 0
	for l := range ad.slots {
		for m := module(0); m < numModules; m++ {
			s := ad.slots[l][m]
			if !s.on {
				continue
			}
			for _, ab := range []struct {
				name  string
				dst   []float32
				shape []int
			}{{"A", ad.A(ad.params, l, m), []int{ad.rank, s.in}}, {"B", ad.B(ad.params, l, m), []int{s.out, ad.rank}}} {
				name := tensorName(l, m, ab.name)
				v, shape, err := f.Float32(name)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", engine.ErrAdapter, err)
				}
				if !sameShape(shape, ab.shape) {
					return nil, fmt.Errorf("%w: %s has shape %v, want %v", engine.ErrAdapter, name, shape, ab.shape)
				}
				for _, x := range v {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						return nil, fmt.Errorf("%w: %s is not finite", engine.ErrAdapter, name)
					}
				}
				copy(ab.dst, v)
				want++
			}
		}
	}
	if len(f.Tensors) != want {
		return nil, fmt.Errorf("%w: %d tensors, expected %d", engine.ErrAdapter, len(f.Tensors), want)
	}
	return ad, nil
}

// WriteFreshAdapter writes to dir, in PEFT format, the fresh adapter an
// engine on a model of shape c draws from seed (see ResetSeed): A uniform in
// ±1/√in, B zero. baseModel is written as base_model_name_or_path.
func WriteFreshAdapter(dir string, c Config, lc LoRAConfig, seed uint64, baseModel string) error {
	c.defaults()
	if err := c.Validate(); err != nil {
		return err
	}
	lc = lc.withDefaults()
	if err := lc.validate(); err != nil {
		return err
	}
	ad := newAdapter(c, lc)
	ad.init(seed)
	return ad.export(dir, baseModel)
}

// merge returns w with ad folded in: each adapted projection becomes
// W + s·B·A, a new slice; everything else is shared with w.
func (w *weights) merge(ad *adapter) *weights {
	m := *w
	m.layers = slices.Clone(w.layers)
	r := ad.rank
	for l := range m.layers {
		for mod := module(0); mod < numModules; mod++ {
			s := ad.slots[l][mod]
			if !s.on {
				continue
			}
			a, b := ad.A(ad.params, l, mod), ad.B(ad.params, l, mod)
			src := w.layers[l].proj[mod]
			dst := make([]float32, len(src))
			for o := range s.out {
				bo := b[o*r : (o+1)*r]
				for i := range s.in {
					var d float64
					for k, bk := range bo {
						d += float64(bk) * float64(a[k*s.in+i])
					}
					dst[o*s.in+i] = float32(float64(src[o*s.in+i]) + float64(ad.scale)*d)
				}
			}
			m.layers[l].proj[mod] = dst
		}
	}
	return &m
}
