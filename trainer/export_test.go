package trainer

import (
	"context"
	"math"
	"path/filepath"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// What the tests in package trainer_test (those that run a cluster of
// trainer/harness, which imports this package) need of the internals.

var (
	QuickTiming   = testTiming
	QuickGroup    = testGroup
	NewTestLogger = testLogger
	LetterTasks   = letterTasks
	CharsetPlugin = charsetPlugin
	MoodyPlugin   = moodyPlugin
	MoodyTasks    = moodyTasks
)

// HoldTaskRuntime holds the runtime of the group's task set hash as a
// share's rollouts or an evaluation hold it; score has its verifier score
// a reply made of letters to the set's first task.
func (t *Trainer) HoldTaskRuntime(ctx context.Context, hash string) (score func(context.Context) core.Score, release func(), err error) {
	var ts group.TaskSet
	t.group.view(func(s *group.State) {
		if p := s.TaskSets[hash]; p != nil {
			ts = *p
		}
	})
	rt, err := t.acquireRuntime(ctx, &ts)
	if err != nil {
		return nil, nil, err
	}
	task := rt.set.Tasks[0]
	score = func(ctx context.Context) core.Score {
		st := &core.Step{ID: "held", Turn: core.TurnMain, Request: core.Request{Messages: task.Messages},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "abc"}}}}}
		sc, _ := rt.runner.ScoreTask(ctx, verifierName, st, reward.Task{ID: task.ID, Answer: task.Answer, Meta: task.Meta})
		return sc
	}
	return score, rt.release, nil
}

// EvaluateVersion scores version v on the held-out split of task set
// hash, as the leader does, without recording it.
func (t *Trainer) EvaluateVersion(ctx context.Context, hash string, v uint64) (group.Eval, error) {
	var (
		ts  group.TaskSet
		ver group.Version
		cfg group.Config
	)
	t.group.view(func(s *group.State) {
		if p := s.TaskSets[hash]; p != nil {
			ts = *p
		}
		ver, _ = s.Version(v)
		cfg = s.Config
	})
	dir, err := t.ensureVersion(ctx, ver)
	if err != nil {
		return group.Eval{}, err
	}
	return t.evaluate(ctx, cfg, dir, v, &ts)
}

// SetBeforePublish has fn run before the leader proposes a version.
func (t *Trainer) SetBeforePublish(fn func(ctx context.Context, round uint64)) { t.beforePublish = fn }

// Fenced counts the publications the group refused.
func (t *Trainer) Fenced() int64 { return t.fenced.Load() }

// SetTamper makes the trainer, when it leads, change each version it
// publishes with fn (given the bundle's directory) after aggregating it.
func (t *Trainer) SetTamper(fn func(dir string)) { t.tamper = fn }

// SetForgeDelta makes the trainer change each delta it trains with fn
// before it signs and hands it in: a forged but validly signed delta.
func (t *Trainer) SetForgeDelta(fn func([]byte) []byte) {
	if fn == nil {
		t.forgeDelta.Store(nil)
		return
	}
	t.forgeDelta.Store(&fn)
}

// Declare has the trainer register again, saying it trains with engine
// on device whatever it really runs.
func (t *Trainer) Declare(ctx context.Context, engine, device string) error {
	t.declared.Store(&[2]string{engine, device})
	_, err := t.toLeader(ctx, request{Op: opRegister, Trainer: t.registration()}, nil)
	return err
}

// SetNoRetract keeps the trainer, when it leads, from retracting any
// version: with SetTamper, a rogue leader.
func (t *Trainer) SetNoRetract(on bool) { t.noRetract.Store(on) }

// SetSpotCheck sets the share of the volunteers' deltas the trainer
// retrains when it leads.
func (t *Trainer) SetSpotCheck(rate float64) { t.spotBits.Store(math.Float64bits(rate)) }

// SpotChecks counts the volunteers' deltas the trainer retrained and
// compared as leader.
func (t *Trainer) SpotChecks() int64 { return t.spotRuns.Load() }

// SpotSample and SpotDraw expose the spot checks' sampling rule.
var (
	SpotSample = spotSample
	SpotDraw   = spotDraw
)

// FenceCheck checks a claim against the group's lineage.
func (t *Trainer) FenceCheck(c group.Claim) error { return t.group.fenceCheck(c) }

// ViewGroup reads the replicated state.
func (t *Trainer) ViewGroup(fn func(*group.State)) { t.group.view(fn) }

// LatestShared is the newest manifest the weights service serves.
func (t *Trainer) LatestShared() *chunks.Manifest { return t.weights.Latest() }

// AddTasksFrom has the trainer take a task-set payload from itself.
func (t *Trainer) AddTasksFrom(ctx context.Context, payload []byte) error {
	_, err := t.addTasks(ctx, t.self, payload)
	return err
}

// OfferForeignDelta trains a delta on batch p from another seed's version
// 0 (made in dir) and hands it to the leader tr for round; it returns the
// leader's answer.
func OfferForeignDelta(ctx context.Context, tr *Trainer, round uint64, p []byte, dir string) error {
	w := &worker{}
	defer w.close()
	cfg := group.Config{Seed: 99, LocalSteps: 1}.WithDefaults()
	dir = filepath.Join(dir, "v0")
	if _, err := w.genesis(ctx, group.Config{Seed: 99}.WithDefaults(), dir); err != nil {
		return err
	}
	b, _ := batch.Decode(p, batch.Limits{})
	res, err := w.train(ctx, cfg, dir, 0, 0, b.Steps, nil)
	if err != nil {
		return err
	}
	payload, err := res.delta.MarshalBinary()
	if err != nil {
		return err
	}
	share := tr.Status().Round
	var ids []core.BatchID
	tr.group.view(func(s *group.State) { ids = s.Round.Shares[tr.self] })
	req := request{Op: opDelta, Round: round, Base: share.Base, Samples: res.samples, Batches: ids}
	tr.signDelta(&req, payload)
	return tr.group.takeDelta(ctx, tr.self, req, payload)
}
