package trainer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/store"
)

// maxAdd bounds the batches of one Add entry.
const maxAdd = 256

// fenceCheck checks a claimed version against the committed lineage.
func (n *raftMember) fenceCheck(c group.Claim) error {
	var err error
	n.view(func(s *group.State) { err = s.Check(c) })
	return err
}

// lead is the leader's loop: it keeps the group configured, feeds the
// ledger, refuses stale batches, and runs rounds.
func (t *Trainer) lead(ctx context.Context) {
	tick := time.NewTicker(t.timing.Tick)
	defer tick.Stop()
	lastPromote := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-t.group.wake:
			t.work.poke()
		}
		if !t.group.isLeader() {
			continue
		}
		if time.Since(lastPromote) > 2*time.Second {
			t.group.promote()
			lastPromote = time.Now()
		}
		if err := t.leadOnce(ctx); err != nil && ctx.Err() == nil {
			if codeOf(err) == codeNotLeader {
				continue
			}
			t.log.Warn("leader: step failed", "err", err)
		}
	}
}

func (t *Trainer) leadOnce(ctx context.Context) error {
	g := t.group
	var (
		configured bool
		cfg        group.Config
		cur        group.Version
		hasVersion bool
		registered bool
		round      *group.Round
	)
	g.view(func(s *group.State) {
		configured, cfg = s.Configured, s.Config
		cur, hasVersion = s.Current()
		_, registered = s.Trainers[t.self]
		if s.Round != nil {
			r := *s.Round
			round = &r
		}
	})
	if !configured {
		c := t.cfg.Group.WithDefaults()
		name, hash, err := BaseID(t.cfg.Base)
		if err != nil {
			return err
		}
		c.Base, c.BaseHash = name, hash
		return g.propose(ctx, &group.Entry{Configure: &c})
	}
	if !hasVersion {
		return t.genesis(ctx, cfg)
	}
	if !registered {
		return g.propose(ctx, &group.Entry{Register: t.registration()})
	}
	if err := t.mirrorRevocations(ctx); err != nil {
		return err
	}
	if err := t.ingest(ctx); err != nil {
		return err
	}
	var stale []group.Refusal
	g.view(func(s *group.State) { stale = s.Stale() })
	if len(stale) > 0 {
		if err := g.propose(ctx, &group.Entry{Refuse: stale}); err != nil {
			return err
		}
		t.log.Info("stale batches refused", "batches", len(stale))
	}
	if round != nil {
		return t.closeRound(ctx, cfg, cur, round)
	}
	// No round trains from a version the voters have not certified.
	if certified, err := t.awaitCertified(ctx, cur); !certified || err != nil {
		return err
	}
	// Every version is scored on the task sets' held-out splits before the
	// next round trains from it.
	if err := t.evaluateCurrent(ctx, cfg); err != nil {
		return fmt.Errorf("evaluating %s: %w", cur.Name(), err)
	}
	var start *group.Start
	var ok bool
	live := t.checkable(g.live())
	g.view(func(s *group.State) { start, ok = s.Plan(time.Now().UTC(), t.self, live) })
	if !ok {
		return nil
	}
	if err := g.propose(ctx, &group.Entry{Start: start}); err != nil {
		return err
	}
	t.log.Info("round started", "round", start.Round, "from", "v"+strconv.FormatUint(start.Base, 10), "trainers", len(start.Shares))
	t.log.Debug("the round's batches", "round", start.Round, "shares", start.Shares)
	t.work.poke()
	return nil
}

func (t *Trainer) registration() *group.Trainer {
	r := &group.Trainer{ID: t.self, Engine: t.engineName(), Device: t.deviceName(), Speed: t.work.speed(), Addrs: t.host.Addrs()}
	if d := t.declared.Load(); d != nil {
		r.Engine, r.Device = d[0], d[1]
	}
	return r
}

func (t *Trainer) engineName() string {
	if t.cfg.Engine == "" {
		return EngineNative
	}
	return t.cfg.Engine
}

func (t *Trainer) deviceName() string {
	if t.cfg.Device == "" {
		return DeviceCPU
	}
	return t.cfg.Device
}

