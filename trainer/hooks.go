package trainer

import (
	"context"
	"errors"
	"time"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// What harnesses (trainer/harness: clusters for tests and benchmarks)
// need of a trainer beyond its API: faults by hook, and a worker alone.

// Crash stops the trainer as a crash would, for harnesses: its raft member
// stops with no hand-over and its host (when New made it) closes first,
// so that nothing goes out after the moment of the crash. Close must
// still be called.
func (t *Trainer) Crash() error {
	var errs []error
	if t.peer != nil {
		errs = append(errs, t.peer.Close())
	}
	errs = append(errs, t.group.raft.Shutdown().Error())
	return errors.Join(errs...)
}

// IsLeader reports whether the trainer's raft member leads the group now.
func (t *Trainer) IsLeader() bool { return t.group.isLeader() }

// SetIsolated cuts the trainer off the other trainers (on) or heals it,
// for harnesses testing partitions: while cut, its raft and trainer
// streams are refused both ways. The connections it holds stay up; the
// harness drops them.
func (t *Trainer) SetIsolated(on bool) { t.isolated.Store(on) }

// LocalRollouts is a trainer's worker alone on a task set, with no raft
// and no mesh: the rollouts and training of a trainer's share of a task
// set's round, for benchmarks (trainer/harness's BenchRollouts).
type LocalRollouts struct {
	w   *worker
	rt  *rolloutRuntime
	cfg group.Config
}

// LocalRound is what one LocalRollouts.Train did.
type LocalRound struct {
	// Samples, Tokens, RolloutSeconds, MeanReward and FlatGroups report
	// the rollouts (FlatGroups: groups whose rewards were all equal).
	Samples, Tokens int
	RolloutSeconds  float64
	MeanReward      float64
	FlatGroups      int
	// TrainSeconds is the training alone; TrainedSamples the samples
	// trained.
	TrainSeconds   float64
	TrainedSamples int
}

// NewLocalRollouts makes a worker on the native engine for the task set
// set, described by ts, its verifier plugin the WASM file at plugin; cfg
// is the group's configuration (its defaults filled in).
func NewLocalRollouts(ctx context.Context, set *tasks.Set, ts group.TaskSet, plugin string, cfg group.Config) (*LocalRollouts, error) {
	rt, err := newLocalRuntime(ctx, set, ts, plugin, "")
	if err != nil {
		return nil, err
	}
	return &LocalRollouts{w: &worker{}, rt: rt, cfg: cfg}, nil
}

// Close closes the engine and the verifier.
func (l *LocalRollouts) Close() error {
	return errors.Join(l.w.close(), l.rt.runner.Close(context.Background()))
}

// Genesis writes version 0 to dir.
func (l *LocalRollouts) Genesis(ctx context.Context, dir string) error {
	_, err := l.w.genesis(ctx, l.cfg, dir)
	return err
}

func (l *LocalRollouts) items(prompts []*tasks.Task) []rolloutItem {
	items := make([]rolloutItem, 0, len(prompts))
	for _, x := range prompts {
		items = append(items, rolloutItem{id: group.TaskItemID(l.rt.set.Hash, x.ID, 0), task: x, rt: l.rt})
	}
	return items
}

// Train samples the set's G rollouts of each prompt from the version in
// dir (version base) in round, scores them and trains on them, and writes
// the next version (dir's with the delta applied) to next.
func (l *LocalRollouts) Train(ctx context.Context, dir, next string, base, round uint64, prompts []*tasks.Task) (LocalRound, error) {
	res, err := l.w.train(ctx, l.cfg, dir, base, round, nil, l.items(prompts))
	if err != nil {
		return LocalRound{}, err
	}
	parent, err := adapter.Read(dir)
	if err != nil {
		return LocalRound{}, err
	}
	v := parent
	if res.samples > 0 {
		if v, err = adapter.Apply(parent, res.delta); err != nil {
			return LocalRound{}, err
		}
	}
	if err := v.Write(next); err != nil {
		return LocalRound{}, err
	}
	ro := res.rollouts
	return LocalRound{Samples: ro.Samples, Tokens: ro.Tokens, RolloutSeconds: ro.Seconds, MeanReward: ro.MeanReward, FlatGroups: ro.Flat,
		TrainSeconds: res.trainSeconds, TrainedSamples: res.samples}, nil
}

// Evaluate scores the version in dir on the set's held-out split.
func (l *LocalRollouts) Evaluate(ctx context.Context, dir string) (group.Eval, error) {
	return l.w.evaluate(ctx, l.cfg, dir, l.rt)
}

// RawSample samples G replies to each prompt from the version in dir with
// the engine alone (the seeds Train's rollouts use in round), with no
// scoring and no steps made, and returns the tokens and the seconds: the
// baseline of the rollouts' rate.
func (l *LocalRollouts) RawSample(ctx context.Context, dir string, prompts []*tasks.Task, round uint64) (int, float64, error) {
	w := l.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ready(ctx, l.cfg); err != nil {
		return 0, 0, err
	}
	if err := w.eng.LoadAdapter(ctx, dir); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	n := 0
	for _, it := range l.items(prompts) {
		text, err := w.render.Render(it.task.Messages, it.task.Tools, true)
		if err != nil {
			return 0, 0, err
		}
		prompt := w.tok.Encode(text)
		max := it.task.Settings(it.rt.ts.MaxTokens).MaxTokens
		for k := range it.rt.ts.Group {
			ids, _, err := w.eng.Generate(ctx, prompt, engine.GenOptions{MaxTokens: max, Temperature: 1, Seed: rolloutSeed(it.id, round, k)})
			if err != nil {
				return 0, 0, err
			}
			n += len(ids)
		}
	}
	return n, time.Since(start).Seconds(), nil
}
