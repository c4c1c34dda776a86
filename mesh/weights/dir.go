package weights

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// Dir is the bundles a peer holds, on disk: each bundle's bytes
// (ID.bundle), its signed manifest (ID.manifest), and a fetch in progress
// (ID.bundle.part). A bundle counts as held once both files are there:
// the manifest is written last.
type Dir struct {
	path string

	mu   sync.Mutex
	open map[[sha256.Size]byte]*openBundle // open for serving
}

// openBundle is a held bundle open for serving: its file, and the file
// mapped into memory where the system allows, so that the server copies
// a chunk once, into its packets, instead of reading it into a buffer
// first for every fetcher. It stays open while the Dir keeps it and while
// a reader of it is not closed. Held bundles are never written in place
// (a bundle is renamed into place whole), so the mapping cannot shrink
// under the server; a disk error under a mapped page would stop the
// process where ReadAt returns it, a risk taken for bundles that are read
// from the page cache nearly always.
type openBundle struct {
	f    *os.File
	data []byte // the mapped file; nil where it is not mapped
	refs int    // guarded by Dir.mu: 1 while the Dir keeps it, +1 per open reader
}

// release drops a reference, closing the bundle after the last. The
// caller holds Dir.mu.
func (b *openBundle) release() {
	if b.refs--; b.refs > 0 {
		return
	}
	if b.data != nil {
		unmap(b.data)
		b.data = nil
	}
	b.f.Close()
}

// bundleReader is what Dir.Open hands a server: a reader of one open
// bundle, which must be closed.
type bundleReader struct {
	d      *Dir
	b      *openBundle
	closed bool
}

