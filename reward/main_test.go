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
// the built-ins compile once per run) and the plugins built from testdata.
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

// built caches the plugins built from testdata, by directory, for the run.
var built struct {
	mu    sync.Mutex
	paths map[string]*builtPlugin
}

type builtPlugin struct {
	once sync.Once
	path string
	err  error
}

// hostilePlugin builds testdata/hostile with the Go toolchain, once.
func hostilePlugin(t testing.TB) string {
	t.Helper()
	return testdataPlugin(t, "hostile")
}

// testdataPlugin builds the Go plugin in testdata/<name> with the Go
// toolchain, once per run, and returns the .wasm's path. It skips the test
// if there is no toolchain on PATH.
func testdataPlugin(t testing.TB, name string) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go toolchain on PATH to build the %s plugin", name)
	}
	built.mu.Lock()
	if built.paths == nil {
		built.paths = map[string]*builtPlugin{}
	}
	b := built.paths[name]
	if b == nil {
		b = &builtPlugin{}
		built.paths[name] = b
	}
	built.mu.Unlock()
	b.once.Do(func() {
		b.path = filepath.Join(testDir, name+".wasm")
		_, b.err = Build(context.Background(), filepath.Join("testdata", name), b.path, os.Stderr)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
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