// genesis commits version 0.
func (t *Trainer) genesis(ctx context.Context, cfg group.Config) error {
	parent := filepath.Join(t.cfg.DataDir, AdaptersDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, ".genesis-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "v0")
	hash, err := t.work.w.genesis(ctx, cfg, dir)
	if err != nil {
		return err
	}
	if err := t.handOver(ctx, dir, 0, hash); err != nil {
		return err
	}
	if err := t.group.propose(ctx, &group.Entry{Genesis: &group.Genesis{Hash: hash, Publisher: t.self}}); err != nil {
		return err
	}
	t.log.Info("version 0 committed", "version", 0, "hash", core.ShortHash(hash))
	return t.keepVersion(dir, 0)
}

// mirrorRevocations records the mesh's revocations in the group: a
// revoked device's pending batches are refused, a revoked trainer leaves
// the registry (and the raft group).
func (t *Trainer) mirrorRevocations(ctx context.Context) error {
	var revoked map[mesh.PeerID]string
	t.group.view(func(s *group.State) {
		revoked = make(map[mesh.PeerID]string, len(s.Revoked))
		for k, v := range s.Revoked {
			revoked[k] = v
		}
	})
	for _, r := range t.mesh.Revocations() {
		p := mesh.PeerID(r.Subject())
		if _, ok := revoked[p]; ok {
			continue
		}
		if err := t.group.propose(ctx, &group.Entry{Revoke: &group.Revocation{Peer: p, Reason: r.Reason()}}); err != nil {
			return err
		}
		t.log.Info("revocation mirrored in the group", "peer", p)
		if p != t.self {
			t.group.raft.RemoveServer(raft.ServerID(p), 0, 10*time.Second)
		}
	}
	return nil
}

// ingest adds the stored batches the ledger lacks, after verifying them.
// It reads the store only when a batch arrived since it last added them
// all, or a verification waits to be tried again.
func (t *Trainer) ingest(ctx context.Context) error {
	puts := t.store.Puts()
	if puts == t.ingested && len(t.verifyLater) == 0 {
		return nil
	}
	es, err := t.store.List(ctx)
	if err != nil {
		return err
	}
	known := map[core.BatchID]bool{}
	t.group.view(func(s *group.State) {
		for _, e := range es {
			if _, ok := s.Batches[e.ID]; ok {
				known[e.ID] = true
			}
		}
	})
	for id := range known {
		delete(t.verifyLater, id) // in the ledger now, by another leader
	}
	if err := t.addBatches(ctx, es, known); err != nil {
		return err
	}
	if len(es)-len(known) <= maxAdd {
		t.ingested = puts // every stored batch was looked at
	}
	return nil
}

// addBatches verifies the stored batches the ledger lacks (at most maxAdd)
// and adds them, refusing those that fail.
func (t *Trainer) addBatches(ctx context.Context, es []store.Entry, known map[core.BatchID]bool) error {
	var add []group.BatchRef
	var refuse []group.Refusal
	for _, e := range es {
		if known[e.ID] {
			continue
		}
		if t.verify != nil {
			if next, ok := t.verifyLater[e.ID]; ok && time.Now().Before(next) {
				continue
			}
			reason, err := t.verify(ctx, e.ID, e.From)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				t.verifyLater[e.ID] = time.Now().Add(t.timing.VerifyRetry)
				t.log.Warn("batch not verified yet: trying again later", "batch", e.ID, "err", err, "in", t.timing.VerifyRetry)
				continue
			}
			delete(t.verifyLater, e.ID)
			if reason != "" {
				refuse = append(refuse, group.Refusal{ID: e.ID, Reason: reason})
			}
		}
		add = append(add, group.BatchRef{ID: e.ID, From: e.From, Steps: e.Header.Steps, Adapters: e.Header.Adapters})
		if len(add) == maxAdd {
			break
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := t.group.propose(ctx, &group.Entry{Add: add}); err != nil {
		return err
	}
	t.log.Info("batches added to the ledger", "batches", len(add))
	if len(refuse) > 0 {
		if err := t.group.propose(ctx, &group.Entry{Refuse: refuse}); err != nil {
			return err
		}
		t.log.Warn("batches refused by verification", "batches", len(refuse))
	}
	return nil
}

// takeDelta accepts a trainer's delta for the open round (leader only).
func (n *raftMember) takeDelta(ctx context.Context, from mesh.PeerID, req request, payload []byte) error {
	var share []core.BatchID
	var ok bool
	var base group.Version
	n.view(func(s *group.State) {
		if r := s.Round; r != nil && r.Number == req.Round && r.Base == req.Base {
			share, ok = r.Shares[from]
			base, _ = s.Version(r.Base)
		}
	})
	if !ok {
		return fmt.Errorf("%w: no share of round %d from v%d for %s", group.ErrNoRound, req.Round, req.Base, from)
	}
	for _, id := range req.Batches {
		if !slices.Contains(share, id) {
			return fmt.Errorf("%w: %s is not %s's", group.ErrBatch, id, from)
		}
	}
	for _, r := range req.Refused {
		if !slices.Contains(share, r.ID) || slices.Contains(req.Batches, r.ID) {
			return fmt.Errorf("%w: refusal of %s", group.ErrBatch, r.ID)
		}
	}
	// The delta is kept as its trainer signed it: the voters check the
	// version against the deltas, and the signatures keep a leader from
	// making up a contributor's.
	signed := signedDelta{Trainer: from, Round: req.Round, Base: req.Base, Samples: req.Samples,
		Batches: slices.Clone(req.Batches), Refused: slices.Clone(req.Refused), Sig: req.Sig, Delta: payload}
	if from == n.t.self {
		signed.Cert = n.t.mesh.Cert().Marshal()
	} else if p, ok := n.t.mesh.Peer(from); ok && p.Cert != nil {
		signed.Cert = p.Cert.Marshal()
	}
	if err := n.t.checkSigned(&signed); err != nil {
		return &rpcError{Code: codeRefused, Msg: "trainer: " + err.Error()}
	}
	if req.Samples > 0 {
		// A delta the aggregate cannot take is refused here, so that it
		// cannot hold the round up.
		d, err := adapter.UnmarshalDelta(payload, adapter.Limits{})
		if err != nil {
			return err
		}
		if d.Parent != base.Hash {
			return fmt.Errorf("%w: a delta from %s, not from v%d", adapter.ErrMismatch, short(d.Parent), base.Version)
		}
		dir, err := n.t.ensureVersion(ctx, base)
		if err != nil {
			return err
		}
		parent, err := adapter.Read(dir)
		if err != nil {
			return err
		}
		if _, err := adapter.Apply(parent, d); err != nil {
			return err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.deltaRound != req.Round {
		n.deltaRound, n.deltas = req.Round, map[mesh.PeerID]*submission{}
	}
	ids := make([]string, len(req.Batches))
	for i, id := range req.Batches {
		ids[i] = string(id)
	}
	n.deltas[from] = &submission{round: req.Round, base: req.Base, samples: req.Samples, seconds: req.Seconds,
		batches: ids, refused: req.Refused, delta: payload, signed: signed}
	n.poke()
	return nil
}

// closeRound publishes the open round once every share is in, or at its
// deadline with what came; with nothing by then it aborts the round.
func (t *Trainer) closeRound(ctx context.Context, cfg group.Config, cur group.Version, r *group.Round) error {
	g := t.group
	g.mu.Lock()
	subs := map[mesh.PeerID]*submission{}
	if g.deltaRound == r.Number {
		for k, v := range g.deltas {
			subs[k] = v
		}
	}
	since := g.leaderSince
	g.mu.Unlock()
	due := r.Deadline
	if grace := since.Add(cfg.Deadline / 2); grace.After(due) {
		due = grace
	}
	all := len(subs) == len(r.Shares)
	late := time.Now().After(due)
	switch {
	case all:
	case late && len(subs) > 0:
		var missing []mesh.PeerID
		for _, p := range r.Trainers() {
			if subs[p] == nil {
				missing = append(missing, p)
			}
		}
		t.log.Warn("round deadline passed: stragglers left out", "round", r.Number, "missing", missing)
	case late:
		t.log.Warn("round deadline passed with no delta: round aborted", "round", r.Number)
		return g.propose(ctx, &group.Entry{Abort: &group.Abort{Round: r.Number, Reason: "no delta by the deadline"}})
	default:
		return nil
	}
	// Volunteers' deltas are spot-checked before they go in (spot.go).
	subs, err := t.spotCheck(ctx, cfg, cur, r, subs)
	if err != nil || len(subs) == 0 {
		return err
	}
	return t.publish(ctx, cfg, cur, r, subs)
}

func (t *Trainer) publish(ctx context.Context, cfg group.Config, cur group.Version, r *group.Round, subs map[mesh.PeerID]*submission) error {
	parentDir, err := t.ensureVersion(ctx, cur)
	if err != nil {
		return err
	}
	parent, err := adapter.Read(parentDir)
	if err != nil {
		return err
	}
	// Each contribution weighs the steps the leader assigned it, not what
	// it says it trained.
	steps := map[core.BatchID]int{}
	tasksOnly := true // every item of the round is a task set's prompt
	t.group.view(func(s *group.State) {
		for _, ids := range r.Shares {
			for _, id := range ids {
				if b, ok := s.Batches[id]; ok {
					steps[id] = max(b.Steps, 1)
					tasksOnly = tasksOnly && b.Task != ""
				}
			}
		}
	})
	var parts []adapter.Contribution
	var contributors []group.Contribution
	var refused []group.Refusal
	var speeds []group.SpeedUpdate
	var signed []signedDelta
	for _, p := range r.Trainers() {
		s := subs[p]
		if s == nil {
			continue
		}
		signed = append(signed, s.signed)
		c := group.Contribution{Trainer: p, Samples: s.samples, Seconds: s.seconds}
		for _, id := range s.batches {
			c.Batches = append(c.Batches, core.BatchID(id))
		}
		refused = append(refused, s.refused...)
		weight := 0
		for _, id := range c.Batches {
			weight += steps[id]
		}
		if s.samples > 0 && weight > 0 {
			d, err := adapter.UnmarshalDelta(s.delta, adapter.Limits{})
			if err != nil {
				return err
			}
			parts = append(parts, adapter.Contribution{From: string(p), Weight: float64(weight), Delta: d})
			if s.seconds > 0 {
				speeds = append(speeds, group.SpeedUpdate{Trainer: p, Speed: float64(s.samples) / s.seconds})
			}
		}
		contributors = append(contributors, c)
	}
	if len(parts) == 0 && tasksOnly {
		// Nothing the round trained changes the adapter (every task
		// group flat, no sample to train): a version would be its parent
		// again. The round closes with none; what it took is done. A
		// round that took devices' batches still publishes its version,
		// which records the batches it took, as it always did.
		err := t.group.propose(ctx, &group.Entry{Close: &group.Close{Round: r.Number, Contributors: contributors, Refused: refused,
			Reason: "no learning signal: every group flat, no sample to train"}})
		if err != nil {
			return fmt.Errorf("trainer: closing round %d: %w", r.Number, err)
		}
		t.log.Info("round closed with no version: nothing it trained changes the adapter", "round", r.Number, "from", cur.Name(),
			"contributors", len(contributors))
		return nil
	}
	child := parent
	if len(parts) > 0 {
		agg, rep, err := adapter.Aggregate(parts, aggOptions(cfg))
		if err != nil {
			return err
		}
		for i := range contributors {
			for _, pr := range rep.Parts {
				if pr.From == string(contributors[i].Trainer) {
					contributors[i].Norm, contributors[i].Clipped = pr.Norm, pr.ClippedTo
				}
			}
		}
		if child, err = adapter.Apply(parent, agg); err != nil {
			return err
		}
	}
	root := filepath.Join(t.cfg.DataDir, AdaptersDir)
	tmp, err := os.MkdirTemp(root, ".publish-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "bundle")
	if err := child.Write(dir); err != nil {
		return err
	}
	if t.tamper != nil {
		t.tamper(dir)
	}
	hash, err := adapter.Hash(dir)
	if err != nil {
		return err
	}
	evals := t.evaluateChild(ctx, cfg, dir, cur.Version+1)
	if err := t.handOver(ctx, dir, cur.Version+1, hash); err != nil {
		return err
	}
	if t.beforePublish != nil {
		t.beforePublish(ctx, r.Number)
	}
	// The voters fetch the round's signed deltas from the publisher to
	// check the version before they certify it.
	t.keepDeltas(r.Number, hash, signed)
	err = t.group.propose(ctx, &group.Entry{Publish: &group.Publish{
		Round: r.Number, Version: cur.Version + 1, Parent: cur.Version, Hash: hash, Publisher: t.self,
		Contributors: contributors, Refused: refused, Evals: evals}})
	if err != nil {
		t.fenced.Add(1)
		return fmt.Errorf("trainer: publishing v%d: %w", cur.Version+1, err)
	}
	if err := t.keepVersion(dir, cur.Version+1); err != nil {
		return err
	}
	t.log.Info("version published", "version", cur.Version+1, "round", r.Number, "contributors", len(contributors), "hash", core.ShortHash(hash))
	if len(speeds) > 0 {
		t.group.propose(ctx, &group.Entry{Speeds: speeds})
	}
	return nil
}

func aggOptions(cfg group.Config) adapter.AggOptions {
	o := adapter.AggOptions{MaxNorm: cfg.MaxNorm, Trim: cfg.Trim}
	if cfg.Aggregate == group.AggTrimmed {
		o.Method = adapter.TrimmedMean
	}
	return o
}
