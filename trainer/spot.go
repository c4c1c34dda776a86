package trainer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Volunteers are kept honest by spot re-execution.
//
// Before the leader (a voter) publishes a round, it retrains a sample of
// the volunteers' deltas itself: the same share (the batches and task
// prompts the volunteer says it trained, in its order), from the same
// base version, in the same round, under the group's configuration, whose
// seed seeds the model and the rollouts; trainShare is the one path a
// trainer's own share and the re-execution take. The native engine is
// deterministic, so an honest delta is the recomputed one bit for bit;
// the torch engine is held to torchTolerance. A delta that is not what
// its share makes is left out of the round (its batches go back to
// pending, as a straggler's do), and its trainer is benched in the ledger
// with the evidence (group.Bench): it gets no share until the admin
// clears it (`clawmesh trainer clear PEER`, group.Clear). Norm clipping
// and the robust aggregation stay as a second wall for what the sample
// misses.
//
// Each volunteer's delta is checked with probability Config.SpotCheck,
// and a round with any volunteer's delta has at least one checked. The
// draw is the leader's signature over the round and the trainer (ed25519
// signatures are deterministic): a volunteer cannot foresee it when it
// hands its delta in, and anyone with the leader's public key can
// recompute it. A check costs the leader the training time of the share
// it retrains (docs/benchmarks.md, "Spot checks").

// DefaultSpotCheck is the share of the volunteers' deltas a leader
// retrains when Config.SpotCheck is zero.
const DefaultSpotCheck = 0.1

// torchTolerance is the largest difference of one value between a torch
// delta and its re-execution that a spot check accepts. Measured on the
// CPU (PyTorch 1.13, Debian's; the tiny model, one share of 16 samples,
// 2 local steps; TestSpotRetrainTorchTolerance): two runs with the same
// thread count agree exactly, a run on 2 threads and one on 1 differ by
// 2.9e-6, as their reductions sum in other orders. The tolerance leaves
// a margin of about 17 over that for other CPUs and builds, and stays far
// below what a forged delta changes to matter: one AdamW step at the
// default learning rate (1e-2) moves a value by about 1e-2.
const torchTolerance = 5e-5

// ErrNotBenched reports a clear of a trainer no spot check benched.
var ErrNotBenched = errors.New("trainer: not benched")

// spotRate is the share of volunteers' deltas checked (0: none).
func (t *Trainer) spotRate() float64 { return math.Float64frombits(t.spotBits.Load()) }

// checkable leaves out of live the volunteers this leader could not
// retrain (they register another engine or device than its own) while
// spot checks are on: their deltas, when drawn for a check, would be left
// out, and a round given to them alone would never publish.
func (t *Trainer) checkable(live []mesh.PeerID) []mesh.PeerID {
	if t.spotRate() == 0 {
		return live
	}
	engine, device := t.engineName(), t.deviceName()
	var out []mesh.PeerID
	var left []mesh.PeerID
	t.group.view(func(s *group.State) {
		for _, p := range live {
			tr := s.Trainers[p]
			if p != t.self && !t.mayVote(p) && tr != nil && (tr.Engine != engine || tr.Device != device) {
				left = append(left, p)
				continue
			}
			out = append(out, p)
		}
	})
	if len(left) > 0 {
		t.cert.mu.Lock()
		warn := time.Since(t.cert.lastCheck["uncheckable"]) > time.Minute
		if warn {
			t.cert.lastCheck["uncheckable"] = time.Now()
		}
		t.cert.mu.Unlock()
		if warn {
			t.log.Warn("volunteers given no share: this leader cannot check their deltas (another engine or device)", "trainers", left,
				"engine", engine, "device", device)
		}
	}
	return out
}

// checkSpotCheck refuses a Config.SpotCheck outside [0, 1].
func checkSpotCheck(rate float64) error {
	if !(rate >= 0 && rate <= 1) {
		return fmt.Errorf("trainer: spot check rate %v: from 0 to 1", rate)
	}
	return nil
}

// spotDraw maps a draw's bytes to [0, 1).
func spotDraw(b []byte) float64 {
	h := sha256.Sum256(b)
	return float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53)
}

// spotSample picks the volunteers whose deltas are retrained: each whose
// draw is under rate, and when none is, the one with the lowest draw, so
// that a round with a volunteer's delta has one checked (rate 0 picks
// none). The result is sorted.
func spotSample(volunteers []mesh.PeerID, rate float64, draw func(mesh.PeerID) float64) []mesh.PeerID {
	if !(rate > 0) || len(volunteers) == 0 {
		return nil
	}
	vs := slices.Clone(volunteers)
	slices.Sort(vs)
	vs = slices.Compact(vs)
	var picked []mesh.PeerID
	lowest, low := vs[0], math.Inf(1)
	for _, p := range vs {
		u := draw(p)
		if u < rate {
			picked = append(picked, p)
		}
		if u < low {
			lowest, low = p, u
		}
	}
	if len(picked) == 0 {
		picked = []mesh.PeerID{lowest}
	}
	return picked
}

