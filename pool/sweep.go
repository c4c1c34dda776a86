package pool

import (
	"context"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// gcState lets the blob sweep run without stopping writers for the length of
// its scan. A writer checks whether a blob exists and, if so, does not write
// it again; a sweep that deleted that blob between the check and the commit
// would leave the new step pointing at nothing. So:
//
//   - writers hold mu shared from their existence checks to their commit, and
//     while a sweep is running they record every blob key they reference in
//     touched;
//   - the sweep takes mu exclusively to start (set sweeping, take a
//     snapshot), scans the snapshot without any lock, then takes mu
//     exclusively again to delete the unreferenced blobs that no writer
//     touched meanwhile.
//
// A writer that committed before the snapshot is seen by the scan; one that
// commits after it started after sweeping was set, and its blobs are spared.
type gcState struct {
	mu       sync.RWMutex
	sweeping bool // written under mu held exclusively

	touchMu sync.Mutex
	touched map[string]struct{}
}

func (g *gcState) enterWrite() { g.mu.RLock() }
func (g *gcState) exitWrite()  { g.mu.RUnlock() }

// touch records that a writer references b; the caller holds mu shared.
func (g *gcState) touch(b *blob) {
	if !g.sweeping {
		return
	}
	key := b.key()
	g.touchMu.Lock()
	g.touched[string(key)] = struct{}{}
	g.touchMu.Unlock()
}

// sweepBlobs deletes the blobs no step record references and returns how
// many it deleted.
func (p *Pool) sweepBlobs(ctx context.Context, in *instance) (int, error) {
	in.gc.mu.Lock()
	in.gc.sweeping = true
	in.gc.touched = make(map[string]struct{})
	snap := in.db.NewSnapshot()
	in.gc.mu.Unlock()
	defer snap.Close()

	finished := false
	defer func() {
		if !finished {
			in.gc.mu.Lock()
			in.gc.sweeping, in.gc.touched = false, nil
			in.gc.mu.Unlock()
		}
	}()

	referenced := make(map[string]struct{})
	err := scan(ctx, snap, prefixStep, prefixStepEnd, func(k, v []byte) error {
		d, err := decodeRecord(v)
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		d.refs(func(key []byte) { referenced[string(key)] = struct{}{} })
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pool: sweep: %w", err)
	}
	var unused [][]byte
	for _, r := range [][2][]byte{{prefixMsg, prefixMsgEnd}, {prefixTools, prefixToolsEnd}} {
		err := scan(ctx, snap, r[0], r[1], func(k, _ []byte) error {
			if _, ok := referenced[string(k)]; !ok {
				unused = append(unused, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("pool: sweep: %w", err)
		}
	}

	if p.testHookSwept != nil {
		p.testHookSwept()
	}

	in.gc.mu.Lock()
	defer in.gc.mu.Unlock()
	finished = true
	defer func() { in.gc.sweeping, in.gc.touched = false, nil }()
	b := in.db.NewBatch()
	defer b.Close()
	n := 0
	for _, k := range unused {
		if _, ok := in.gc.touched[string(k)]; ok {
			continue
		}
		if err := b.Delete(k, nil); err != nil {
			return 0, fmt.Errorf("pool: sweep: %w", err)
		}
		n++
	}
	if n == 0 {
		return 0, nil
	}
	// Writers no longer assume any blob is stored (they are held off until
	// the deletes are committed).
	p.known.clear()
	if err := in.commit(b, pebble.Sync); err != nil {
		return 0, fmt.Errorf("pool: sweep: %w", err)
	}
	return n, nil
}

// iterable is what both *pebble.DB and *pebble.Snapshot offer.
type iterable interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

// scan calls fn for every key in [lower, upper), checking ctx every 1024
// keys. k and v are valid only during the call.
func scan(ctx context.Context, r iterable, lower, upper []byte, fn func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				it.Close()
				return err
			}
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return err
		}
		if err := fn(it.Key(), v); err != nil {
			it.Close()
			return err
		}
	}
	return it.Close()
}
