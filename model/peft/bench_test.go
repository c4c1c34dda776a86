package peft_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/clawmesh/clawmesh/model/peft"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// BenchmarkStack stacks two adapters of Qwen3-0.6B's shape (28 layers,
// hidden 1024, 16 query and 8 key/value heads of 128, MLP 3072) on every
// projection, of ranks 8 and 4 (F32, 20 and 10 MB): bytes are the inputs'
// adapter_model.safetensors read per stack.
func BenchmarkStack(b *testing.B) {
	s := shape{layers: 28, hidden: 1024, q: 16 * 128, kv: 8 * 128, inter: 3072}
	work := b.TempDir()
	x, y := filepath.Join(work, "x"), filepath.Join(work, "y")
	writeAdapter(b, x, s, spec{rank: 8, alpha: 16, targets: allTargets, dtype: safetensors.F32, seed: 1, base: "Qwen/Qwen3-0.6B"})
	writeAdapter(b, y, s, spec{rank: 4, alpha: 4, rslora: true, targets: allTargets, dtype: safetensors.F32, seed: 2, base: "Qwen/Qwen3-0.6B"})
	var in int64
	for _, d := range []string{x, y} {
		st, err := os.Stat(filepath.Join(d, peft.WeightsFile))
		if err != nil {
			b.Fatal(err)
		}
		in += st.Size()
	}
	b.SetBytes(in)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out := filepath.Join(work, "out"+strconv.Itoa(i))
		if err := peft.Stack(out, x, y); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := os.RemoveAll(out); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
