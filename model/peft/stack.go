package peft

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// Stack reads the PEFT LoRA adapters in dirs (two or more, of one base
// model) and writes to out one PEFT adapter whose delta on every module is
// the sum of theirs (see the package comment). out must not exist; it is
// built in a temporary directory beside it and renamed into place.
func Stack(out string, dirs ...string) error {
	if len(dirs) < 2 {
		return fmt.Errorf("peft: stacking needs two or more adapter directories, got %d", len(dirs))
	}
	if err := absent(out); err != nil {
		return err
	}
	ads := make([]*Adapter, len(dirs))
	for i, d := range dirs {
		ad, err := Read(d)
		if err != nil {
			return err
		}
		ads[i] = ad
	}
	st, err := stack(ads, dirs)
	if err != nil {
		return err
	}
	return writeDir(out, st)
}

// absent checks that nothing is at path.
func absent(path string) error {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return fmt.Errorf("%w: %s (stacking never replaces an adapter)", ErrExists, path)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("peft: %w", err)
	}
	return nil
}

// stack returns the adapter holding ads side by side: rank Σ r_i, scale 1,
// each input's scale folded into its columns of B. names label the inputs
// in errors.
func stack(ads []*Adapter, names []string) (*Adapter, error) {
	base := strings.TrimSpace(ads[0].Config.BaseModel)
	total := 0
	type dims struct {
		in, out int
		from    int // the first input adapting the module
	}
	mods := map[string]dims{}
	var order []string
	var targets []string
	for i, ad := range ads {
		if b := strings.TrimSpace(ad.Config.BaseModel); baseid.NormName(b) != baseid.NormName(base) || (b == "") != (base == "") {
			return nil, fmt.Errorf("%w: %s is for base model %q, %s for %q", ErrMismatch, names[0], base, names[i], b)
		}
		total += ad.Config.R
		if total > MaxRank {
			return nil, fmt.Errorf("%w: the stacked rank would exceed %d", ErrUnsupported, MaxRank)
		}
		for _, m := range ad.Modules {
			d, ok := mods[m.Name]
			if !ok {
				mods[m.Name] = dims{m.In, m.Out, i}
				order = append(order, m.Name)
				continue
			}
			if d.in != m.In || d.out != m.Out {
				return nil, fmt.Errorf("%w: module %s is [%d, %d] (out, in) in %s but [%d, %d] in %s: not the same base model",
					ErrMismatch, m.Name, d.out, d.in, names[d.from], m.Out, m.In, names[i])
			}
		}
		for _, t := range ad.Targets {
			if !slices.Contains(targets, t) {
				targets = append(targets, t)
			}
		}
	}
	slices.SortFunc(order, compareNames)
	var size int64
	for _, n := range order {
		d := mods[n]
		size += int64(total) * int64(d.in+d.out) * 4
		if size > MaxWeightsSize {
			return nil, fmt.Errorf("%w: the stacked adapter would exceed %d bytes", ErrUnsupported, int64(MaxWeightsSize))
		}
	}
	tm, err := json.Marshal(targets)
	if err != nil {
		return nil, err
	}
	out := &Adapter{
		Config: Config{PeftType: "LORA", TaskType: ads[0].Config.TaskType, R: total, LoraAlpha: float64(total),
			TargetModules: tm, BaseModel: base},
		Targets: targets,
		Modules: make([]Module, len(order)),
	}
	index := make(map[string]int, len(order))
	for j, n := range order {
		d := mods[n]
		out.Modules[j] = Module{Name: n, In: d.in, Out: d.out, Rank: total, Scale: 1,
			A: make([]float32, total*d.in), B: make([]float32, d.out*total)}
		index[n] = j
	}
	off := 0
	for _, ad := range ads {
		r := ad.Config.R
		for _, m := range ad.Modules {
			o := &out.Modules[index[m.Name]]
			copy(o.A[off*m.In:(off+r)*m.In], m.A)
			for row := range m.Out {
				src := m.B[row*r : (row+1)*r]
				dst := o.B[row*total+off : row*total+off+r]
				for k, v := range src {
					x := float32(m.Scale * float64(v))
					if math.IsInf(float64(x), 0) {
						return nil, fmt.Errorf("%w: %s: lora_B scaled by %g overflows float32", ErrUnsupported, m.Name, m.Scale)
					}
					dst[k] = x
				}
			}
		}
		off += r
	}
	return out, nil
}

