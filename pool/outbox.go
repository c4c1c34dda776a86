package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Batch is an outbox batch: scored steps taken together to leave the device
// as one payload. What the payload holds (the steps scrubbed, per the
// user's sharing policy, in the batch wire format) is the node's business;
// the pool stores the bytes, their content address and the steps they came
// from, and moves the steps from scored to batched when the batch is sealed
// and to shipped when it is marked shipped.
type Batch struct {
	// ID is the payload's content address: the sha256 (hex) of its bytes.
	ID    core.BatchID  `json:"id"`
	Steps []core.StepID `json:"steps"`
	// Size is the payload's length in bytes.
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	// Shipped is when MarkShipped was called; zero until then.
	Shipped time.Time `json:"shipped,omitzero"`
}

func batchKey(id core.BatchID) []byte {
	return append(append(make([]byte, 0, len(prefixOutbox)+len(id)), prefixOutbox...), id...)
}

func payloadKey(id core.BatchID) []byte {
	return append(append(make([]byte, 0, len(prefixPayload)+len(id)), prefixPayload...), id...)
}

// ErrConflict reports a Seal whose steps are no longer all scored (new
// feedback sent one back to be scored again, or another seal took it):
// nothing was written; prepare the batch again.
var ErrConflict = errors.New("pool: steps changed since the batch was prepared")

// MaxPayload bounds a batch payload.
const MaxPayload = 64 << 20

// SealSpec is a batch the caller made from scored steps.
type SealSpec struct {
	// Steps are the steps the payload carries: they move to batched.
	Steps []core.StepID
	// Held are steps the sharing policy keeps on the device: they move to
	// held, and belong to no batch.
	Held []core.StepID
	// Payload is the batch as it leaves the device. Required with Steps,
	// absent without.
	Payload []byte
}

// Seal records a batch in one synced commit: the payload under its content
// address, the batch, its steps moved from scored to batched and the held
// steps to held. Every step named must be scored now, else nothing is
// written and the error wraps ErrConflict. With no Steps (everything held)
// no batch is made and Seal returns nil. Sealing a payload already sealed
// returns the batch already recorded.
func (p *Pool) Seal(ctx context.Context, spec SealSpec) (*Batch, error) {
	switch {
	case len(spec.Steps) == 0 && len(spec.Payload) > 0:
		return nil, fmt.Errorf("pool: seal: a payload without steps")
	case len(spec.Steps) > 0 && len(spec.Payload) == 0:
		return nil, fmt.Errorf("pool: seal: %d steps without a payload", len(spec.Steps))
	case len(spec.Payload) > MaxPayload:
		return nil, fmt.Errorf("pool: seal: payload of %d bytes is over the %d limit", len(spec.Payload), MaxPayload)
	case len(spec.Steps) == 0 && len(spec.Held) == 0:
		return nil, nil
	}
	all := append(slices.Clone(spec.Steps), spec.Held...)
	if len(slices.Compact(slices.Sorted(slices.Values(all)))) != len(all) {
		return nil, fmt.Errorf("pool: seal: a step is named twice")
	}
	in, done, err := p.enterWrite(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	p.outbox.Lock()
	defer p.outbox.Unlock()

	var b *Batch
	if len(spec.Steps) > 0 {
		sum := sha256.Sum256(spec.Payload)
		id := core.BatchID(hex.EncodeToString(sum[:]))
		if old, err := p.getBatch(in, id); err == nil {
			return old, nil
		} else if !errors.Is(err, ErrNoBatch) {
			return nil, fmt.Errorf("pool: seal: %w", err)
		}
		b = &Batch{ID: id, Steps: slices.Clone(spec.Steps), Size: int64(len(spec.Payload)), Created: p.now()}
	}
	unlock := p.lockSteps(in, all)
	defer unlock()
	steps := make([]*core.Step, 0, len(all))
	for i, id := range all {
		s, err := p.get(in.db, id)
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("%w: step %s is gone", ErrConflict, id)
		}
		if err != nil {
			return nil, fmt.Errorf("pool: seal: %w", err)
		}
		if s.State != core.StateScored {
			return nil, fmt.Errorf("%w: step %s is %s", ErrConflict, id, s.State)
		}
		s.State = core.StateBatched
		if i >= len(spec.Steps) {
			s.State = core.StateHeld
		}
		steps = append(steps, s)
	}
	var extra [][2][]byte
	if b != nil {
		rec, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("pool: seal: %w", err)
		}
		extra = [][2][]byte{{payloadKey(b.ID), spec.Payload}, {batchKey(b.ID), rec}}
	}
	if err := p.writeWith(in, steps, extra, pebble.Sync); err != nil {
		return nil, fmt.Errorf("pool: seal: %w", err)
	}
	return b, nil
}

// Payload returns the bytes of an outbox batch, or an error wrapping
// ErrNoBatch.
func (p *Pool) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	b, err := getCopy(in.db, payloadKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNoBatch, id)
	}
	if err != nil {
		return nil, fmt.Errorf("pool: payload %s: %w", id, err)
	}
	return b, nil
}

// GetBatch returns the outbox batch with the given id, or an error wrapping
// ErrNoBatch.
func (p *Pool) GetBatch(ctx context.Context, id core.BatchID) (*Batch, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return p.getBatch(in, id)
}

func (p *Pool) getBatch(in *instance, id core.BatchID) (*Batch, error) {
	rec, err := getCopy(in.db, batchKey(id))
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
	in, done, err := p.enterWrite(ctx)
	if err != nil {
		return err
	}
	defer done()
	p.outbox.Lock()
	defer p.outbox.Unlock()
	b, err := p.getBatch(in, id)
	if err != nil {
		return err
	}
	if !b.Shipped.IsZero() {
		return nil
	}
	unlock := p.lockSteps(in, b.Steps)
	defer unlock()
	var steps []*core.Step
	for _, sid := range b.Steps {
		s, err := p.get(in.db, sid)
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
	if err := p.writeWith(in, steps, [][2][]byte{{batchKey(id), rec}}, pebble.Sync); err != nil {
		return fmt.Errorf("pool: ship %s: %w", id, err)
	}
	return nil
}

// Batches returns the outbox batches, in id order.
func (p *Pool) Batches(ctx context.Context) ([]*Batch, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []*Batch
	err = scan(ctx, in.db, prefixOutbox, prefixOutboxEnd, func(k, v []byte) error {
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
