package trainer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/store"
)

// workLoop trains this trainer's share of each round and hands the delta
// to the leader, again after a change of leader, until the round closes.
type workLoop struct {
	t    *Trainer
	w    *worker
	wake chan struct{}

	mu      sync.Mutex
	done    map[uint64]*request // round → the delta sent or to send
	payload map[uint64][]byte
	acked   map[uint64]mesh.PeerID // the leader that took a round's delta
	lastSpd float64
	swept   time.Time
	offered time.Time // when stranded batches were last looked for
}

// A follower offers the leader a batch it stored that the ledger still
// lacks offerAfter after it arrived, looking for such batches at most once
// every offerEvery.
const (
	offerAfter = 5 * time.Second
	offerEvery = 5 * time.Second
)

// offerStranded offers the leader the batches this follower stored that
// the ledger still lacks some time after they arrived. A leader that
// missed their announcement (it joined the topic late, after a restart)
// would otherwise never add them: it adds the batches it stored itself,
// and the device stops announcing a batch at the first trainer's
// acknowledgement. The leader pulls an offered batch from this trainer.
func (l *workLoop) offerStranded(ctx context.Context) {
	t := l.t
	leader := t.group.leader()
	if leader == "" || leader == t.self || time.Since(l.offered) < offerEvery {
		return
	}
	l.offered = time.Now()
	es, err := t.store.List(ctx)
	if err != nil {
		return
	}
	var stranded []store.Entry
	t.group.view(func(s *group.State) {
		for _, e := range es {
			if _, ok := s.Batches[e.ID]; !ok && time.Since(e.Received) >= offerAfter {
				stranded = append(stranded, e)
			}
		}
	})
	for _, e := range stranded[:min(len(stranded), maxAdd)] {
		if _, err := t.toLeader(ctx, request{Op: opOffer, Batch: e.ID, From: e.From}, nil); err != nil {
			t.log.Debug("offering a batch to the leader", "batch", e.ID, "err", err)
			continue
		}
		t.log.Info("batch the ledger lacked offered to the leader", "batch", e.ID, "leader", leader)
	}
}

// takeOffer pulls batch id, announced by device, from trainer by, unless
// the ledger or this leader's store has it already, and stores it: the
// leader verifies and adds it as it does the batches it pulled itself.
func (t *Trainer) takeOffer(ctx context.Context, by mesh.PeerID, id core.BatchID, device mesh.PeerID) error {
	var known bool
	t.group.view(func(s *group.State) { _, known = s.Batches[id] })
	if known {
		return nil
	}
	if ok, err := t.store.Has(ctx, id); err != nil || ok {
		return err
	}
	payload, err := t.call(ctx, by, request{Op: opBatch, Batch: id}, nil)
	if err != nil {
		return err
	}
	b, err := batch.Verify(payload, id, t.cfg.Limits)
	if err != nil {
		return err
	}
	if err := t.store.PutFrom(ctx, id, device, payload, b); err != nil {
		return err
	}
	t.log.Info("batch taken from a trainer's offer", "batch", id, "trainer", by, "from", device)
	return nil
}

// heldFor is how long a bundle handed over but never committed (its
// leader deposed before the commit) is kept.
const heldFor = 10 * time.Minute

// sweepHeld removes, once a minute, the bundles handed over that no
// committed version names and that are older than heldFor.
func (l *workLoop) sweepHeld() {
	if time.Since(l.swept) < time.Minute {
		return
	}
	l.swept = time.Now()
	t := l.t
	dirs, _ := filepath.Glob(filepath.Join(t.cfg.DataDir, AdaptersDir, ".held-*"))
	if len(dirs) == 0 {
		return
	}
	named := map[string]bool{}
	t.group.view(func(s *group.State) {
		for _, v := range s.Versions {
			named[v.Hash] = true
		}
	})
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || named[strings.TrimPrefix(filepath.Base(d), ".held-")] || time.Since(fi.ModTime()) < heldFor {
			continue
		}
		os.RemoveAll(d)
	}
}

func newWorkLoop(t *Trainer, w *worker) *workLoop {
	return &workLoop{t: t, w: w, wake: make(chan struct{}, 1), done: map[uint64]*request{}, payload: map[uint64][]byte{}, acked: map[uint64]mesh.PeerID{}}
}

func (l *workLoop) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *workLoop) speed() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastSpd
}

func (l *workLoop) run(ctx context.Context) {
	tick := time.NewTicker(l.t.timing.Tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-l.wake:
		}
		if err := l.once(ctx); err != nil && ctx.Err() == nil {
			l.t.log.Warn("trainer: share not done yet", "err", err)
			if sleep(ctx, time.Second) != nil {
				return
			}
		}
	}
}

