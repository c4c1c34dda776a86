package mlx_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// FuzzExport feeds Export adapter directories of arbitrary bytes (they
// arrive from peers): it must not panic, and what it writes, Read must
// load.
func FuzzExport(f *testing.F) {
	cfg := native.TinyConfig(32)
	dir := f.TempDir()
	if err := native.WriteFreshAdapter(dir, cfg, native.LoRAConfig{Rank: 2, Targets: []string{"q_proj", "down_proj"}}, 1, "tiny"); err != nil {
		f.Fatal(err)
	}
	c, err := os.ReadFile(filepath.Join(dir, mlx.PEFTConfigFile))
	if err != nil {
		f.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(dir, mlx.PEFTWeightsFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(c, w)
	f.Add([]byte(`{"r":1,"lora_alpha":1}`), w)
	f.Add(c, []byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '})
	f.Fuzz(func(t *testing.T, c, w []byte) {
		if _, err := safetensors.Parse(w); err != nil {
			return
		}
		in, out := t.TempDir(), filepath.Join(t.TempDir(), "mlx")
		os.WriteFile(filepath.Join(in, mlx.PEFTConfigFile), c, 0o644)
		os.WriteFile(filepath.Join(in, mlx.PEFTWeightsFile), w, 0o644)
		if err := mlx.Export(in, out); err != nil {
			return
		}
		if _, err := mlx.Read(out); err != nil {
			t.Fatalf("Read of what Export wrote: %v", err)
		}
	})
}
