package peft

import (
	"cmp"
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

// Sentinel errors.
var (
	// ErrFormat: a directory is not a well-formed PEFT LoRA adapter.
	ErrFormat = errors.New("peft: not a PEFT LoRA adapter")
	// ErrUnsupported: the adapter uses something stacking cannot carry
	// exactly (DoRA, biases, saved modules, per-module patterns, ...).
	ErrUnsupported = errors.New("peft: unsupported adapter")
	// ErrMismatch: the adapters handed to Stack are of different base
	// models or disagree on a module's shape.
	ErrMismatch = errors.New("peft: adapters do not stack")
	// ErrExists: Stack's output already exists.
	ErrExists = errors.New("peft: output exists")
)

// The files of a PEFT LoRA adapter directory.
const (
	ConfigFile  = "adapter_config.json"
	WeightsFile = "adapter_model.safetensors"
)

// Bounds on what Read accepts and Stack writes.
const (
	// MaxConfigSize bounds adapter_config.json.
	MaxConfigSize = 1 << 20
	// MaxWeightsSize bounds adapter_model.safetensors, read and written.
	MaxWeightsSize = 8 << 30
	// MaxRank bounds an adapter's r, and the stacked rank.
	MaxRank = 1 << 16
)

// Config is what this package reads of PEFT's LoraConfig.
type Config struct {
	PeftType  string  `json:"peft_type"`
	TaskType  string  `json:"task_type"`
	R         int     `json:"r"`
	LoraAlpha float64 `json:"lora_alpha"`
	// TargetModules is PEFT's target_modules: a list of names, or a
	// regular expression string (then Targets lists the module names the
	// tensors adapt).
	TargetModules json.RawMessage `json:"target_modules"`
	BaseModel     string          `json:"base_model_name_or_path"`
	UseRSLoRA     bool            `json:"use_rslora"`
	UseDoRA       bool            `json:"use_dora"`
	Bias          string          `json:"bias"`
	FanInFanOut   bool            `json:"fan_in_fan_out"`
	ModulesToSave json.RawMessage `json:"modules_to_save"`
	// LayersToTransform is an int or a list (PEFT accepts both).
	LayersToTransform json.RawMessage            `json:"layers_to_transform"`
	RankPattern       map[string]json.RawMessage `json:"rank_pattern"`
	AlphaPattern      map[string]json.RawMessage `json:"alpha_pattern"`
	LoraBias          bool                       `json:"lora_bias"`
}

// Scale is the factor PEFT multiplies B·A by: lora_alpha/r, or
// lora_alpha/√r with use_rslora.
func (c Config) Scale() float64 {
	if c.UseRSLoRA {
		return c.LoraAlpha / math.Sqrt(float64(c.R))
	}
	return c.LoraAlpha / float64(c.R)
}

// parseConfig decodes and checks adapter_config.json: a LoRA adapter
// (peft_type "LORA" or absent) with r in [1, MaxRank] and a finite
// positive lora_alpha, and nothing stacking cannot carry.
func parseConfig(b []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("%w: %s: %v", ErrFormat, ConfigFile, err)
	}
	set := func(raw json.RawMessage) bool {
		s := strings.TrimSpace(string(raw))
		return s != "" && s != "null" && s != "[]"
	}
	switch {
	case c.PeftType != "" && c.PeftType != "LORA":
		return Config{}, fmt.Errorf("%w: peft_type %q (only LORA)", ErrUnsupported, c.PeftType)
	case c.UseDoRA:
		return Config{}, fmt.Errorf("%w: use_dora: DoRA's magnitude does not stack by concatenation", ErrUnsupported)
	case c.Bias != "" && c.Bias != "none", c.LoraBias:
		return Config{}, fmt.Errorf("%w: trained biases (bias %q, lora_bias %v)", ErrUnsupported, c.Bias, c.LoraBias)
	case c.FanInFanOut:
		return Config{}, fmt.Errorf("%w: fan_in_fan_out (Conv1D weights)", ErrUnsupported)
	case set(c.ModulesToSave):
		return Config{}, fmt.Errorf("%w: modules_to_save %s: whole modules saved beside the adapter do not stack", ErrUnsupported, c.ModulesToSave)
	case set(c.LayersToTransform):
		return Config{}, fmt.Errorf("%w: layers_to_transform %s: a layer subset", ErrUnsupported, c.LayersToTransform)
	case len(c.RankPattern) > 0 || len(c.AlphaPattern) > 0:
		return Config{}, fmt.Errorf("%w: rank_pattern or alpha_pattern (per-module ranks or scales)", ErrUnsupported)
	case c.R <= 0 || c.R > MaxRank:
		return Config{}, fmt.Errorf("%w: r %d (want 1 to %d)", ErrFormat, c.R, MaxRank)
	case !(c.LoraAlpha > 0) || math.IsInf(c.LoraAlpha, 0):
		return Config{}, fmt.Errorf("%w: lora_alpha %g (want a finite positive number)", ErrFormat, c.LoraAlpha)
	}
	if _, _, err := c.targets(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// targets returns target_modules as a list, or ok false when it is a
// regular expression (or absent).
func (c Config) targets() (list []string, ok bool, err error) {
	s := strings.TrimSpace(string(c.TargetModules))
	if s == "" || s == "null" {
		return nil, false, nil
	}
	if strings.HasPrefix(s, "\"") {
		var re string
		if err := json.Unmarshal(c.TargetModules, &re); err != nil {
			return nil, false, fmt.Errorf("%w: target_modules: %v", ErrFormat, err)
		}
		return nil, false, nil
	}
	if err := json.Unmarshal(c.TargetModules, &list); err != nil {
		return nil, false, fmt.Errorf("%w: target_modules is neither a list of names nor a string: %v", ErrFormat, err)
	}
	return list, true, nil
}

// Module is one adapted module.
type Module struct {
	// Name is the module's path as PEFT saves it, without ".lora_A.weight":
	// "base_model.model.model.layers.3.self_attn.q_proj" (the prefix
	// "base_model.model." is added where the tensors lack it).
	Name string
	// In, Out and Rank are the dimensions: A is [Rank, In], B [Out, Rank],
	// the base weight [Out, In].
	In, Out, Rank int
	A, B          []float32 // row-major
	// Scale is the adapter's: lora_alpha/r or lora_alpha/√r.
	Scale float64
}

// Delta returns what the module adds to its base weight: Scale·B·A,
// [Out, In] row-major, in float64.
func (m Module) Delta() []float64 {
	d := make([]float64, m.Out*m.In)
	for o := range m.Out {
		row := d[o*m.In : (o+1)*m.In]
		for k := range m.Rank {
			bk := m.Scale * float64(m.B[o*m.Rank+k])
			if bk == 0 {
				continue
			}
			a := m.A[k*m.In : (k+1)*m.In]
			for i, av := range a {
				row[i] += bk * float64(av)
			}
		}
	}
	return d
}

// Adapter is a PEFT LoRA adapter read whole.
type Adapter struct {
	Config Config
	// Targets is target_modules as a list: the config's, or when it is a
	// regular expression the last path element of every adapted module.
	Targets []string
	// Modules are the adapted modules, in the order of their names
	// (layer numbers compared as numbers).
	Modules []Module
}

// loraName matches a LoRA weight as PEFT saves it (the adapter's name
// dropped): <module path>.lora_A.weight or .lora_B.weight.
var loraName = regexp.MustCompile(`^(.+)\.lora_([AB])\.weight$`)

// Read reads the PEFT LoRA adapter in dir: adapter_config.json (at most
// MaxConfigSize bytes, checked by parseConfig) and adapter_model.safetensors
// (at most MaxWeightsSize bytes) whose every tensor is a lora_A [r, in] or
// lora_B [out, r] weight in F32, F16, BF16 or F64, paired per module, with
// finite values.
func Read(dir string) (*Adapter, error) {
	cb, err := readLimited(filepath.Join(dir, ConfigFile), MaxConfigSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, dir, err)
	}
	c, err := parseConfig(cb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	wb, err := readLimited(filepath.Join(dir, WeightsFile), MaxWeightsSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, dir, err)
	}
	f, err := safetensors.Parse(wb)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s: %v", ErrFormat, dir, WeightsFile, err)
	}
	ad, err := fromFile(c, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return ad, nil
}

// fromFile pairs the tensors of f into modules of c's rank.
func fromFile(c Config, f *safetensors.File) (*Adapter, error) {
	type pair struct{ a, b string }
	pairs := map[string]*pair{}
	for name := range f.Tensors {
		m := loraName.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("%w: tensor %q is not a lora_A or lora_B weight (%s)", ErrUnsupported, name, whyNot(name))
		}
		mod := canonical(m[1])
		p := pairs[mod]
		if p == nil {
			p = &pair{}
			pairs[mod] = p
		}
		half := &p.b
		if m[2] == "A" {
			half = &p.a
		}
		if *half != "" {
			return nil, fmt.Errorf("%w: %s and %s are the same module's lora_%s", ErrFormat, *half, name, m[2])
		}
		*half = name
	}
	if len(pairs) == 0 {
		return nil, fmt.Errorf("%w: %s holds no LoRA weights", ErrFormat, WeightsFile)
	}
	names := make([]string, 0, len(pairs))
	for n := range pairs {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	ad := &Adapter{Config: c}
	scale := c.Scale()
	leaves := map[string]bool{}
	for _, n := range names {
		p := pairs[n]
		if p.a == "" || p.b == "" {
			return nil, fmt.Errorf("%w: module %s has only one of lora_A and lora_B", ErrFormat, n)
		}
		ta, tb := f.Tensors[p.a], f.Tensors[p.b]
		if len(ta.Shape) != 2 || len(tb.Shape) != 2 || ta.Shape[0] != c.R || tb.Shape[1] != c.R || ta.Shape[1] <= 0 || tb.Shape[0] <= 0 {
			return nil, fmt.Errorf("%w: module %s has lora_A %v and lora_B %v; r is %d, so want [%d, in] and [out, %d]",
				ErrFormat, n, ta.Shape, tb.Shape, c.R, c.R, c.R)
		}
		m := Module{Name: n, In: ta.Shape[1], Out: tb.Shape[0], Rank: c.R, Scale: scale}
		var err error
		if m.A, err = floats(f, p.a); err != nil {
			return nil, err
		}
		if m.B, err = floats(f, p.b); err != nil {
			return nil, err
		}
		ad.Modules = append(ad.Modules, m)
		leaves[n[strings.LastIndexByte(n, '.')+1:]] = true
	}
	list, ok, err := c.targets()
	if err != nil {
		return nil, err
	}
	if !ok {
		for l := range leaves {
			list = append(list, l)
		}
		slices.Sort(list)
	}
	ad.Targets = list
	return ad, nil
}

// floats returns a float tensor of f as float32, refusing other dtypes and
// values that are not finite.
func floats(f *safetensors.File, name string) ([]float32, error) {
	ti := f.Tensors[name]
	switch ti.DType {
	case safetensors.F32, safetensors.F16, safetensors.BF16, safetensors.F64:
	default:
		return nil, fmt.Errorf("%w: %s is %s (F32, F16, BF16 or F64)", ErrUnsupported, name, ti.DType)
	}
	v, _, err := f.Float32(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("%w: %s is not finite", ErrFormat, name)
		}
	}
	return v, nil
}

