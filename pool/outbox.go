package pool

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Batch is an outbox batch: scored steps taken together to leave the device.
// The pool keeps the batch's step list and moves its steps from scored to
// batched when it makes it, and to shipped when the batch is marked shipped.
// What the batch's bytes on the wire are (scrubbed, per the user's policy)
// is the node's business, not the pool's.
type Batch struct {
	// ID is the sha256 (hex) of the steps' ids and records as they were
	// when batched, in order.
	ID      core.BatchID  `json:"id"`
	Steps   []core.StepID `json:"steps"`
	Created time.Time     `json:"created"`
	// Shipped is when MarkShipped was called; zero until then.
	Shipped time.Time `json:"shipped,omitzero"`
}

func batchKey(id core.BatchID) []byte {
	return append(append(make([]byte, 0, len(prefixOutbox)+len(id)), prefixOutbox...), id...)
}

// Batch takes up to max scored steps, oldest first, into a new outbox
// batch: it records the batch and moves the steps to batched, in one synced
// commit, and returns the batch. With no scored step it returns nil.
func (p *Pool) Batch(ctx context.Context, max int) (*Batch, error) {
	if max <= 0 {
		return nil, fmt.Errorf("pool: batch: max %d is not positive", max)
	}
	done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	p.outbox.Lock()
	defer p.outbox.Unlock()

	var ids []core.StepID
	r := makeRange(statePrefix(core.StateScored), time.Time{}, time.Time{}, nil)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: r.lower, UpperBound: r.upper})
	if err != nil {
		return nil, fmt.Errorf("pool: batch: %w", err)
	}
	for valid := it.First(); valid && len(ids) < max; valid = it.Next() {
		_, id, ok := splitIndexKey(it.Key(), r.prefixLen)
		if !ok {
			it.Close()
			return nil, fmt.Errorf("pool: batch: %w: index key %q", errCorrupt, it.Key())
		}
		ids = append(ids, id)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("pool: batch: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}

	unlock := p.lockSteps(ids)
	defer unlock()
	h := sha256.New()
	b := &Batch{Created: p.now()}
	var steps []*core.Step
	for _, id := range ids {
		// Under the lock, the step may have moved on since the scan (new
		// feedback sends a scored step back to closed): take it only if it
		// is still scored.
		rec, err := getCopy(p.db, stepKey(id))
		if errors.Is(err, pebble.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pool: batch: %w", err)
		}
		d, err := decodeRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("pool: batch: step %s: %w", id, err)
		}
		if d.state != core.StateScored {
			continue
		}
		s, err := d.materialize(p.db, p.cache)
		if err != nil {
			return nil, fmt.Errorf("pool: batch: step %s: %w", id, err)
		}
		h.Write(binary.AppendUvarint(nil, uint64(len(id))))
		h.Write([]byte(id))
		h.Write(binary.AppendUvarint(nil, uint64(len(rec))))
		h.Write(rec)
		s.State = core.StateBatched
		steps = append(steps, s)
		b.Steps = append(b.Steps, id)
	}
	if len(steps) == 0 {
		return nil, nil
	}
	b.ID = core.BatchID(hex.EncodeToString(h.Sum(nil)))
	rec, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("pool: batch: %w", err)
	}
	if err := p.writeWith(steps, [][2][]byte{{batchKey(b.ID), rec}}, pebble.Sync); err != nil {
		return nil, fmt.Errorf("pool: batch: %w", err)
	}
	return b, nil
}

// GetBatch returns the outbox batch with the given id, or an error wrapping
// ErrNoBatch.
func (p *Pool) GetBatch(ctx context.Context, id core.BatchID) (*Batch, error) {
	done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return p.getBatch(id)
}

func (p *Pool) getBatch(id core.BatchID) (*Batch, error) {
	rec, err := getCopy(p.db, batchKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNoBatch, id)
	}
	if err != nil {
		return nil, fmt.Errorf("pool: batch %s: %w", id, err)
	}
	var b Batch
	if err := json.Unmarshal(rec, &b); err != nil {
		return nil, fmt.Errorf("pool: batch %s: %w: %v", id, errCorrupt, err)
	}
	return &b, nil
}

// MarkShipped records that the batch left the device: its steps move from
// batched to shipped (steps retention has dropped meanwhile stay dropped),
// with the batch's record, in one synced commit. Marking a shipped batch
// again does nothing; an unknown id is an error wrapping ErrNoBatch.
func (p *Pool) MarkShipped(ctx context.Context, id core.BatchID) error {
	done, err := p.enter(ctx)
	if err != nil {
		return err
	}
	defer done()
	p.outbox.Lock()
	defer p.outbox.Unlock()
	b, err := p.getBatch(id)
	if err != nil {
		return err
	}
	if !b.Shipped.IsZero() {
		return nil
	}
	unlock := p.lockSteps(b.Steps)
	defer unlock()
	var steps []*core.Step
	for _, sid := range b.Steps {
		s, err := p.get(p.db, sid)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("pool: ship %s: %w", id, err)
		}
		if s.State != core.StateBatched {
			continue
		}
		s.State = core.StateShipped
		steps = append(steps, s)
	}
	b.Shipped = p.now()
	rec, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("pool: ship %s: %w", id, err)
	}
	if err := p.writeWith(steps, [][2][]byte{{batchKey(id), rec}}, pebble.Sync); err != nil {
		return fmt.Errorf("pool: ship %s: %w", id, err)
	}
	return nil
}

// Batches returns the outbox batches, in id order.
func (p *Pool) Batches(ctx context.Context) ([]*Batch, error) {
	done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []*Batch
	err = scan(ctx, p.db, prefixOutbox, prefixOutboxEnd, func(k, v []byte) error {
		var b Batch
		if err := json.Unmarshal(v, &b); err != nil {
			return fmt.Errorf("batch %q: %w: %v", k, errCorrupt, err)
		}
		out = append(out, &b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pool: batches: %w", err)
	}
	return out, nil
}
