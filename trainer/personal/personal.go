// Package personal trains a device's personal adapter: a LoRA adapter
// learned from one device's own scored steps only, on top of the shared
// version it serves (the shared adapter merged into the base), so that the
// two stack exactly into one adapter (model/peft.Stack).
//
// Train opens the base with the native engine, merges the shared adapter
// into it, loads the personal adapter trained so far (or starts a fresh one,
// whose zero B leaves the policy unchanged), trains it with trainer/learn on
// the job's newest MaxSteps steps (their old log-probs those of the job's
// starting policy, with no pull towards the shared version unless
// Options.KL asks for one), writes the personal part alone to the job's
// output directory, and scores the adapter before and after on the
// steps the device held back (see Agrees and RATIONALE.md).
package personal

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/engine/torch"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/learn"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// Errors reported by Train; match them with errors.Is.
var (
	// ErrOptions is a bad Options value.
	ErrOptions = errors.New("personal: invalid options")
	// ErrJob is a bad job: no output directory, or one that exists.
	ErrJob = errors.New("personal: invalid job")
	// ErrNoSteps is a job with no step that can be trained on.
	ErrNoSteps = errors.New("personal: no steps to train on")
)

// Defaults and bounds.
const (
	// DefaultRank is the rank of a fresh personal adapter.
	DefaultRank = 4
	// DefaultRecipe is the recipe when Options.Recipe is empty.
	DefaultRecipe = "combined"
	// DefaultEpochs is how many passes a job makes over its steps.
	DefaultEpochs = 4
	// EngineNative and EngineTorch are the engines a job trains with.
	EngineNative = "native"
	EngineTorch  = "torch"
	// DefaultLR is the learning rate when Options.LR is 0: the trainers'
	// group default (trainer/group.DefaultLR).
	DefaultLR = 1e-2
	// DefaultKL is the KL penalty's weight when Options.KL is 0: none (see
	// RATIONALE.md).
	DefaultKL = 0
	// MiniBatch is how many samples one optimizer step takes.
	MiniBatch = 32
	// MaxSteps bounds the steps one job trains on: the newest MaxSteps
	// (by Timings.Start, in the job's order among equals); the older ones
	// are left out.
	MaxSteps = 512
	// MaxHeldBack bounds the held-back steps one job scores on, the newest
	// MaxHeldBack likewise.
	MaxHeldBack = 256
)