func (l *workLoop) once(ctx context.Context) error {
	t := l.t
	var (
		r          *group.Round
		base       group.Version
		cfg        group.Config
		registered bool
		versions   bool
		cur        group.Version
	)
	t.group.view(func(s *group.State) {
		_, registered = s.Trainers[t.self]
		versions = len(s.Versions) > 0
		cur, _ = s.Current()
		if s.Round != nil && len(s.Round.Shares[t.self]) > 0 {
			rr := *s.Round
			r = &rr
			base, _ = s.Version(rr.Base)
			cfg = s.Config
		}
	})
	if !registered && versions && !t.group.isLeader() && !t.left.Load() {
		if _, err := t.toLeader(ctx, request{Op: opRegister, Trainer: t.registration()}, nil); err != nil {
			return fmt.Errorf("registering: %w", err)
		}
		t.log.Info("registered with the group's leader")
	}
	// Every trainer keeps the current version, so that it outlives any one
	// of them.
	if versions && !exists(t.versionDir(cur.Version)) {
		if _, err := t.ensureVersion(ctx, cur); err != nil {
			t.log.Debug("current version not fetched yet", "version", cur.Name(), "err", err)
		}
	}
	t.certifyOnce(ctx)
	t.shareVersion(ctx)
	l.sweepHeld()
	l.offerStranded(ctx)
	l.mu.Lock()
	for k := range l.done {
		if r == nil || k != r.Number {
			delete(l.done, k)
			delete(l.payload, k)
			delete(l.acked, k)
		}
	}
	l.mu.Unlock()
	if r == nil {
		return nil
	}
	leader := t.group.leader()
	l.mu.Lock()
	req, payload, acked := l.done[r.Number], l.payload[r.Number], l.acked[r.Number]
	l.mu.Unlock()
	if req != nil && acked == leader && leader != "" {
		return nil // this leader has it
	}
	if req == nil {
		var err error
		if req, payload, err = l.train(ctx, cfg, base, r); err != nil {
			return err
		}
		l.mu.Lock()
		l.done[r.Number], l.payload[r.Number] = req, payload
		l.mu.Unlock()
	}
	if leader == "" {
		return errors.New("no leader to take the delta")
	}
	if _, err := t.toLeader(ctx, *req, payload); err != nil {
		if errors.Is(err, group.ErrNoRound) || codeOf(err) == codeRefused {
			// The round closed, or this leader will not take it: drop it.
			var open bool
			t.group.view(func(s *group.State) { open = s.Round != nil && s.Round.Number == r.Number })
			if !open {
				return nil
			}
		}
		return fmt.Errorf("delta of round %d: %w", r.Number, err)
	}
	l.mu.Lock()
	l.acked[r.Number] = leader
	l.mu.Unlock()
	return nil
}

// train trains this trainer's share of r.
func (l *workLoop) train(ctx context.Context, cfg group.Config, base group.Version, r *group.Round) (*request, []byte, error) {
	t := l.t
	in, res, payload, err := t.trainShare(ctx, l.w, cfg, base, r.Number, r.Shares[t.self])
	if err != nil {
		return nil, nil, err
	}
	ids, batches, items, refused := in.ids, in.batches, in.items, in.refused
	if res.seconds > 0 && res.samples > 0 {
		l.mu.Lock()
		l.lastSpd = float64(res.samples) / res.seconds
		l.mu.Unlock()
	}
	t.log.Info("share trained", "round", r.Number, "batches", len(ids)-len(items), "prompts", len(items), "samples", res.samples, "stale", res.report.Stale,
		"loss", res.report.Loss, "seconds", res.seconds)
	// A step is followed from the gateway's log ("call", its step id), to
	// its batch (the pool's step record, "batch sealed"), to this line,
	// and to the version the round published ("version published").
	for _, id := range batches {
		t.log.Debug("batch trained", "batch", id, "round", r.Number)
	}
	if len(items) > 0 {
		ro := res.rollouts
		t.log.Info("rollouts", "round", r.Number, "prompts", ro.Prompts, "samples", ro.Samples, "tokens", ro.Tokens,
			"flat_groups", ro.Flat, "mean_reward", ro.MeanReward, "seconds", ro.Seconds, "train_seconds", res.trainSeconds)
	}
	if forge := t.forgeDelta.Load(); forge != nil {
		payload = (*forge)(payload)
	}
	req := &request{Op: opDelta, Round: r.Number, Base: base.Version, Samples: res.samples, Seconds: res.seconds,
		Batches: ids, Refused: refused}
	t.signDelta(req, payload)
	return req, payload, nil
}

