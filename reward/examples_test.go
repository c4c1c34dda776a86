package reward

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// constExample is the example plugin written in the WebAssembly text
// format, with its module committed beside it.
const constExample = "../wasm-rewards/examples/const"

// TestConstExampleScores loads the committed const.wasm (no Go involved)
// and scores with it.
func TestConstExampleScores(t *testing.T) {
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: filepath.Join(constExample, "const.wasm"), Enabled: true}}})
	rw := r.Score(context.Background(), stepSaying("hello"))
	if len(rw.Scores) != 1 {
		t.Fatalf("scores %+v", rw.Scores)
	}
	sc := rw.Scores[0]
	if sc.Plugin != "const" || sc.Value == nil || *sc.Value != 0.5 || len(sc.Labels) != 1 || sc.Labels[0] != "const" || len(sc.Hash) != 64 {
		t.Fatalf("const example: %+v (value %v), want 0.5 labelled const", sc, fmtVal(sc.Value))
	}
}

// TestConstExampleMatchesSource checks that const.wasm is what wat2wasm
// (WABT) makes of const.wat.
func TestConstExampleMatchesSource(t *testing.T) {
	wat2wasm, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skip("no wat2wasm on PATH (apt-get install wabt) to rebuild the const example from its source")
	}
	out := filepath.Join(t.TempDir(), "const.wasm")
	if b, err := exec.Command(wat2wasm, filepath.Join(constExample, "const.wat"), "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm: %v\n%s", err, b)
	}
	built, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(constExample, "const.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, committed) {
		t.Fatalf("wasm-rewards/examples/const/const.wasm (%d bytes) is not what wat2wasm makes of const.wat (%d bytes): run wat2wasm const.wat -o const.wasm there", len(committed), len(built))
	}
}
