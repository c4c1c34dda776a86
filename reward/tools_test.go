package reward

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// buildScaffold builds the scaffolded plugin in dir with the module proxy
// switched off, runs the scaffold's own test natively, and returns the
// module's path.
func buildScaffold(t *testing.T, dir string) string {
	t.Helper()
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	t.Setenv("GOWORK", "off")
	out, err := Build(context.Background(), dir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "test", "./...")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test in the scaffold: %v\n%s", err, b)
	}
	return out
}

// TestScaffoldBuildsOffline scaffolds a plugin outside this module, builds it
// with the module proxy switched off, and scores with it.
func TestScaffoldBuildsOffline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	dir := filepath.Join(t.TempDir(), "polite")
	if err := Scaffold(dir, "polite"); err != nil {
		t.Fatal(err)
	}
	if err := Scaffold(dir, "polite"); !errors.Is(err, ErrExists) {
		t.Fatalf("second scaffold: %v", err)
	}
	if err := Scaffold(t.TempDir(), "Bad Name"); !errors.Is(err, ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
	out := buildScaffold(t, dir)
	if out != filepath.Join(dir, "polite.wasm") {
		t.Fatalf("built %s", out)
	}
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: out, Enabled: true}}})
	step := stepSaying("hi")
	sc, _ := r.ScorePlugin(context.Background(), "polite", step)
	if sc.Value == nil || *sc.Value != 0.5 || len(sc.Labels) != 1 {
		t.Fatalf("scaffolded plugin on a thanked step: %+v", sc)
	}
	if _, err := os.Stat(filepath.Join(dir, "kit", "source.go")); err == nil {
		t.Fatal("the kit copy carries the embedding file")
	}
}
