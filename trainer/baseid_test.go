package trainer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBaseIDSharded checks that a base model whose weights are split in
// shards, as the larger published models are, is named by its shards: the
// same shards give the same hash, a changed shard another, and an index
// that names no file or a file outside the directory is refused.
func TestBaseIDSharded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "Qwen3-4B")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := BaseID(dir); err == nil || !strings.Contains(err.Error(), "model.safetensors.index.json") {
		t.Fatalf("a directory without weights: %v", err)
	}
	write("model-00001-of-00002.safetensors", "first shard")
	write("model-00002-of-00002.safetensors", "second shard")
	write("model.safetensors.index.json", `{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
		"b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}`)
	name, h1, err := BaseID(dir)
	if err != nil {
		t.Fatal(err)
	}
	if name != "Qwen3-4B" || len(h1) != 64 {
		t.Fatalf("BaseID = %q, %q", name, h1)
	}
	if _, again, _ := BaseID(dir); again != h1 {
		t.Fatalf("the same shards hash to %s, then %s", h1, again)
	}
	// The same bytes in one file are another model file layout, not
	// mistaken for it.
	other := filepath.Join(t.TempDir(), "one")
	os.Mkdir(other, 0o755)
	os.WriteFile(filepath.Join(other, "model.safetensors"), []byte("first shard"), 0o644)
	if _, h, err := BaseID(other); err != nil || h == h1 {
		t.Fatalf("single file: %s, %v", h, err)
	}

	write("model-00002-of-00002.safetensors", "second shard, changed")
	later := time.Now().Add(time.Second)
	os.Chtimes(filepath.Join(dir, "model-00002-of-00002.safetensors"), later, later)
	_, h2, err := BaseID(dir)
	if err != nil {
		t.Fatal(err)
	}
	if h2 == h1 {
		t.Fatal("a changed shard left the hash as it was")
	}

	os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors"))
	if _, _, err := BaseID(dir); err == nil {
		t.Fatal("a missing shard was not noticed")
	}
	write("model.safetensors.index.json", `{"weight_map": {"a": "../elsewhere.safetensors"}}`)
	if _, _, err := BaseID(dir); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("a shard outside the directory: %v", err)
	}
	write("model.safetensors.index.json", `{"weight_map": {}}`)
	if _, _, err := BaseID(dir); err == nil {
		t.Fatal("an index with no shard was accepted")
	}
}
