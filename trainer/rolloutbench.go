package trainer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// RolloutBenchOptions configure BenchRollouts.
type RolloutBenchOptions struct {
	// Tasks is a task set (JSONL) and Verifier its verifier plugin (WASM).
	Tasks, Verifier []byte
	// Group is G (default 8), Prompts the prompts of a round (default 8),
	// Rounds the rounds (default 4), LocalSteps the optimizer steps of a
	// round (default 2).
	Group, Prompts, Rounds, LocalSteps int
	// Dir holds the versions (default a temporary directory, removed).
	Dir string
}

// RolloutBenchRound is one round of BenchRollouts.
type RolloutBenchRound struct {
	Version        uint64  `json:"version"`
	Samples        int     `json:"samples"`
	Tokens         int     `json:"tokens"`
	RolloutSeconds float64 `json:"rollout_seconds"`
	TrainSeconds   float64 `json:"train_seconds"`
	RolloutShare   float64 `json:"rollout_share"`
	MeanReward     float64 `json:"mean_reward"`
	FlatGroups     int     `json:"flat_groups"`
	TrainedSamples int     `json:"trained_samples"`
	HeldOutPassAt1 float64 `json:"held_out_pass_at_1"`
	HeldOutMeanRwd float64 `json:"held_out_mean_reward"`
}

// RolloutBenchReport is what BenchRollouts measured. RawTokensPerSec is
// the baseline: the engine's own sampling of the same prompts (same G,
// same lengths), with no scoring and no steps made, in the same run.
type RolloutBenchReport struct {
	Rounds            []RolloutBenchRound `json:"rounds"`
	RolloutTokens     int                 `json:"rollout_tokens"`
	RolloutSeconds    float64             `json:"rollout_seconds"`
	TrainSeconds      float64             `json:"train_seconds"`
	RolloutTokensPerS float64             `json:"rollout_tokens_per_s"`
	RawTokensPerS     float64             `json:"raw_tokens_per_s"`
	// VsRaw is RolloutTokensPerS / RawTokensPerS; RolloutShare the share
	// of the rounds' time (rollouts + training) spent on rollouts.
	VsRaw        float64 `json:"vs_raw"`
	RolloutShare float64 `json:"rollout_share"`
}

