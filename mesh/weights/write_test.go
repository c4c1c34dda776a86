package weights

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// TestChunkWrites writes chunks the way a fetch does: whole blocks
// directly where the file system allows it, the rest through the page
// cache, and everything through the cache once a direct write fails.
func TestChunkWrites(t *testing.T) {
	for _, n := range []int{1, 4095, chunks.ChunkSize} {
		if b := alignedBuffer(n); len(b) != n || uintptr(unsafe.Pointer(&b[0]))%directAlign != 0 {
			t.Fatalf("alignedBuffer(%d): %d bytes at %p", n, len(b), &b[0])
		}
	}
	path := filepath.Join(t.TempDir(), "part")
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	want := randomBytes(t, 3*chunks.ChunkSize+5)
	buf := alignedBuffer(chunks.ChunkSize)
	put := func(fs *fetchState, i int, direct *bool) {
		t.Helper()
		off := int64(i) * chunks.ChunkSize
		n := copy(buf, want[off:min(off+chunks.ChunkSize, int64(len(want)))])
		if err := fs.write(buf[:n], off, direct); err != nil {
			t.Fatal(err)
		}
	}

	// Direct writes, where this file system has them, and the tail
	// through the cache.
	fs := &fetchState{file: file, direct: openDirect(path)}
	direct := fs.direct != nil
	if direct {
		defer fs.direct.Close()
	} else {
		t.Log("no direct writes on this file system: every chunk goes through the page cache")
	}
	put(fs, 0, &direct)
	put(fs, 3, &direct)
	if fs.direct != nil && !direct {
		t.Error("a direct write failed on a file opened for them")
	}

	// A direct write that fails (here: a descriptor opened read-only)
	// falls back to the page cache and turns direct writes off.
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	fs = &fetchState{file: file, direct: ro}
	direct = true
	put(fs, 1, &direct)
	if direct {
		t.Error("direct writes still on after one failed")
	}
	put(fs, 2, &direct)

	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the file differs from the chunks written (%d bytes, want %d)", len(got), len(want))
	}
}