// Options says what the personal adapters are trained on and how. The zero
// value of every field but Base means its default.
type Options struct {
	// Base is the base model's directory (a Hugging Face directory the
	// native engine opens, with its tokenizer.json).
	Base string
	// Recipe is binary, opd or combined (default combined).
	Recipe string
	// Rank is the rank of a fresh personal adapter (default 4); an
	// adapter trained before keeps its own.
	Rank int
	// LR is the learning rate (0: DefaultLR, the trainers' group
	// default: a job is a few optimizer steps on a few dozen steps, as a
	// trainer's share of a round is).
	LR float64
	// KL weighs the penalty that keeps the policy near the shared version
	// (the k3 estimator, towards the base with the shared adapter merged
	// in). 0 means DefaultKL (none); a negative value turns it off.
	KL float64
	// Epochs is how many passes over the steps a job makes (0:
	// DefaultEpochs).
	Epochs int
	// Engine is native (the Go engine, for small models; the default) or
	// torch (a PyTorch worker, on the CPU or a GPU: where the device has
	// torch). Torch configures the latter; its LoRA rank, seed and name
	// come from the job.
	Engine string
	Torch  torch.Options
	// Threads bounds the engine's goroutines (0: runtime.GOMAXPROCS). A
	// native engine's sums depend on it: fix it for runs to repeat.
	Threads int
	// Now gives the time Result.Seconds is measured with (nil: time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, loss.Recipe, error) {
	if o.Recipe == "" {
		o.Recipe = DefaultRecipe
	}
	if o.Rank == 0 {
		o.Rank = DefaultRank
	}
	if o.Epochs == 0 {
		o.Epochs = DefaultEpochs
	}
	if o.LR == 0 {
		o.LR = DefaultLR
	}
	if o.Engine == "" {
		o.Engine = EngineNative
	}
	if o.Engine != EngineNative && o.Engine != EngineTorch {
		return o, 0, fmt.Errorf("%w: engine %q (native or torch)", ErrOptions, o.Engine)
	}
	switch {
	case o.KL == 0:
		o.KL = DefaultKL
	case o.KL < 0:
		o.KL = 0
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r, err := loss.ParseRecipe(o.Recipe)
	switch {
	case o.Base == "":
		return o, 0, fmt.Errorf("%w: no base model directory", ErrOptions)
	case err != nil:
		return o, 0, fmt.Errorf("%w: %w (want binary, opd or combined)", ErrOptions, err)
	case o.Rank < 0 || o.Rank > 4096:
		return o, 0, fmt.Errorf("%w: rank %d (want 1 to 4096)", ErrOptions, o.Rank)
	case o.Epochs < 0 || o.Epochs > 1000:
		return o, 0, fmt.Errorf("%w: epochs %d (want 1 to 1000)", ErrOptions, o.Epochs)
	case math.IsNaN(o.LR) || o.LR < 0 || math.IsInf(o.LR, 0):
		return o, 0, fmt.Errorf("%w: learning rate %v", ErrOptions, o.LR)
	case math.IsNaN(o.KL) || math.IsInf(o.KL, 0):
		return o, 0, fmt.Errorf("%w: KL weight %v", ErrOptions, o.KL)
	case o.Threads < 0:
		return o, 0, fmt.Errorf("%w: threads %d", ErrOptions, o.Threads)
	}
	return o, r, nil
}

// Train trains j.Prev (or a fresh adapter of rank o.Rank) on j.Steps on top
// of the base with j.Shared merged in, writes the personal adapter alone to
// j.Out and scores it on j.HeldBack: the share of the held-back steps with
// a reward other than 0 that the policy agrees with (see Agrees).
// ScoreBefore is j.Prev's score, 0.5 for a fresh adapter (the shared policy
// itself: every step a tie), ScoreAfter the new adapter's; both are -1 when
// no held-back step can be scored. Trained counts the samples trained on:
// one per choice, so one per step of the usual single reply. Steps are
// never dropped as stale, whatever adapter served them ("v12-p3"): all are
// the device's own. Only the newest MaxSteps steps and MaxHeldBack
// held-back steps are used.
//
// j.Out must not exist; it is written atomically, with the base's
// base_model_name_or_path (that of the shared adapter, when there is one,
// so that the two stack). Nothing is written on an error.
func Train(ctx context.Context, o Options, j core.PersonalJob) (core.PersonalResult, error) {
	o, recipe, err := o.withDefaults()
	if err != nil {
		return core.PersonalResult{}, err
	}
	start := o.Now()
	log := o.Logger.With("component", "personal")
	if j.Out == "" {
		return core.PersonalResult{}, fmt.Errorf("%w: no output directory", ErrJob)
	}
	if err := absent(j.Out); err != nil {
		return core.PersonalResult{}, err
	}
	steps := newest(j.Steps, MaxSteps)
	if len(steps) == 0 {
		return core.PersonalResult{}, fmt.Errorf("%w: the job has none", ErrNoSteps)
	}
	if dropped := countSteps(j.Steps) - len(steps); dropped > 0 {
		log.Info("older steps left out", "trained_on", len(steps), "left_out", dropped)
	}

	txt, err := modeldir.Load(o.Base)
	if err != nil {
		return core.PersonalResult{}, fmt.Errorf("personal: base %s: %w", o.Base, err)
	}
	if txt.TemplateErr != nil {
		log.Warn("no usable chat template in the base's tokenizer_config.json; using Qwen3's", "err", txt.TemplateErr)
	}
	eng, baseName, err := open(ctx, o, j)
	if err != nil {
		return core.PersonalResult{}, err
	}
	defer eng.Close()
	info := eng.Info()
	b := sample.NewBuilder(txt.Tokenizer, txt.Renderer, sample.Options{MaxTokens: info.MaxPosition})

	res := core.PersonalResult{ScoreBefore: -1, ScoreAfter: -1}
	sc, err := newScorer(ctx, eng, b, newest(j.HeldBack, MaxHeldBack))
	if err != nil {
		return res, err
	}
	res.HeldBack = sc.n()
	if sc.n() > 0 {
		res.ScoreBefore = 0.5
		if j.Prev != "" {
			if res.ScoreBefore, err = sc.score(ctx, eng); err != nil {
				return res, err
			}
		}
	}

	l, err := learn.New(eng, b, learn.Options{
		Recipe:    recipe,
		Engine:    engine.Recipe{LR: o.LR, Loss: loss.Config{KLCoef: o.KL}},
		Epochs:    o.Epochs,
		MiniBatch: MiniBatch,
		// A personal adapter learns from the device's own steps, served by
		// whatever shared and personal versions it held then ("v12-p3"):
		// none is stale.
		VersionOf: func(string) (uint64, bool) { return 0, false },
		Logger:    log,
	})
	if err != nil {
		return res, err
	}
	rep, err := l.Train(ctx, onPolicy(steps))
	if err != nil {
		return res, fmt.Errorf("personal: train: %w", err)
	}
	if rep.OptSteps == 0 {
		return res, fmt.Errorf("%w: none of the %d steps is usable for the %s recipe (%d without a reward or hint, %d not buildable)",
			ErrNoSteps, len(steps), recipe, rep.Skipped, rep.BuildFailed)
	}
	res.Trained = rep.Used
	if sc.n() > 0 {
		if res.ScoreAfter, err = sc.score(ctx, eng); err != nil {
			return res, err
		}
	}
	if err := export(ctx, eng, j.Out, baseName); err != nil {
		return res, err
	}
	res.Seconds = o.Now().Sub(start).Seconds()
	log.Info("personal adapter trained", "out", j.Out, "shared", j.SharedVersion, "report", rep,
		"held_back", res.HeldBack, "score_before", res.ScoreBefore, "score_after", res.ScoreAfter)
	return res, nil
}

// open returns the engine to train: the base with j.Shared merged in, and
// j.Prev (else a fresh adapter of rank o.Rank) as its adapter; and the
// base_model_name_or_path its export carries.
func open(ctx context.Context, o Options, j core.PersonalJob) (engine.Engine, string, error) {
	if o.Engine == EngineTorch {
		return openTorch(ctx, o, j)
	}
	nopt := native.Options{Seed: j.Seed, Threads: o.Threads, LoRA: native.LoRAConfig{Rank: o.Rank}, Logger: o.Logger}
	base, err := native.Open(ctx, o.Base, nopt)
	if err != nil {
		return nil, "", fmt.Errorf("personal: base %s: %w", o.Base, err)
	}
	var eng engine.Engine = base
	name := base.Info().Name
	if j.Shared != "" {
		if name, err = sharedBase(j.Shared, name); err != nil {
			base.Close()
			return nil, "", err
		}
		if err := base.LoadAdapter(ctx, j.Shared); err != nil {
			base.Close()
			return nil, "", fmt.Errorf("personal: shared adapter %s: %w", j.Shared, err)
		}
		// The merged engine's own adapter is a fresh one of rank o.Rank,
		// drawn from j.Seed: the personal part.
		eng, err = base.MergeAdapter()
		base.Close()
		if err != nil {
			return nil, "", fmt.Errorf("personal: merge the shared adapter: %w", err)
		}
	}
	if j.Prev != "" {
		if err := eng.LoadAdapter(ctx, j.Prev); err != nil {
			eng.Close()
			return nil, "", fmt.Errorf("personal: previous personal adapter %s: %w", j.Prev, err)
		}
	}
	return eng, name, nil
}

// sharedBase is the base_model_name_or_path of the shared adapter in dir,
// or def when it names none.
func sharedBase(dir, def string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, adapter.ConfigFile))
	if err != nil {
		return "", fmt.Errorf("personal: shared adapter: %w", err)
	}
	var c struct {
		Base string `json:"base_model_name_or_path"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("personal: shared adapter %s: %w", dir, err)
	}
	return cmp.Or(c.Base, def), nil
}

// absent reports an error unless nothing is at path.
func absent(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%w: output %s exists", ErrJob, path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: output %s: %w", ErrJob, path, err)
	}
	return nil
}

// export writes eng's adapter to out as a PEFT directory naming baseName
// as its base, atomically: into a temporary directory beside out, then
// renamed. It refuses an out that exists by then.
func export(ctx context.Context, eng engine.Engine, out, baseName string) error {
	parent := filepath.Dir(filepath.Clean(out))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("personal: output: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, ".personal-export-*")
	if err != nil {
		return fmt.Errorf("personal: output: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := eng.ExportAdapter(ctx, tmp); err != nil {
		return fmt.Errorf("personal: export: %w", err)
	}
	bun, err := adapter.Read(tmp)
	if err != nil {
		return fmt.Errorf("personal: export: %w", err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(bun.Config, &cfg); err != nil {
		return fmt.Errorf("personal: export: %w", err)
	}
	if cfg["base_model_name_or_path"], err = json.Marshal(baseName); err != nil {
		return err
	}
	if bun.Config, err = json.MarshalIndent(cfg, "", "  "); err != nil {
		return err
	}
	if err := absent(out); err != nil {
		return err
	}
	if err := bun.Write(out); err != nil {
		return fmt.Errorf("personal: write %s: %w", out, err)
	}
	return nil
}

// newest returns the newest n non-nil steps, oldest first: by
// Timings.Start, the given order among equal times.
func newest(steps []*core.Step, n int) []*core.Step {
	out := make([]*core.Step, 0, len(steps))
	for _, st := range steps {
		if st != nil {
			out = append(out, st)
		}
	}
	slices.SortStableFunc(out, func(a, b *core.Step) int { return a.Timings.Start.Compare(b.Timings.Start) })
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

func countSteps(steps []*core.Step) int {
	n := 0
	for _, st := range steps {
		if st != nil {
			n++
		}
	}
	return n
}

// onPolicy returns copies of steps whose recorded log-probs are unknown
// (NaN), so that Train takes those of the job's starting policy (base +
// shared + the previous personal adapter) as the old ones: every sample
// starts at ratio 1. A job replays the device's recent steps, served by
// earlier stacks; when the shared version under them moved far, their
// recorded log-probs would make the ratios of the replies the user liked
// tiny, and with them the gradient that raises those replies (the
// surrogate's gradient scales with the ratio). The user's verdict on a
// reply holds whichever policy sampled it.
func onPolicy(steps []*core.Step) []*core.Step {
	out := make([]*core.Step, len(steps))
	for i, s := range steps {
		c := *s
		c.Response.Choices = slices.Clone(s.Response.Choices)
		for k := range c.Response.Choices {
			toks := slices.Clone(c.Response.Choices[k].Tokens)
			for t := range toks {
				toks[t].Logprob = math.NaN()
			}
			c.Response.Choices[k].Tokens = toks
		}
		out[i] = &c
	}
	return out
}

// openTorch is open on the torch engine: the base with the shared adapter
// merged in is written (by the native engine, which can merge) to a
// directory beside j.Out that the engine's close removes, and the torch
// worker loads it with a fresh adapter of rank o.Rank, or j.Prev.
func openTorch(ctx context.Context, o Options, j core.PersonalJob) (engine.Engine, string, error) {
	dir, name := o.Base, ""
	cleanup := func() {}
	if j.Shared != "" {
		base, err := native.Open(ctx, o.Base, native.Options{Threads: o.Threads, Logger: o.Logger})
		if err != nil {
			return nil, "", fmt.Errorf("personal: base %s: %w", o.Base, err)
		}
		if name, err = sharedBase(j.Shared, base.Info().Name); err != nil {
			base.Close()
			return nil, "", err
		}
		if err := base.LoadAdapter(ctx, j.Shared); err != nil {
			base.Close()
			return nil, "", fmt.Errorf("personal: shared adapter %s: %w", j.Shared, err)
		}
		merged, err := base.MergeAdapter()
		base.Close()
		if err != nil {
			return nil, "", fmt.Errorf("personal: merge the shared adapter: %w", err)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(j.Out)), ".merged-")
		if err == nil {
			err = merged.(*native.Engine).SaveModel(tmp)
		}
		merged.Close()
		if err != nil {
			os.RemoveAll(tmp)
			return nil, "", fmt.Errorf("personal: writing the base with the shared version merged in: %w", err)
		}
		dir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	topt := o.Torch
	topt.LoRA.Rank, topt.Seed, topt.Threads = o.Rank, j.Seed, o.Threads
	if topt.Logger == nil {
		topt.Logger = o.Logger
	}
	eng, err := torch.Open(ctx, dir, topt)
	if err != nil {
		cleanup()
		return nil, "", fmt.Errorf("personal: the torch engine: %w", err)
	}
	if name == "" {
		name = eng.Info().Name
		if n, err := filepath.Abs(o.Base); err == nil && dir == o.Base {
			name = n
		}
	}
	if j.Prev != "" {
		if err := eng.LoadAdapter(ctx, j.Prev); err != nil {
			eng.Close()
			cleanup()
			return nil, "", fmt.Errorf("personal: previous personal adapter %s: %w", j.Prev, err)
		}
	}
	return closing{eng, cleanup}, name, nil
}

// closing is an engine whose Close also removes what was made for it.
type closing struct {
	engine.Engine
	cleanup func()
}

func (c closing) Close() error {
	err := c.Engine.Close()
	c.cleanup()
	return err
}
