// Package mlxtest does for tests what mlx-lm does with an adapter
// directory, with mlx.Read as its loader: it folds the adapter into a
// Hugging Face model directory, as `mlx_lm.fuse` does (LoRALinear.fuse:
// W + (scale·lora_bᵀ) @ lora_aᵀ), so that any engine can run the result.
package mlxtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// Model is what Check needs of a model directory: its number of decoder
// layers and the shape of each linear module of a layer.
type Model struct {
	Layers int
	shapes map[string][]int // key inside a layer → [out, in]
}

// Dims reports the [out, in] weight shape of the linear module at key
// inside a decoder layer.
func (m Model) Dims(key string) (out, in int, ok bool) {
	s, ok := m.shapes[key]
	if !ok {
		return 0, 0, false
	}
	return s[0], s[1], true
}

// ReadModel reads the shape of the Hugging Face model directory dir
// (config.json's num_hidden_layers, model.safetensors' tensors).
func ReadModel(dir string) (Model, *safetensors.File, error) {
	cb, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Model{}, nil, err
	}
	var c struct {
		Layers int `json:"num_hidden_layers"`
	}
	if err := json.Unmarshal(cb, &c); err != nil || c.Layers <= 0 {
		return Model{}, nil, fmt.Errorf("mlxtest: %s/config.json: num_hidden_layers %d: %v", dir, c.Layers, err)
	}
	f, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return Model{}, nil, err
	}
	m := Model{Layers: c.Layers, shapes: map[string][]int{}}
	prefix := "model.layers.0."
	for name, ti := range f.Tensors {
		if key, ok := cutAffix(name, prefix, ".weight"); ok && len(ti.Shape) == 2 {
			m.shapes[key] = ti.Shape
		}
	}
	return m, f, nil
}

func cutAffix(s, prefix, suffix string) (string, bool) {
	if len(s) < len(prefix)+len(suffix) || s[:len(prefix)] != prefix || s[len(s)-len(suffix):] != suffix {
		return "", false
	}
	return s[len(prefix) : len(s)-len(suffix)], true
}

// Merge writes to outDir the model directory modelDir with the mlx-lm
// adapter in adapterDir folded into its weights (in float32), after the
// checks mlx-lm's load_adapters makes. config.json and the tokenizer
// files are copied.
func Merge(modelDir, adapterDir, outDir string) error {
	ad, err := mlx.Read(adapterDir)
	if err != nil {
		return err
	}
	m, f, err := ReadModel(modelDir)
	if err != nil {
		return err
	}
	if err := ad.Check(m.Layers, m.Dims); err != nil {
		return err
	}
	delta := map[string]mlx.Module{}
	for _, mod := range ad.Modules {
		delta[mod.Name()+".weight"] = mod
	}
	var ts []safetensors.Tensor
	for _, name := range f.Names() {
		v, shape, err := f.Float32(name)
		if err != nil {
			return err
		}
		if mod, ok := delta[name]; ok {
			for i, d := range mod.Delta() {
				v[i] = float32(float64(v[i]) + d)
			}
		}
		t, err := safetensors.F32Tensor(name, safetensors.F32, shape, v)
		if err != nil {
			return err
		}
		ts = append(ts, t)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(modelDir, name))
		if os.IsNotExist(err) && name != "config.json" {
			continue
		} else if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(outDir, name), b, 0o644); err != nil {
			return err
		}
	}
	return safetensors.WriteFile(filepath.Join(outDir, "model.safetensors"), ts, map[string]string{"format": "pt"})
}