// BenchRollouts runs rounds of rollouts and training on the tiny model with
// the native engine, as a trainer's share of a task set's round does (no
// raft, no mesh: the worker alone), each round from the previous round's
// version, and measures rollout tokens/s against the engine's raw sampling
// and the share of a round spent on rollouts.
func BenchRollouts(ctx context.Context, o RolloutBenchOptions) (*RolloutBenchReport, error) {
	o.Group, o.Prompts, o.Rounds, o.LocalSteps = cmpOr(o.Group, 8), cmpOr(o.Prompts, 8), cmpOr(o.Rounds, 4), cmpOr(o.LocalSteps, 2)
	set, err := tasks.Parse(bytes.NewReader(o.Tasks))
	if err != nil {
		return nil, err
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "clawmesh-bench-rollouts-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	plugin := filepath.Join(dir, "verifier.wasm")
	if err := os.WriteFile(plugin, o.Verifier, 0o600); err != nil {
		return nil, err
	}
	ts := group.TaskSet{Hash: set.Hash, Reward: tasks.Hash(o.Verifier), Group: o.Group, Holdout: 0.2}
	train, held := set.Split(ts.Holdout)
	for _, x := range held {
		ts.HeldOut = append(ts.HeldOut, x.ID)
	}
	rt, err := newLocalRuntime(ctx, set, ts, plugin, "")
	if err != nil {
		return nil, err
	}
	defer rt.runner.Close(context.Background())
	w := &worker{}
	defer w.close()
	cfg := group.Config{LocalSteps: o.LocalSteps}.WithDefaults()
	vdir := filepath.Join(dir, "v0")
	if _, err := w.genesis(ctx, cfg, vdir); err != nil {
		return nil, err
	}
	rep := &RolloutBenchReport{}
	var rawTokens int
	var rawSecs float64
	for v := 1; v <= o.Rounds; v++ {
		var items []rolloutItem
		for i := range o.Prompts {
			x := train[((v-1)*o.Prompts+i)%len(train)]
			items = append(items, rolloutItem{id: group.TaskItemID(set.Hash, x.ID, 0), task: x, rt: rt})
		}
		// The baseline: the same prompts, G samples each, from the same
		// version, sampled by the engine alone, once before the round's
		// rollouts and once after them (a noisy machine favours neither).
		n, secs, err := w.rawSample(ctx, cfg, vdir, items, uint64(v))
		if err != nil {
			return nil, err
		}
		rawTokens += n
		rawSecs += secs
		res, err := w.train(ctx, cfg, vdir, uint64(v-1), uint64(v), nil, items)
		if err != nil {
			return nil, err
		}
		if n, secs, err = w.rawSample(ctx, cfg, vdir, items, uint64(v)); err != nil {
			return nil, err
		}
		rawTokens += n
		rawSecs += secs
		parent, err := adapter.Read(vdir)
		if err != nil {
			return nil, err
		}
		next := parent
		if res.samples > 0 {
			if next, err = adapter.Apply(parent, res.delta); err != nil {
				return nil, err
			}
		}
		vdir = filepath.Join(dir, fmt.Sprintf("v%d", v))
		if err := next.Write(vdir); err != nil {
			return nil, err
		}
		ev, err := w.evaluate(ctx, cfg, vdir, rt)
		if err != nil {
			return nil, err
		}
		ro := res.rollouts
		r := RolloutBenchRound{Version: uint64(v), Samples: ro.Samples, Tokens: ro.Tokens, RolloutSeconds: ro.Seconds,
			TrainSeconds: res.trainSeconds, MeanReward: ro.MeanReward, FlatGroups: ro.Flat, TrainedSamples: res.samples,
			HeldOutPassAt1: ev.PassAt1, HeldOutMeanRwd: ev.MeanReward}
		if t := r.RolloutSeconds + r.TrainSeconds; t > 0 {
			r.RolloutShare = r.RolloutSeconds / t
		}
		rep.Rounds = append(rep.Rounds, r)
		rep.RolloutTokens += r.Tokens
		rep.RolloutSeconds += r.RolloutSeconds
		rep.TrainSeconds += r.TrainSeconds
	}
	if rep.RolloutSeconds > 0 {
		rep.RolloutTokensPerS = float64(rep.RolloutTokens) / rep.RolloutSeconds
	}
	if rawSecs > 0 {
		rep.RawTokensPerS = float64(rawTokens) / rawSecs
	}
	if rep.RawTokensPerS > 0 {
		rep.VsRaw = rep.RolloutTokensPerS / rep.RawTokensPerS
	}
	if t := rep.RolloutSeconds + rep.TrainSeconds; t > 0 {
		rep.RolloutShare = rep.RolloutSeconds / t
	}
	return rep, nil
}

// rawSample samples G replies to each item from the version in dir with
// the engine alone (the seeds the rollouts used), returning the tokens and
// the seconds.
func (w *worker) rawSample(ctx context.Context, cfg group.Config, dir string, items []rolloutItem, round uint64) (int, float64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ready(ctx, cfg); err != nil {
		return 0, 0, err
	}
	if err := w.eng.LoadAdapter(ctx, dir); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	n := 0
	for _, it := range items {
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

// newLocalRuntime makes a task runtime from a parsed set, a verifier file
// and a tool simulator file ("" for none), without a trainer.
func newLocalRuntime(ctx context.Context, set *tasks.Set, ts group.TaskSet, plugin, tools string) (*taskRuntime, error) {
	if set == nil {
		return nil, errors.New("trainer: no task set")
	}
	plugins := []reward.PluginConfig{{Name: verifierName, Path: plugin, Enabled: true}}
	if tools != "" {
		plugins = append(plugins, reward.PluginConfig{Name: toolsName, Path: tools, Enabled: true})
	}
	r, err := reward.New(ctx, reward.Options{Plugins: plugins, Strict: true, FailureLimit: -1})
	if err != nil {
		return nil, err
	}
	return &taskRuntime{ts: ts.WithDefaults(), set: set, byID: set.ByID(), runner: r}, nil
}

func cmpOr(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}
