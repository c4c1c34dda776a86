package weights

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// TestDirServes serves a bundle from a Dir, whose readers hand the server
// the mapped file where the system maps it, and checks that a reader
// stays good after the bundle is removed, until it is closed.
func TestDirServes(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 3*chunks.ChunkSize+7)
	m := w.manifest(t, b, 1, 1, 1)
	d, err := OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Add(m, b); err != nil {
		t.Fatal(err)
	}

	// A fetch from it gets the bundle whole.
	me := newTestPeer(t)
	src, _ := serve(t, d, me.id)
	path := filepath.Join(t.TempDir(), "b")
	if err := newFetcher(t, me, FetcherConfig{PerRequest: 2}).Fetch(context.Background(), m, []Source{src}, path, nil); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, path, b)

	_, r, ok := d.Open(m.Bundle)
	if !ok {
		t.Fatal("the Dir does not open its bundle")
	}
	read := func(what string) {
		t.Helper()
		got := make([]byte, len(b)-5)
		if n, err := r.ReadAt(got, 5); n != len(got) || err != nil || !bytes.Equal(got, b[5:]) {
			t.Fatalf("%s: ReadAt read %d bytes, %v, equal %v", what, n, err, bytes.Equal(got, b[5:]))
		}
		if n, err := r.ReadAt(make([]byte, 8), int64(len(b))-4); n != 4 || err != io.EOF {
			t.Fatalf("%s: ReadAt past the end: %d, %v", what, n, err)
		}
		if mem, ok := r.(inMemory); ok {
			if c, ok := mem.Bytes(chunks.ChunkSize, chunks.ChunkSize); ok && !bytes.Equal(c, b[chunks.ChunkSize:2*chunks.ChunkSize]) {
				t.Fatalf("%s: Bytes gives other bytes", what)
			}
			if _, ok := mem.Bytes(3*chunks.ChunkSize, 8); ok {
				t.Fatalf("%s: Bytes past the end", what)
			}
		}
	}
	read("open")
	if err := d.Remove(m.BundleID()); err != nil {
		t.Fatal(err)
	}
	read("after Remove") // the reader still holds it
	if _, _, ok := d.Open(m.Bundle); ok {
		t.Error("a removed bundle opens")
	}
	if err := r.(io.Closer).Close(); err != nil {
		t.Fatal(err)
	}
	r.(io.Closer).Close() // a second Close is harmless
}
