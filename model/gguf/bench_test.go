package gguf_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// BenchmarkExportLoRA4B exports a rank-16 adapter of all seven projections
// of a Qwen3-4B-shaped model (36 layers, hidden 2560, intermediate 9728,
// 32 heads, 8 KV heads, head_dim 128; 33M adapter parameters) from a PEFT
// directory of F32 tensors, as a version is, to a GGUF of each type. It
// reports the output's size and the rate in MB of output per second.
func BenchmarkExportLoRA4B(b *testing.B) {
	cfg := native.Config{VocabSize: 151936, Hidden: 2560, Intermediate: 9728, Layers: 36, Heads: 32, KVHeads: 8, HeadDim: 128}
	dir := filepath.Join(b.TempDir(), "v1")
	writePEFT(b, dir, cfg, 16, 32, false, allTargets, safetensors.F32, 1)
	for _, typ := range []gguf.TensorType{gguf.TypeF32, gguf.TypeF16, gguf.TypeQ8_0} {
		b.Run(typ.String(), func(b *testing.B) {
			out := filepath.Join(b.TempDir(), "a.gguf")
			var size int64
			for b.Loop() {
				if err := gguf.ExportLoRA(dir, out, gguf.LoRAOptions{Arch: gguf.ArchQwen3, Type: typ}); err != nil {
					b.Fatal(err)
				}
			}
			st, err := os.Stat(out)
			if err != nil {
				b.Fatal(err)
			}
			size = st.Size()
			b.ReportMetric(float64(size), "bytes")
			b.ReportMetric(float64(size)/1e6/(b.Elapsed().Seconds()/float64(b.N)), "MB/s")
		})
	}
}
