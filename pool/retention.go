package pool

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ApplyRetention drops the steps that Options.MaxAge and Options.MaxBytes
// say to drop, leaving a tombstone for each, purges the tombstones older
// than Options.TombstoneAge, then deletes the blobs no step references any
// more. It returns how many steps it dropped. Runs are serialized; writers
// are not stopped.
//
// By size, the figure limited is step data as Stats.Bytes counts it: live
// step records plus the blobs they reference. Shipped steps go first, oldest
// first; then all other steps, oldest first, whatever their state.
//
// While the free-space guard holds writes back (Options.MinFree), it also
// drops every shipped step (they have left the device already) and purges
// every tombstone, then compacts the store so that the space they took on
// disk is given back at once.
func (p *Pool) ApplyRetention(ctx context.Context) (int, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	p.retention.Lock()
	defer p.retention.Unlock()

	low := p.LowSpace()
	victims, err := p.chooseVictims(ctx, in, low)
	if err != nil {
		return 0, fmt.Errorf("pool: retention: %w", err)
	}
	dropped := 0
	for _, id := range victims {
		ok, err := p.drop(in, id)
		if err != nil {
			return dropped, fmt.Errorf("pool: retention: %w", err)
		}
		if ok {
			dropped++
		}
	}
	if dropped > 0 {
		if err := in.logSync(); err != nil {
			return dropped, fmt.Errorf("pool: retention: %w", err)
		}
	}
	purged, err := p.purgeTombstones(ctx, in, low)
	if err != nil {
		return dropped, fmt.Errorf("pool: retention: %w", err)
	}
	swept, err := p.sweepBlobs(ctx, in)
	if err != nil {
		return dropped, err
	}
	p.log.Info("retention", "dropped", dropped, "tombstones_purged", purged, "blobs_deleted", swept)
	if low && dropped+purged+swept > 0 {
		// A deletion frees no disk space until the tables holding what it
		// deleted are rewritten; under the guard that cannot wait for
		// Pebble's own compactions.
		if err := in.db.Compact(ctx, []byte{0}, []byte{0xff}, false); err != nil {
			return dropped, fmt.Errorf("pool: retention: compacting to make room: %w", err)
		}
		p.log.Info("retention made room", "disk_bytes", in.db.Metrics().DiskSpaceUsage())
	}
	return dropped, nil
}

// purgeTombstones deletes the tombstones of steps older than
// Options.TombstoneAge (their record and their state index entry), in
// one synced batch.
func (p *Pool) purgeTombstones(ctx context.Context, in *instance, all bool) (int, error) {
	if p.opts.TombstoneAge < 0 && !all {
		return 0, nil
	}
	cutoff := p.now().Add(-p.opts.TombstoneAge)
	if all {
		cutoff = maxTime
	}
	b := in.db.NewBatch()
	defer b.Close()
	n := 0
	snap := in.db.NewSnapshot()
	defer snap.Close()
	err := scan(ctx, snap, prefixStep, prefixStepEnd, func(k, v []byte) error {
		h, _, err := decodeHeader(v)
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		if h.state != core.StateDropped || !h.t.Before(cutoff) {
			return nil
		}
		id := core.StepID(k[len(prefixStep):])
		deleteIndex(b, id, h)
		n++
		return b.Delete(stepKey(id), nil)
	})
	if err != nil || n == 0 {
		return 0, err
	}
	// A step written since the snapshot under a purged id is not a
	// tombstone any more: Put refuses to write over one, so none is.
	if err := in.commit(b, pebble.Sync); err != nil {
		return 0, err
	}
	return n, nil
}

type retained struct {
	id    core.StepID
	t     time.Time
	state core.State
	size  int64
	gone  bool
}

// chooseVictims picks the steps to drop, from a snapshot.
func (p *Pool) chooseVictims(ctx context.Context, in *instance, low bool) ([]core.StepID, error) {
	if p.opts.MaxAge == 0 && p.opts.MaxBytes == 0 && !low {
		return nil, nil
	}
	snap := in.db.NewSnapshot()
	defer snap.Close()

	bySize := p.opts.MaxBytes > 0
	var steps []retained
	refs := make(map[string]int32) // blob key → live references (by size only)
	var total int64
	err := scan(ctx, snap, prefixStep, prefixStepEnd, func(k, v []byte) error {
		d, err := decodeRecord(v)
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		if d.state == core.StateDropped {
			return nil
		}
		id := core.StepID(k[len(prefixStep):])
		steps = append(steps, retained{id: id, t: d.t, state: d.state, size: int64(len(v))})
		total += int64(len(v))
		if bySize {
			d.refs(func(key []byte) { refs[string(key)]++ })
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	blobSize := make(map[string]int64, len(refs))
	if bySize {
		for _, r := range [][2][]byte{{prefixMsg, prefixMsgEnd}, {prefixTools, prefixToolsEnd}} {
			err := scan(ctx, snap, r[0], r[1], func(k, v []byte) error {
				if refs[string(k)] > 0 {
					blobSize[string(k)] = int64(len(v))
					total += int64(len(v))
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
	}

	// Shipped and held first (nothing waits for them), then by time, then
	// by id.
	slices.SortFunc(steps, func(a, b retained) int {
		as := a.state == core.StateShipped || a.state == core.StateHeld
		bs := b.state == core.StateShipped || b.state == core.StateHeld
		if as != bs {
			if as {
				return -1
			}
			return 1
		}
		if c := a.t.Compare(b.t); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})

	var victims []core.StepID
	release := func(st *retained) error {
		st.gone = true
		victims = append(victims, st.id)
		if !bySize {
			return nil
		}
		total -= st.size
		rec, err := getCopy(snap, stepKey(st.id))
		if err != nil {
			return err
		}
		d, err := decodeRecord(rec)
		if err != nil {
			return err
		}
		d.refs(func(key []byte) {
			if refs[string(key)]--; refs[string(key)] == 0 {
				total -= blobSize[string(key)]
			}
		})
		return nil
	}
	if low {
		for i := range steps {
			if steps[i].state == core.StateShipped {
				if err := release(&steps[i]); err != nil {
					return nil, err
				}
			}
		}
	}
	if p.opts.MaxAge > 0 {
		cutoff := p.now().Add(-p.opts.MaxAge)
		for i := range steps {
			if !steps[i].gone && steps[i].t.Before(cutoff) {
				if err := release(&steps[i]); err != nil {
					return nil, err
				}
			}
		}
	}
	if bySize {
		for i := range steps {
			if total <= p.opts.MaxBytes {
				break
			}
			if steps[i].gone {
				continue
			}
			if err := release(&steps[i]); err != nil {
				return nil, err
			}
		}
	}
	return victims, nil
}

// drop replaces the step's record with a tombstone, unsynced (the caller
// syncs once for all). It reports false if the step is gone already.
func (p *Pool) drop(in *instance, id core.StepID) (bool, error) {
	mu := p.stripe(in, id)
	mu.Lock()
	defer mu.Unlock()
	old, exists, err := p.oldHeader(in, id)
	if err != nil {
		return false, err
	}
	if !exists || old.state == core.StateDropped {
		return false, nil
	}
	b := in.db.NewBatch()
	defer b.Close()
	deleteIndex(b, id, old)
	tomb := old
	tomb.state = core.StateDropped
	setIndex(b, id, tomb)
	if err := b.Set(stepKey(id), tombstoneRecord(old), nil); err != nil {
		return false, err
	}
	if err := in.commit(b, pebble.NoSync); err != nil {
		return false, err
	}
	return true, nil
}