// spotClaim is what the leader signs to draw whether trainer p's delta of
// round is checked.
func spotClaim(meshID string, round uint64, p mesh.PeerID) []byte {
	b := []byte("clawmesh/spot-check\n")
	b = binary.AppendUvarint(b, uint64(len(meshID)))
	b = append(b, meshID...)
	b = binary.AppendUvarint(b, round)
	return append(b, p...)
}

// spotMemo remembers the deltas of the open round that passed their check
// (by trainer, the delta's SHA-256), so that a round closed again (its
// publication failed) does not retrain them. The leader's loop only.
type spotMemo struct {
	round  uint64
	passed map[mesh.PeerID][32]byte
}

// spotCheck runs before the leader publishes round r from cur: it drops
// the deltas of benched trainers, retrains a sample of the volunteers'
// and benches those whose delta is not what their share makes. It returns
// the deltas left; when it dropped them all it aborts the round and
// returns none.
func (t *Trainer) spotCheck(ctx context.Context, cfg group.Config, cur group.Version, r *group.Round, subs map[mesh.PeerID]*submission) (map[mesh.PeerID]*submission, error) {
	benched := map[mesh.PeerID]bool{}
	regs := map[mesh.PeerID]group.Trainer{}
	t.group.view(func(s *group.State) {
		for p := range subs {
			_, benched[p] = s.Benched[p]
			if tr := s.Trainers[p]; tr != nil {
				regs[p] = *tr
			}
		}
	})
	out := make(map[mesh.PeerID]*submission, len(subs))
	var volunteers []mesh.PeerID
	for p, s := range subs {
		if benched[p] {
			t.log.Warn("a benched trainer's delta left out", "trainer", p, "round", r.Number)
			continue
		}
		out[p] = s
		if p != t.self && !t.mayVote(p) {
			volunteers = append(volunteers, p)
		}
	}
	if t.spot.round != r.Number {
		t.spot = spotMemo{round: r.Number, passed: map[mesh.PeerID][32]byte{}}
	}
	meshID := t.mesh.MeshID()
	draw := func(p mesh.PeerID) float64 { return spotDraw(t.mesh.Sign(spotClaim(meshID, r.Number, p))) }
	for _, p := range spotSample(volunteers, t.spotRate(), draw) {
		s := out[p]
		sum := sha256.Sum256(s.delta)
		if h, ok := t.spot.passed[p]; ok && h == sum {
			continue
		}
		b, err := t.spotOne(ctx, cfg, cur, r, p, s, regs[p])
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// A delta drawn for a check that cannot be checked (another
			// engine or device than this leader's, a batch it cannot
			// read) is not taken on trust: a volunteer could otherwise
			// declare another engine to never be checked. It is left out
			// unbenched, and its batches go back to pending.
			t.log.Warn("spot check could not run: the delta is left out unverified", "trainer", p, "round", r.Number, "err", err)
			delete(out, p)
			continue
		}
		t.spotRuns.Add(1)
		if b == nil {
			t.spot.passed[p] = sum
			t.log.Info("spot check passed", "trainer", p, "round", r.Number, "samples", s.samples)
			continue
		}
		if err := t.group.propose(ctx, &group.Entry{Bench: b}); err != nil {
			if !errors.Is(err, group.ErrEntry) && !errors.Is(err, group.ErrTrainer) {
				return nil, fmt.Errorf("trainer: benching %s: %w", p, err)
			}
			// The delta is still not what its share makes.
			t.log.Error("the group refused a bench; the delta is left out all the same", "trainer", p, "round", r.Number, "err", err)
		}
		delete(out, p)
		ev := b.Evidence
		t.log.Warn("spot check failed: delta left out, trainer benched", "trainer", p, "round", r.Number,
			"submitted", core.ShortHash(ev.Submitted), "recomputed", core.ShortHash(ev.Recomputed), "max_abs_diff", ev.MaxAbsDiff,
			"samples", ev.Samples, "recomputed_samples", ev.RecomputedSamples)
	}
	if len(out) == 0 {
		err := t.group.propose(ctx, &group.Entry{Abort: &group.Abort{Round: r.Number, Reason: "every delta left out: benched, or drawn for a check that could not run"}})
		return nil, err
	}
	return out, nil
}

