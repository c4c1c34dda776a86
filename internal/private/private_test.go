package private

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(dir, "mesh"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range Secrets {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if note, err := CheckDataDir(dir); err != nil || note != "" {
		t.Fatalf("an owner-only directory: %q %v", note, err)
	}
	key := filepath.Join(dir, "mesh", "admin.key")
	os.Chmod(key, 0o644)
	_, err := CheckDataDir(dir)
	if !errors.Is(err, ErrExposed) || !strings.Contains(err.Error(), "chmod 600 "+key) {
		t.Fatalf("a world-readable key: %v", err)
	}
	os.Chmod(key, 0o600)
	os.Chmod(dir, 0o755)
	note, err := CheckDataDir(dir)
	if err != nil || !strings.Contains(note, "made 0700") {
		t.Fatalf("a world-readable directory: %q %v", note, err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("the directory is still %#o", fi.Mode().Perm())
	}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("token = 'x'"), 0o640)
	if err := CheckFile(cfg); !errors.Is(err, ErrExposed) {
		t.Fatalf("a group-readable config: %v", err)
	}
	if err := CheckFile(filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("a missing file: %v", err)
	}
}