// shareInput is what a share trains on: the steps of its devices'
// batches and the rollout items of its task prompts.
type shareInput struct {
	ids     []core.BatchID // what it trains: batches and prompts, in share order
	batches []core.BatchID // the devices' batches among them
	refused []group.Refusal
	steps   []*core.Step
	items   []rolloutItem
	// rts are the task sets' runtimes its items hold (release).
	rts map[string]*rolloutRuntime
}

func (in *shareInput) release() {
	for _, rt := range in.rts {
		rt.release()
	}
}

// readShare reads what share trains on, in its order: each device batch's
// steps (a batch that cannot be read is refused), each task prompt's task
// with its set's runtime, held until release.
func (t *Trainer) readShare(ctx context.Context, share []core.BatchID) (_ *shareInput, err error) {
	in := &shareInput{rts: map[string]*rolloutRuntime{}}
	defer func() {
		if err != nil {
			in.release()
		}
	}()
	prompts := map[core.BatchID]*group.Batch{}
	sets := map[string]group.TaskSet{}
	t.group.view(func(s *group.State) {
		for _, id := range share {
			if b := s.Batches[id]; b != nil && b.Task != "" {
				prompts[id] = &group.Batch{Task: b.Task, Prompt: b.Prompt}
				if ts := s.TaskSets[b.Task]; ts != nil {
					sets[b.Task] = *ts
				}
			}
		}
	})
	for _, id := range share {
		if p := prompts[id]; p != nil {
			ts, ok := sets[p.Task]
			if !ok {
				return nil, fmt.Errorf("trainer: task set %s not in the state", short(p.Task))
			}
			rt := in.rts[p.Task]
			if rt == nil {
				if rt, err = t.acquireRuntime(ctx, &ts); err != nil {
					return nil, err
				}
				in.rts[p.Task] = rt
			}
			task := rt.byID[p.Prompt]
			if task == nil {
				return nil, fmt.Errorf("trainer: task %q not in set %s", p.Prompt, short(p.Task))
			}
			in.items = append(in.items, rolloutItem{id: id, task: task, rt: rt})
			in.ids = append(in.ids, id)
			continue
		}
		b, err := t.readBatch(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, batch.ErrMalformed) || errors.Is(err, batch.ErrHashMismatch) {
				in.refused = append(in.refused, group.Refusal{ID: id, Reason: "unreadable: " + err.Error()})
				continue
			}
			return nil, err
		}
		in.steps = append(in.steps, b.Steps...)
		in.ids = append(in.ids, id)
		in.batches = append(in.batches, id)
	}
	return in, nil
}

// trainShare trains share from version base in round with w and returns
// what it read, the result and the delta's encoding (nil with no sample).
// A trainer's own share and a voter's spot check of another's take this
// one path: the same share, base, round and configuration (whose seed
// seeds the model and the rollouts) make the same delta.
func (t *Trainer) trainShare(ctx context.Context, w *worker, cfg group.Config, base group.Version, round uint64, share []core.BatchID) (*shareInput, *trained, []byte, error) {
	dir, err := t.ensureVersion(ctx, base)
	if err != nil {
		return nil, nil, nil, err
	}
	in, err := t.readShare(ctx, share)
	if err != nil {
		return nil, nil, nil, err
	}
	// The share's runtimes are held until its rollouts are done.
	defer in.release()
	res, err := w.train(ctx, cfg, dir, base.Version, round, in.steps, in.items)
	if err != nil {
		return nil, nil, nil, err
	}
	var payload []byte
	if res.samples > 0 {
		if payload, err = res.delta.MarshalBinary(); err != nil {
			return nil, nil, nil, err
		}
	}
	return in, res, payload, nil
}

// readBatch reads a batch from the store, fetching it from the leader or
// another trainer when this trainer has not pulled it.
func (t *Trainer) readBatch(ctx context.Context, id core.BatchID) (*batch.Batch, error) {
	b, err := t.store.Batch(ctx, id)
	if err == nil {
		return b, nil
	}
	var errs []error
	peers := append([]mesh.PeerID{t.group.leader()}, t.group.trainerPeers()...)
	for _, p := range peers {
		if p == "" || p == t.self {
			continue
		}
		payload, err := t.call(ctx, p, request{Op: opBatch, Batch: id}, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b, err := batch.Verify(payload, id, t.cfg.Limits)
		if err != nil {
			return nil, err
		}
		if err := t.store.Put(ctx, id, payload, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("trainer: batch %s: %w", id, errors.Join(append(errs, err)...))
}
