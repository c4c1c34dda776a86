package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "f")
	if err := Write(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("content %q", b)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	if err := Create(path, []byte("three"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Create over a file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("Create replaced the file: %q", b)
	}
	other := filepath.Join(filepath.Dir(path), "g")
	if err := Create(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(other); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", fi.Mode())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
