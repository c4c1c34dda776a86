// Package store is a trainer's batch store: the batches it pulled from the
// mesh, verified, kept in Pebble under their content address with what
// their header says, so that anyone can list what a trainer received and
// read any batch back as steps.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/pebblelock"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
)

// Errors.
var (
	ErrNotFound = fmt.Errorf("store: %w", mesh.ErrNoBatch)
	// ErrLocked: another process holds the store.
	ErrLocked = errors.New("store: in use by another process")
)

// Entry describes a stored batch.
type Entry struct {
	ID       core.BatchID `json:"id"`
	Size     int          `json:"size"`
	Received time.Time    `json:"received"`
	// From is the peer that announced the batch: the device that shipped
	// it ("" when unknown).
	From   mesh.PeerID  `json:"from,omitempty"`
	Header batch.Header `json:"header"`
}

// Store is a trainer's batch store. It is safe for concurrent use.
type Store struct {
	db   *pebble.DB
	now  func() time.Time
	puts atomic.Uint64
}

// Open opens (or makes) the store in dir.
func Open(dir string, now func() time.Time) (*Store, error) {
	if now == nil {
		now = time.Now
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: quiet{}})
	if err != nil {
		if pebblelock.Held(err) {
			return nil, fmt.Errorf("%w: %v", ErrLocked, err)
		}
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{db: db, now: now}, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

func dataKey(id core.BatchID) []byte { return append([]byte("b/"), id...) }
func metaKey(id core.BatchID) []byte { return append([]byte("m/"), id...) }

// Has reports whether the store holds batch id.
func (s *Store) Has(ctx context.Context, id core.BatchID) (bool, error) {
	_, closer, err := s.db.Get(metaKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: %w", err)
	}
	closer.Close()
	return true, nil
}

// Put stores a verified batch (b is payload decoded) in one synced write.
func (s *Store) Put(ctx context.Context, id core.BatchID, payload []byte, b *batch.Batch) error {
	return s.PutFrom(ctx, id, "", payload, b)
}

// PutFrom is Put that also records the peer that announced the batch
// (mesh.OriginStore).
func (s *Store) PutFrom(ctx context.Context, id core.BatchID, from mesh.PeerID, payload []byte, b *batch.Batch) error {
	if batch.ID(payload) != id {
		return fmt.Errorf("store: %w", batch.ErrHashMismatch)
	}
	e := Entry{ID: id, Size: len(payload), Received: s.now().UTC(), From: from, Header: b.Header}
	meta, err := json.Marshal(e)
	if err != nil {
		return err
	}
	wb := s.db.NewBatch()
	wb.Set(dataKey(id), payload, nil)
	wb.Set(metaKey(id), meta, nil)
	if err := wb.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s.puts.Add(1)
	return nil
}

// Puts counts the batches stored since Open: a reader that saw the same
// count has seen every batch.
func (s *Store) Puts() uint64 { return s.puts.Load() }

// Payload returns a batch's bytes (mesh.Source).
func (s *Store) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	v, closer, err := s.db.Get(dataKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// Batch returns a batch decoded and verified from its stored bytes.
func (s *Store) Batch(ctx context.Context, id core.BatchID) (*batch.Batch, error) {
	b, err := s.Payload(ctx, id)
	if err != nil {
		return nil, err
	}
	return batch.Verify(b, id, batch.Limits{MaxBytes: int64(len(b))})
}

// Entry returns what the store knows of batch id.
func (s *Store) Entry(ctx context.Context, id core.BatchID) (Entry, error) {
	v, closer, err := s.db.Get(metaKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return Entry{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("store: %w", err)
	}
	defer closer.Close()
	var e Entry
	if err := json.Unmarshal(v, &e); err != nil {
		return Entry{}, fmt.Errorf("store: entry %s: %v", id, err)
	}
	return e, nil
}

// List returns the stored batches, oldest first.
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte("m/"), UpperBound: []byte("m0")})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer it.Close()
	var out []Entry
	for ok := it.First(); ok; ok = it.Next() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var e Entry
		if err := json.Unmarshal(it.Value(), &e); err != nil {
			return nil, fmt.Errorf("store: entry %q: %v", it.Key(), err)
		}
		out = append(out, e)
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := a.Received.Compare(b.Received); c != 0 {
			return c
		}
		return strings.Compare(string(a.ID), string(b.ID))
	})
	return out, nil
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

var _ mesh.OriginStore = (*Store)(nil)