// ReadAt implements io.ReaderAt.
func (r *bundleReader) ReadAt(p []byte, off int64) (int, error) {
	if r.b.data == nil {
		return r.b.f.ReadAt(p, off)
	}
	if off < 0 || off > int64(len(r.b.data)) {
		return 0, fmt.Errorf("weights: read at %d of a %d-byte bundle", off, len(r.b.data))
	}
	n := copy(p, r.b.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Bytes returns n bytes at off in memory, without a copy, where the bundle
// is mapped; they stay valid until the reader is closed.
func (r *bundleReader) Bytes(off int64, n int) ([]byte, bool) {
	if r.b.data == nil || off < 0 || n < 0 || off+int64(n) > int64(len(r.b.data)) {
		return nil, false
	}
	return r.b.data[off : off+int64(n) : off+int64(n)], true
}

// Close releases the reader's hold on the bundle.
func (r *bundleReader) Close() error {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.b.release()
	}
	return nil
}

// OpenDir opens (making it if needed) a bundle directory.
func OpenDir(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	return &Dir{path: path, open: map[[sha256.Size]byte]*openBundle{}}, nil
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// BundlePath is where bundle id's bytes are kept.
func (d *Dir) BundlePath(id string) string { return filepath.Join(d.path, id+".bundle") }

func (d *Dir) manifestPath(id string) string { return filepath.Join(d.path, id+".manifest") }

// Fetch fetches m's bundle into the directory with f (resuming a partial
// fetch) and keeps m beside it.
func (d *Dir) Fetch(ctx context.Context, f *Fetcher, m *chunks.Manifest, sources []Source, progress func(Progress)) error {
	return d.FetchFrom(ctx, f, m, func() ([]Source, <-chan struct{}) { return sources, nil }, progress)
}

// FetchFrom is Fetch from sources that may grow while it runs
// (Fetcher.FetchFrom).
func (d *Dir) FetchFrom(ctx context.Context, f *Fetcher, m *chunks.Manifest, feed SourceFeed, progress func(Progress)) error {
	if err := f.FetchFrom(ctx, m, feed, d.BundlePath(m.BundleID()), progress); err != nil {
		return err
	}
	return d.PutManifest(m)
}

// Add keeps bundle b with its manifest (the bundle a trainer made or
// already had).
func (d *Dir) Add(m *chunks.Manifest, b []byte) error {
	if err := checkReader(bytes.NewReader(b), m); err != nil {
		return err
	}
	if err := atomicfile.Write(d.BundlePath(m.BundleID()), b, 0o600); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return d.PutManifest(m)
}

// PutManifest keeps m beside its bundle, whose bytes must be there: it is
// the last step of keeping a bundle.
func (d *Dir) PutManifest(m *chunks.Manifest) error {
	if _, err := os.Stat(d.BundlePath(m.BundleID())); err != nil {
		return fmt.Errorf("weights: no bundle for %s: %w", m.Name(), err)
	}
	if err := atomicfile.Write(d.manifestPath(m.BundleID()), m.Marshal(), 0o600); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// Manifest returns the manifest kept for bundle id.
func (d *Dir) Manifest(id string) (*chunks.Manifest, error) {
	b, err := os.ReadFile(d.manifestPath(id))
	if err != nil {
		return nil, err
	}
	return chunks.ParseManifest(b)
}

// Held lists the manifests of the bundles held, newest version first, the
// certified ones before those that are not (which any trainer could have
// signed, with any number: what an older release accepted).
func (d *Dir) Held() []*chunks.Manifest {
	ents, _ := os.ReadDir(d.path)
	var out []*chunks.Manifest
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".manifest")
		if !ok {
			continue
		}
		if _, err := os.Stat(d.BundlePath(id)); err != nil {
			continue
		}
		if m, err := d.Manifest(id); err == nil && m.BundleID() == id {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if ci, cj := out[i].Cert != nil, out[j].Cert != nil; ci != cj {
			return ci
		}
		return out[i].Version > out[j].Version
	})
	return out
}

// Partial reports how many bytes of bundle id a fetch left on disk.
func (d *Dir) Partial(id string) (int64, bool) {
	st, err := os.Stat(d.BundlePath(id) + ".part")
	if err != nil {
		return 0, false
	}
	return st.Size(), true
}

// Open implements Holdings. The reader it returns must be closed (it is an
// io.Closer).
func (d *Dir) Open(bundle [sha256.Size]byte) (*chunks.Manifest, io.ReaderAt, bool) {
	var m *chunks.Manifest
	if bundle == ([sha256.Size]byte{}) {
		held := d.Held()
		if len(held) == 0 {
			return nil, nil, false
		}
		m = held[0]
	} else {
		var err error
		if m, err = d.Manifest(hex.EncodeToString(bundle[:])); err != nil {
			return nil, nil, false
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.open[m.Bundle]
	if b == nil {
		f, err := os.Open(d.BundlePath(m.BundleID()))
		if err != nil {
			return nil, nil, false
		}
		b = &openBundle{f: f, refs: 1}
		// A bundle is never written again once held (a new version is a new
		// file), so its mapping never changes under the server.
		if st, err := f.Stat(); err == nil && st.Size() == int64(m.Size) {
			b.data = mapFile(f, st.Size())
		}
		d.open[m.Bundle] = b
	}
	b.refs++
	return m, &bundleReader{d: d, b: b}, true
}

// Remove drops bundle id (its bytes, manifest and any partial fetch).
func (d *Dir) Remove(id string) error {
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != sha256.Size {
		return fmt.Errorf("weights: bad bundle id %q", id)
	}
	d.mu.Lock()
	if ob := d.open[[sha256.Size]byte(b)]; ob != nil {
		delete(d.open, [sha256.Size]byte(b))
		ob.release()
	}
	d.mu.Unlock()
	var errs []error
	for _, p := range []string{d.manifestPath(id), d.BundlePath(id), d.BundlePath(id) + ".part"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close closes the bundles open for serving (each once its last reader is
// closed).
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, b := range d.open {
		delete(d.open, k)
		b.release()
	}
	return nil
}
