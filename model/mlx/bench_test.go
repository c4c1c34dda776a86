package mlx_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// BenchmarkExport converts a rank-16 adapter on every projection of a
// Qwen3-0.6B-shaped model (28 layers, hidden 1024, 16×128 query and 8×128
// key/value heads, MLP 3072): 10.1M parameters, 40 MB of F32.
func BenchmarkExport(b *testing.B) {
	const (
		layers, hidden, q, kv, mlp, r = 28, 1024, 2048, 1024, 3072, 16
	)
	dims := []struct {
		key     string
		out, in int
	}{
		{"self_attn.q_proj", q, hidden}, {"self_attn.k_proj", kv, hidden}, {"self_attn.v_proj", kv, hidden},
		{"self_attn.o_proj", hidden, q}, {"mlp.gate_proj", mlp, hidden}, {"mlp.up_proj", mlp, hidden},
		{"mlp.down_proj", hidden, mlp},
	}
	dir := b.TempDir()
	var ts []safetensors.Tensor
	var size int64
	for l := range layers {
		for _, d := range dims {
			pre := fmt.Sprintf("base_model.model.model.layers.%d.%s", l, d.key)
			a, err := safetensors.F32Tensor(pre+".lora_A.weight", safetensors.F32, []int{r, d.in}, make([]float32, r*d.in))
			if err != nil {
				b.Fatal(err)
			}
			bb, err := safetensors.F32Tensor(pre+".lora_B.weight", safetensors.F32, []int{d.out, r}, make([]float32, d.out*r))
			if err != nil {
				b.Fatal(err)
			}
			ts = append(ts, a, bb)
			size += int64(len(a.Data) + len(bb.Data))
		}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, mlx.PEFTWeightsFile), ts, nil); err != nil {
		b.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"peft_type": "LORA", "r": r, "lora_alpha": 32,
		"target_modules": []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}})
	if err := os.WriteFile(filepath.Join(dir, mlx.PEFTConfigFile), cfg, 0o644); err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(b.TempDir(), "mlx")
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		if err := mlx.Export(dir, out); err != nil {
			b.Fatal(err)
		}
	}
}
