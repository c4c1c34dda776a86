package llamacpp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeNode writes a node that prints version v into a new directory.
func fakeNode(t *testing.T, v string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "node"), []byte("#!/bin/sh\necho "+v+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestNodeBin(t *testing.T) {
	old, cur := fakeNode(t, "v18.19.0"), fakeNode(t, "v22.3.0")

	t.Setenv("CLAWMESH_NODE_BIN_DIR", cur)
	t.Setenv("PATH", old)
	if got, err := NodeBin(); err != nil || got != filepath.Join(cur, "node") {
		t.Fatalf("NodeBin() = %q, %v; want the node of CLAWMESH_NODE_BIN_DIR", got, err)
	}

	t.Setenv("CLAWMESH_NODE_BIN_DIR", old)
	t.Setenv("PATH", cur)
	if got, err := NodeBin(); err != nil || got != filepath.Join(cur, "node") {
		t.Fatalf("NodeBin() = %q, %v; want the node on PATH past an old one", got, err)
	}

	t.Setenv("PATH", old)
	if _, err := NodeBin(); err == nil || !strings.Contains(err.Error(), "version 18 is older than 20") {
		t.Fatalf("NodeBin() with only node 18: %v", err)
	}

	t.Setenv("CLAWMESH_NODE_BIN_DIR", "")
	t.Setenv("PATH", t.TempDir())
	if _, err := NodeBin(); err == nil || !strings.Contains(err.Error(), "no node binary") {
		t.Fatalf("NodeBin() without node: %v", err)
	}
}

func TestDir(t *testing.T) {
	if _, err := os.Stat(filepath.Join(Dir(), "package.json")); err != nil {
		t.Fatalf("Dir() = %q has no package.json: %v", Dir(), err)
	}
	if _, err := os.Stat(Probe()); err != nil {
		t.Fatal(err)
	}
}

// recorder is a testing.TB that records a skip or a failure.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skipf(format string, args ...any)  { r.skipped = format }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = format }

func TestRequire(t *testing.T) {
	t.Setenv("CLAWMESH_NODE_BIN_DIR", "")
	t.Setenv("PATH", fakeNode(t, "v18.0.0"))
	t.Setenv("CLAWMESH_REQUIRE_LLAMACPP", "")
	r := &recorder{TB: t}
	if Require(r); r.skipped == "" || r.failed != "" {
		t.Fatalf("without node >= 20: skipped %q, failed %q; want a skip", r.skipped, r.failed)
	}
	t.Setenv("CLAWMESH_REQUIRE_LLAMACPP", "1")
	r = &recorder{TB: t}
	if Require(r); r.failed == "" {
		t.Fatal("CLAWMESH_REQUIRE_LLAMACPP=1 without node >= 20 did not fail")
	}
}
