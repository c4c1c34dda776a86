package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clawmesh/clawmesh/trainer"
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
	cfg := group.Config{LocalSteps: o.LocalSteps}.WithDefaults()
	lr, err := trainer.NewLocalRollouts(ctx, set, ts, plugin, cfg)
	if err != nil {
		return nil, err
	}
	defer lr.Close()
	vdir := filepath.Join(dir, "v0")
	if err := lr.Genesis(ctx, vdir); err != nil {
		return nil, err
	}
	rep := &RolloutBenchReport{}
	var rawTokens int
	var rawSecs float64
	for v := 1; v <= o.Rounds; v++ {
		var prompts []*tasks.Task
		for i := range o.Prompts {
			prompts = append(prompts, train[((v-1)*o.Prompts+i)%len(train)])
		}
		// The baseline: the same prompts, G samples each, from the same
		// version, sampled by the engine alone, once before the round's
		// rollouts and once after them (a noisy machine favours neither).
		n, secs, err := lr.RawSample(ctx, vdir, prompts, uint64(v))
		if err != nil {
			return nil, err
		}
		rawTokens += n
		rawSecs += secs
		next := filepath.Join(dir, fmt.Sprintf("v%d", v))
		res, err := lr.Train(ctx, vdir, next, uint64(v-1), uint64(v), prompts)
		if err != nil {
			return nil, err
		}
		if n, secs, err = lr.RawSample(ctx, vdir, prompts, uint64(v)); err != nil {
			return nil, err
		}
		rawTokens += n
		rawSecs += secs
		vdir = next
		ev, err := lr.Evaluate(ctx, vdir)
		if err != nil {
			return nil, err
		}
		r := RolloutBenchRound{Version: uint64(v), Samples: res.Samples, Tokens: res.Tokens, RolloutSeconds: res.RolloutSeconds,
			TrainSeconds: res.TrainSeconds, MeanReward: res.MeanReward, FlatGroups: res.FlatGroups, TrainedSamples: res.TrainedSamples,
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

func cmpOr(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}
