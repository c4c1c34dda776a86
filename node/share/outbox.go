package share

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/node/scrub"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

// DefaultMaxSteps is how many steps a batch takes at most.
const DefaultMaxSteps = 64

// Options configure an Outbox.
type Options struct {
	// Pool is the node's DataPool. Required.
	Pool *pool.Pool
	// Key is the device's id key (LoadKey). Required.
	Key []byte
	// Policy is the sharing policy; it must be valid (Validate).
	Policy Policy
	// MaxSteps bounds the steps one batch takes; default DefaultMaxSteps.
	MaxSteps int
	// Rescore, if set, scores each step again once it is scrubbed, and
	// the batch carries those scores rather than the ones made before
	// scrubbing: so every score that leaves is of the bytes that leave,
	// and a trainer can replay it (see Rescorer). Nil ships the step's
	// scores as they were made, scrubbed.
	Rescore Rescorer
	// Now is the clock; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Rescorer scores a scrubbed step again as it is to leave the device:
// reward.Runner.Rescore, whose scores are each one a peer holding only the
// step, the plugin's name and its module can replay, or a judge's.
type Rescorer interface {
	Rescore(ctx context.Context, s *core.Step) core.Reward
}

// Outbox makes the pool's outbox batches. It is safe for concurrent use;
// seals are serialized.
type Outbox struct {
	pool    *pool.Pool
	key     []byte
	max     int
	rescore Rescorer
	now     func() time.Time
	log     *slog.Logger
	sealMu  sync.Mutex

	mu       sync.Mutex
	policy   Policy
	scrubber *scrub.Scrubber
}

// New makes an Outbox.
func New(o Options) (*Outbox, error) {
	if o.Pool == nil {
		return nil, errors.New("share: no pool")
	}
	if len(o.Key) < 16 {
		return nil, scrub.ErrKey
	}
	if o.MaxSteps == 0 {
		o.MaxSteps = DefaultMaxSteps
	}
	if o.MaxSteps < 0 || o.MaxSteps > 4096 {
		return nil, fmt.Errorf("share: max steps %d (want 1 to 4096)", o.MaxSteps)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ob := &Outbox{pool: o.Pool, key: o.Key, max: o.MaxSteps, rescore: o.Rescore, now: o.Now, log: o.Logger.With("component", "outbox")}
	if err := ob.SetPolicy(o.Policy); err != nil {
		return nil, err
	}
	return ob, nil
}

// SetPolicy replaces the policy for the batches made from now on. An invalid
// policy is refused and the current one stays.
func (o *Outbox) SetPolicy(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s, err := scrub.New(scrub.Options{Names: p.Names})
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.policy, o.scrubber = p, s
	o.mu.Unlock()
	return nil
}

// Policy returns the policy in force.
func (o *Outbox) Policy() Policy {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.policy
}

func (o *Outbox) current() (Policy, *scrub.Scrubber) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.policy, o.scrubber
}

// Prepared is a batch made but not sealed: what the next batch would be.
type Prepared struct {
	// Steps are the pool's ids of the steps the payload carries, Held
	// those the policy keeps on the device, with why.
	Steps []core.StepID
	Held  []Held
	// Payload is the batch's bytes (nil when every step is held), ID their
	// content address.
	Payload []byte
	ID      core.BatchID
	// Scrubbed are the payload's steps as they leave (what was encoded).
	Scrubbed []*core.Step
	// Header is the payload's header.
	Header batch.Header
	// Found counts what scrubbing replaced, by kind.
	Found map[scrub.Kind]int
	// Policy is the policy that made it.
	Policy Policy
}

// Held is a step the policy keeps on the device.
type Held struct {
	ID     core.StepID `json:"id"`
	Reason string      `json:"reason"`
}

// Prepare makes the next batch from the oldest scored steps, up to the
// batch size, without changing the pool. With nothing scored, or the policy
// in mode none, it returns nil.
func (o *Outbox) Prepare(ctx context.Context) (*Prepared, error) {
	pol, sc := o.current()
	if pol.Mode == ModeNone {
		return nil, nil
	}
	steps, err := o.pool.List(ctx, pool.Filter{State: core.StateScored, Limit: o.max})
	if err != nil {
		return nil, fmt.Errorf("share: %w", err)
	}
	if len(steps) == 0 {
		return nil, nil
	}
	pr := &Prepared{Policy: pol, Found: map[scrub.Kind]int{}}
	var out []*core.Step
	pass := sc.NewPass()
	tables := map[core.SessionID]*scrub.Table{}
	opts := &scrub.StepOptions{Key: o.key, Tools: pol.Tools}
	for _, s := range steps {
		if ok, why := pol.Allows(s); !ok {
			pr.Held = append(pr.Held, Held{ID: s.ID, Reason: why})
			continue
		}
		t, ok := tables[s.SessionID]
		if !ok {
			// Placeholders are numbered along the whole session: replay
			// its earlier steps so this batch numbers them as earlier
			// batches did.
			t = &scrub.Table{}
			if err := o.replay(ctx, pass, t, s, opts); err != nil {
				return nil, err
			}
			tables[s.SessionID] = t
		}
		before := t.Counts()
		sc, err := pass.Step(t, s, opts)
		if err != nil {
			return nil, fmt.Errorf("share: %w", err)
		}
		for k, n := range t.Counts() {
			pr.Found[k] += n - before[k]
		}
		if o.rescore != nil && sc.Reward != nil {
			sc.Reward = o.rescored(ctx, pass, t, sc)
			if ok, why := pol.Allows(sc); !ok {
				pr.Held = append(pr.Held, Held{ID: s.ID, Reason: "scored again once scrubbed: " + why})
				continue
			}
		}
		sc.State = core.StateBatched
		out = append(out, sc)
		pr.Steps = append(pr.Steps, s.ID)
	}
	if len(out) == 0 {
		return pr, nil
	}
	payload, err := batch.Encode(batch.Meta{Created: scrub.Hour(o.now()), Policy: pol.Digest()}, out)
	if err != nil {
		return nil, fmt.Errorf("share: encoding the batch: %w", err)
	}
	h, err := batch.DecodeHeader(payload, batch.Limits{MaxBytes: pool.MaxPayload})
	if err != nil {
		return nil, fmt.Errorf("share: the batch made does not decode: %w", err)
	}
	pr.Payload, pr.ID, pr.Scrubbed, pr.Header = payload, batch.ID(payload), out, h
	return pr, nil
}

// rescored is the reward the scrubbed step sc leaves with: its scores made
// again on sc (Options.Rescore), their reasons and labels scrubbed. A
// score whose hint scrubbing would change is left out: the hint that
// left would not be the plugin's, and a trainer replaying the plugin
// would refuse the batch for it.
func (o *Outbox) rescored(ctx context.Context, pass *scrub.Pass, t *scrub.Table, sc *core.Step) *core.Reward {
	rw := o.rescore.Rescore(ctx, sc)
	kept := make([]core.Score, 0, len(rw.Scores))
	for _, x := range rw.Scores {
		if pass.Text(t, x.Hint) != x.Hint {
			o.log.Debug("a score left out: scrubbing would change its hint", "plugin", x.Plugin)
			continue
		}
		x.Reason = pass.Text(t, x.Reason)
		labels := x.Labels
		x.Labels = nil
		for _, l := range labels {
			x.Labels = append(x.Labels, pass.Text(t, l))
		}
		kept = append(kept, x)
	}
	out := reward.Combine(kept, scrub.Hour(o.now()))
	return &out
}

// replay numbers, in t, the placeholders of s's session's steps before s.
func (o *Outbox) replay(ctx context.Context, pass *scrub.Pass, t *scrub.Table, s *core.Step, opts *scrub.StepOptions) error {
	earlier, err := o.pool.List(ctx, pool.Filter{Session: s.SessionID, Until: s.Timings.Start})
	if err != nil {
		return fmt.Errorf("share: %w", err)
	}
	for _, e := range earlier {
		if _, err := pass.Step(t, e, opts); err != nil {
			return fmt.Errorf("share: %w", err)
		}
	}
	return nil
}

// Seal makes the next batch and seals it in the pool: its steps move to
// batched and the held ones to held. It returns the batch (nil when there
// was nothing to seal, or every step was held).
func (o *Outbox) Seal(ctx context.Context) (*pool.Batch, error) {
	b, _, err := o.seal(ctx)
	return b, err
}

// seal is Seal that also says whether there were scored steps to take.
func (o *Outbox) seal(ctx context.Context) (*pool.Batch, bool, error) {
	o.sealMu.Lock()
	defer o.sealMu.Unlock()
	for attempt := 0; ; attempt++ {
		pr, err := o.Prepare(ctx)
		if err != nil || pr == nil {
			return nil, false, err
		}
		held := make([]core.StepID, len(pr.Held))
		for i, h := range pr.Held {
			held[i] = h.ID
		}
		b, err := o.pool.Seal(ctx, pool.SealSpec{Steps: pr.Steps, Held: held, Payload: pr.Payload})
		if errors.Is(err, pool.ErrConflict) && attempt < 3 {
			continue // a step moved meanwhile (new feedback): prepare again
		}
		if err != nil {
			return nil, true, fmt.Errorf("share: %w", err)
		}
		if len(held) > 0 {
			o.log.Info("steps kept on the device by the sharing policy", "n", len(held))
		}
		if b != nil {
			o.log.Info("batch sealed", "batch", b.ID, "steps", len(b.Steps), "bytes", b.Size, "found", pr.Found)
			o.log.Debug("the batch's steps", "batch", b.ID, "steps", b.Steps)
		}
		return b, true, nil
	}
}

// SealAll seals batches until no scored step is left (or ctx ends), and
// returns how many it sealed.
func (o *Outbox) SealAll(ctx context.Context) (int, error) {
	n := 0
	for ctx.Err() == nil {
		b, took, err := o.seal(ctx)
		if err != nil || !took {
			return n, err
		}
		if b != nil {
			n++
		}
	}
	return n, ctx.Err()
}

// Preview is the next batch to leave the device, decoded.
type Preview struct {
	// Sealed says the batch is already sealed and waits to leave; else it
	// is what the next batch would be under the policy now in force, if it
	// were sealed now (a dry run).
	Sealed bool         `json:"sealed"`
	ID     core.BatchID `json:"id,omitempty"`
	Size   int          `json:"size"`
	Header batch.Header `json:"header"`
	// Steps are the batch's steps exactly as they leave (at most the limit
	// asked for; Header.Steps counts them all).
	Steps []*core.Step `json:"steps"`
	// Held are the steps a dry run would keep on the device.
	Held []Held `json:"held,omitempty"`
	// Found counts what scrubbing replaced in a dry run, by kind.
	Found map[scrub.Kind]int `json:"found,omitempty"`
	// Mode is the policy's mode now.
	Mode Mode `json:"mode"`
	// Empty says there is no next batch (why: Note).
	Empty bool   `json:"empty"`
	Note  string `json:"note,omitempty"`
}

// Preview returns the next batch to leave: the oldest sealed batch not yet
// shipped, or else what the next batch would be. limit bounds the steps
// returned (0: all).
func (o *Outbox) Preview(ctx context.Context, limit int) (*Preview, error) {
	pol, _ := o.current()
	pv := &Preview{Mode: pol.Mode}
	batches, err := o.pool.Batches(ctx)
	if err != nil {
		return nil, err
	}
	var next *pool.Batch
	for _, b := range batches {
		if b.Shipped.IsZero() && (next == nil || b.Created.Before(next.Created)) {
			next = b
		}
	}
	if next != nil {
		payload, err := o.pool.Payload(ctx, next.ID)
		if err != nil {
			return nil, err
		}
		b, err := batch.Verify(payload, next.ID, batch.Limits{MaxBytes: pool.MaxPayload})
		if err != nil {
			return nil, fmt.Errorf("share: sealed batch %s: %w", next.ID, err)
		}
		pv.Sealed, pv.ID, pv.Size, pv.Header, pv.Steps = true, next.ID, len(payload), b.Header, b.Steps
	} else {
		pr, err := o.Prepare(ctx)
		if err != nil {
			return nil, err
		}
		switch {
		case pol.Mode == ModeNone:
			pv.Empty, pv.Note = true, "sharing is off ([share] mode = \"none\"): nothing leaves this device"
			return pv, nil
		case pr == nil:
			pv.Empty, pv.Note = true, "no scored step is waiting"
			return pv, nil
		}
		pv.Held, pv.Found = pr.Held, pr.Found
		if pr.Payload == nil {
			pv.Empty, pv.Note = true, fmt.Sprintf("the policy keeps all %d waiting steps on this device", len(pr.Held))
			return pv, nil
		}
		pv.ID, pv.Size, pv.Header, pv.Steps = pr.ID, len(pr.Payload), pr.Header, pr.Scrubbed
	}
	if limit > 0 && len(pv.Steps) > limit {
		pv.Steps = pv.Steps[:limit]
	}
	return pv, nil
}