// spotOne retrains trainer p's share of round r from cur as p says it
// trained it and compares the delta with s's. It returns the bench the
// difference calls for, nil when they agree, or an error when it cannot
// compare them (another engine, a batch it cannot read).
func (t *Trainer) spotOne(ctx context.Context, cfg group.Config, cur group.Version, r *group.Round, p mesh.PeerID, s *submission, reg group.Trainer) (*group.Bench, error) {
	engine := t.engineName()
	switch {
	case reg.ID == "":
		return nil, fmt.Errorf("%s is not registered", p)
	case reg.Engine != engine || reg.Device != t.deviceName():
		return nil, fmt.Errorf("it trains with %s on %s, this leader with %s on %s", reg.Engine, reg.Device, engine, t.deviceName())
	case s.round != r.Number || s.base != cur.Version || r.Base != cur.Version:
		return nil, fmt.Errorf("a delta of round %d from v%d, the round is %d from v%d", s.round, s.base, r.Number, cur.Version)
	}
	ids := make([]core.BatchID, len(s.batches))
	for i, id := range s.batches {
		ids[i] = core.BatchID(id)
	}
	in, res, payload, err := t.trainShare(ctx, t.work.w, cfg, cur, r.Number, ids)
	if err != nil {
		return nil, err
	}
	if len(in.refused) > 0 || !slices.Equal(in.ids, ids) {
		return nil, fmt.Errorf("%d of its batches cannot be read here", len(in.refused))
	}
	tol := 0.0
	if engine == EngineTorch {
		tol = torchTolerance
	}
	diff := maxAbsDiff(s.delta, payload)
	if res.samples == s.samples && (bytes.Equal(payload, s.delta) || diff >= 0 && diff <= tol) {
		return nil, nil
	}
	submitted, recomputed := sha256.Sum256(s.delta), sha256.Sum256(payload)
	return &group.Bench{Trainer: p, Round: r.Number,
		Reason: fmt.Sprintf("spot check: its delta of round %d is not what its share makes (%d samples, recomputed %d; max abs diff %g, tolerance %g)",
			r.Number, s.samples, res.samples, diff, tol),
		Evidence: group.SpotEvidence{Base: cur.Version, Engine: engine, Submitted: hex.EncodeToString(submitted[:]), Recomputed: hex.EncodeToString(recomputed[:]),
			MaxAbsDiff: diff, Tolerance: tol, Samples: s.samples, RecomputedSamples: res.samples, Batches: ids, Checker: t.self}}, nil
}

// maxAbsDiff is the largest difference of one value between two encoded
// deltas: 0 for two empty ones, -1 when they cannot be compared (one does
// not decode, or their tensors differ in name or shape).
func maxAbsDiff(a, b []byte) float64 {
	if len(a) == 0 && len(b) == 0 {
		return 0
	}
	if len(a) == 0 || len(b) == 0 {
		return -1
	}
	da, err := adapter.UnmarshalDelta(a, adapter.Limits{})
	if err != nil {
		return -1
	}
	db, err := adapter.UnmarshalDelta(b, adapter.Limits{})
	if err != nil || da.Parent != db.Parent || len(da.Tensors) != len(db.Tensors) {
		return -1
	}
	m := 0.0
	for i, ta := range da.Tensors {
		tb := db.Tensors[i]
		if ta.Name != tb.Name || !slices.Equal(ta.Shape, tb.Shape) || len(ta.Data) != len(tb.Data) {
			return -1
		}
		for k, x := range ta.Data {
			m = max(m, math.Abs(float64(x)-float64(tb.Data[k])))
		}
	}
	return m
}

// Clear lifts the bench of trainer p: it gets shares again. Only a voter
// may ask it (the leader refuses a volunteer's clear).
func (t *Trainer) Clear(ctx context.Context, p mesh.PeerID) error {
	var known, benched bool
	t.group.view(func(s *group.State) {
		_, known = s.Trainers[p]
		_, benched = s.Benched[p]
	})
	switch {
	case p == "":
		return errors.New("trainer: clear whom? a trainer's peer id")
	case !benched && !known:
		return fmt.Errorf("%w: %s is not a trainer of the group", ErrNotBenched, p)
	case !benched:
		return fmt.Errorf("%w: %s (no spot check caught it, or it was cleared)", ErrNotBenched, p)
	}
	_, err := t.toLeader(ctx, request{Op: opClear, Trainer: &group.Trainer{ID: p}}, nil)
	return err
}

// takeClear proposes the clear of a bench that voter from asked for
// (leader only).
func (t *Trainer) takeClear(ctx context.Context, from mesh.PeerID, req request) error {
	if from != t.self && !t.mayVote(from) {
		return &rpcError{Code: codeRefused, Msg: "trainer: only a voter clears a bench"}
	}
	if req.Trainer == nil || req.Trainer.ID == "" {
		return errors.New("trainer: clear of no one")
	}
	var benched bool
	t.group.view(func(s *group.State) { _, benched = s.Benched[req.Trainer.ID] })
	if !benched {
		return &rpcError{Code: codeRefused, Msg: fmt.Sprintf("%v: %s", ErrNotBenched, req.Trainer.ID)}
	}
	if err := t.group.propose(ctx, &group.Entry{Clear: &group.Clear{Trainer: req.Trainer.ID}}); err != nil {
		return err
	}
	t.log.Info("bench cleared", "trainer", req.Trainer.ID, "by", from)
	return nil
}
