package trainer

import (
	"context"
	"path/filepath"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
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
)

// SetBeforePublish has fn run before the leader proposes a version.
func (t *Trainer) SetBeforePublish(fn func(ctx context.Context, round uint64)) { t.beforePublish = fn }

// Fenced counts the publications the group refused.
func (t *Trainer) Fenced() int64 { return t.fenced.Load() }

// FenceCheck checks a claim against the group's lineage.
func (t *Trainer) FenceCheck(c group.Claim) error { return t.group.fenceCheck(c) }

// ViewGroup reads the replicated state.
func (t *Trainer) ViewGroup(fn func(*group.State)) { t.group.view(fn) }

// LatestShared is the newest manifest the weights service serves.
func (t *Trainer) LatestShared() *chunks.Manifest { return t.weights.Latest() }

// AddTasksFrom has the trainer take a task-set payload from itself.
func (t *Trainer) AddTasksFrom(ctx context.Context, payload []byte) error {
	return t.addTasks(ctx, t.self, payload)
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
	return tr.group.takeDelta(ctx, tr.self, request{Op: opDelta, Round: round, Base: share.Base, Samples: res.samples, Batches: ids}, payload)
}