// outConfig is the adapter_config.json Stack writes. Every field has the
// type PEFT's LoraConfig gives it (a null where PEFT wants a dict would
// break its loader), so rank_pattern and alpha_pattern are written {}.
type outConfig struct {
	PeftType          string            `json:"peft_type"`
	TaskType          string            `json:"task_type,omitempty"`
	R                 int               `json:"r"`
	LoraAlpha         float64           `json:"lora_alpha"`
	LoraDropout       float64           `json:"lora_dropout"`
	TargetModules     []string          `json:"target_modules"`
	BaseModel         string            `json:"base_model_name_or_path"`
	Bias              string            `json:"bias"`
	FanInFanOut       bool              `json:"fan_in_fan_out"`
	InferenceMode     bool              `json:"inference_mode"`
	UseRSLoRA         bool              `json:"use_rslora"`
	UseDoRA           bool              `json:"use_dora"`
	ModulesToSave     []string          `json:"modules_to_save"`
	LayersToTransform []int             `json:"layers_to_transform"`
	RankPattern       map[string]string `json:"rank_pattern"`
	AlphaPattern      map[string]string `json:"alpha_pattern"`
}

// writeDir writes ad to out as a PEFT adapter directory (F32 tensors),
// through a temporary directory beside out renamed into place.
func writeDir(out string, ad *Adapter) error {
	cb, err := json.MarshalIndent(outConfig{PeftType: "LORA", TaskType: ad.Config.TaskType, R: ad.Config.R,
		LoraAlpha: ad.Config.LoraAlpha, TargetModules: ad.Targets, BaseModel: ad.Config.BaseModel, Bias: "none",
		InferenceMode: true, RankPattern: map[string]string{}, AlphaPattern: map[string]string{}}, "", "  ")
	if err != nil {
		return err
	}
	ts := make([]safetensors.Tensor, 0, 2*len(ad.Modules))
	for _, m := range ad.Modules {
		a, err := safetensors.F32Tensor(m.Name+".lora_A.weight", safetensors.F32, []int{m.Rank, m.In}, m.A)
		if err != nil {
			return err
		}
		b, err := safetensors.F32Tensor(m.Name+".lora_B.weight", safetensors.F32, []int{m.Out, m.Rank}, m.B)
		if err != nil {
			return err
		}
		ts = append(ts, a, b)
	}
	parent := filepath.Dir(filepath.Clean(out))
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(filepath.Clean(out))+".tmp-")
	if err != nil {
		return fmt.Errorf("peft: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := writeSynced(filepath.Join(tmp, WeightsFile), func(w *bufio.Writer) error {
		return safetensors.Write(w, ts, map[string]string{"format": "pt"})
	}); err != nil {
		return fmt.Errorf("peft: %w", err)
	}
	if err := writeSynced(filepath.Join(tmp, ConfigFile), func(w *bufio.Writer) error {
		_, err := w.Write(append(cb, '\n'))
		return err
	}); err != nil {
		return fmt.Errorf("peft: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("peft: %w", err)
	}
	// Checked again just before the rename: on Linux a directory renames
	// over an empty one.
	if err := absent(out); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("peft: %w", err)
	}
	done = true
	if d, err := os.Open(parent); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// writeSynced creates path, writes it through fill and syncs it to disk.
func writeSynced(path string, fill func(*bufio.Writer) error) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = fill(w)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