// peftPrefix is what PEFT's save_pretrained puts before a causal LM's
// module paths.
const peftPrefix = "base_model.model."

// canonical is a module path as PEFT saves it, so that an adapter written
// without the prefix ("model.layers.0...") stacks with one written with it.
func canonical(name string) string {
	return peftPrefix + strings.TrimPrefix(name, peftPrefix)
}

// whyNot says what a tensor that is not a LoRA weight is.
func whyNot(name string) string {
	switch {
	case strings.Contains(name, "lora_magnitude_vector"):
		return "a DoRA magnitude"
	case strings.Contains(name, "lora_embedding_"):
		return "a LoRA on an embedding"
	case strings.HasSuffix(name, ".bias"):
		return "a bias"
	}
	return "want <module>.lora_A.weight or <module>.lora_B.weight"
}

// compareNames orders module names element by element, numbers as numbers
// ("layers.2" before "layers.10").
func compareNames(x, y string) int {
	xs, ys := strings.Split(x, "."), strings.Split(y, ".")
	for i := 0; i < len(xs) && i < len(ys); i++ {
		if xs[i] == ys[i] {
			continue
		}
		xn, xerr := strconv.Atoi(xs[i])
		yn, yerr := strconv.Atoi(ys[i])
		if xerr == nil && yerr == nil && xn != yn {
			return cmp.Compare(xn, yn)
		}
		return strings.Compare(xs[i], ys[i])
	}
	return len(xs) - len(ys)
}

// readLimited reads a regular file of at most n bytes, checking its size
// before reading it.
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
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > n {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d accepted", path, st.Size(), n)
	}
	b, err := io.ReadAll(io.LimitReader(f, n+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > n {
		return nil, fmt.Errorf("%s grew past the %d bytes accepted", path, n)
	}
	return b, nil
}
