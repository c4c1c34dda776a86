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
)

// Dir is the bundles a peer holds, on disk: each bundle's bytes
// (ID.bundle), its signed manifest (ID.manifest), and a fetch in progress
// (ID.bundle.part). A bundle counts as held once both files are there:
// the manifest is written last.
type Dir struct {
	path string

	mu    sync.Mutex
	files map[[sha256.Size]byte]*os.File // open for serving
}

// OpenDir opens (making it if needed) a bundle directory.
func OpenDir(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	return &Dir{path: path, files: map[[sha256.Size]byte]*os.File{}}, nil
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// BundlePath is where bundle id's bytes are kept.
func (d *Dir) BundlePath(id string) string { return filepath.Join(d.path, id+".bundle") }

func (d *Dir) manifestPath(id string) string { return filepath.Join(d.path, id+".manifest") }

// Fetch fetches m's bundle into the directory with f (resuming a partial
// fetch) and keeps m beside it.
func (d *Dir) Fetch(ctx context.Context, f *Fetcher, m *Manifest, sources []Source, progress func(Progress)) error {
	if err := f.Fetch(ctx, m, sources, d.BundlePath(m.BundleID()), progress); err != nil {
		return err
	}
	return d.PutManifest(m)
}

// Add keeps bundle b with its manifest (the bundle a trainer made or
// already had).
func (d *Dir) Add(m *Manifest, b []byte) error {
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
func (d *Dir) PutManifest(m *Manifest) error {
	if _, err := os.Stat(d.BundlePath(m.BundleID())); err != nil {
		return fmt.Errorf("weights: no bundle for %s: %w", m.Name(), err)
	}
	if err := atomicfile.Write(d.manifestPath(m.BundleID()), m.Marshal(), 0o600); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// Manifest returns the manifest kept for bundle id.
func (d *Dir) Manifest(id string) (*Manifest, error) {
	b, err := os.ReadFile(d.manifestPath(id))
	if err != nil {
		return nil, err
	}
	return ParseManifest(b)
}

// Held lists the manifests of the bundles held, newest version first.
func (d *Dir) Held() []*Manifest {
	ents, _ := os.ReadDir(d.path)
	var out []*Manifest
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
	sort.Slice(out, func(i, j int) bool { return out[i].Version > out[j].Version })
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

// Open implements Holdings.
func (d *Dir) Open(bundle [sha256.Size]byte) (*Manifest, io.ReaderAt, bool) {
	var m *Manifest
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
	f := d.files[m.Bundle]
	if f == nil {
		var err error
		if f, err = os.Open(d.BundlePath(m.BundleID())); err != nil {
			return nil, nil, false
		}
		d.files[m.Bundle] = f
	}
	return m, f, true
}

// Remove drops bundle id (its bytes, manifest and any partial fetch).
func (d *Dir) Remove(id string) error {
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != sha256.Size {
		return fmt.Errorf("weights: bad bundle id %q", id)
	}
	d.mu.Lock()
	if f := d.files[[sha256.Size]byte(b)]; f != nil {
		f.Close()
		delete(d.files, [sha256.Size]byte(b))
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

// Close closes the files open for serving.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, f := range d.files {
		f.Close()
		delete(d.files, k)
	}
	return nil
}
