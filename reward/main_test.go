package reward

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// testDir holds what the package's tests share: the compilation cache (so
// the built-ins compile once per run) and the hostile plugin.
var testDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "clawmesh-reward-test-")
	if err != nil {
		panic(err)
	}
	testDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

func cacheDir() string { return filepath.Join(testDir, "cache") }

var hostile struct {
	once sync.Once
	path string
	err  error
}

// hostilePlugin builds testdata/hostile with the Go toolchain, once.
func hostilePlugin(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH to build the hostile plugin")
	}
	hostile.once.Do(func() {
		hostile.path = filepath.Join(testDir, "hostile.wasm")
		_, hostile.err = Build(context.Background(), "testdata/hostile", hostile.path, os.Stderr)
	})
	if hostile.err != nil {
		t.Fatal(hostile.err)
	}
	return hostile.path
}

// writeWasm writes b to a file in t's temp dir.
func writeWasm(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".wasm")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
