// Package engine defines what a trainer and the model server (model/serve)
// ask of a model engine: log-probs of token sequences (with and without the
// LoRA adapter), one optimizer step of the clipped policy-gradient loss on a
// batch, sampling, and moving LoRA adapters in and out in PEFT format. Two
// engines implement it: the native Go engine (model/engine/native, CPU,
// small models) and the torch engine (model/engine/torch: a Python worker
// process, for CUDA). The interface is deliberately small and made of plain
// data so that a worker across a pipe can serve it.
package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/clawmesh/clawmesh/model/loss"
)

// Sentinel errors shared by every engine.
var (
	ErrClosed   = errors.New("engine: closed")
	ErrBadInput = errors.New("engine: bad input")
	ErrAdapter  = errors.New("engine: bad adapter")
	// ErrOutOfMemory reports a step or a scoring that did not fit in the
	// device's memory; the engine is still usable, and the same work in
	// smaller micro-batches (Recipe.MicroBatch) may fit.
	ErrOutOfMemory = errors.New("engine: out of memory")
)

// ModelInfo describes the loaded base model and its adapter.
type ModelInfo struct {
	Name, Arch     string
	VocabSize      int
	Layers         int
	Hidden         int
	Heads, KVHeads int
	HeadDim        int
	Intermediate   int
	MaxPosition    int
	TiedEmbeddings bool
	EOS            []int
	// Params counts the base model's parameters, LoRAParams the adapter's
	// (trainable) ones.
	Params, LoRAParams int64
	// LoRARank and LoRAAlpha describe the adapter.
	LoRARank  int
	LoRAAlpha float64
}

// TrainSample is one sequence to train on. Every per-token slice is indexed
// like Tokens; position t scores token t given the tokens before it, so
// position 0 (which has no context) is never trained.
type TrainSample struct {
	Tokens []int
	// LossMask selects the tokens the loss sees (the policy's own output).
	LossMask []bool
	// OldLogprobs are the log-probs recorded when the tokens were sampled;
	// nil means on-policy: the current policy's, detached.
	OldLogprobs []float32
	// Advantages are per token.
	Advantages []float32
	// RefLogprobs are the reference policy's log-probs for the KL penalty;
	// nil means no KL for this sample.
	RefLogprobs []float32
}

// Validate checks lengths and token ids against a vocabulary of vocab.
func (s TrainSample) Validate(vocab int) error {
	n := len(s.Tokens)
	switch {
	case n < 2:
		return fmt.Errorf("%w: %d tokens, need at least 2", ErrBadInput, n)
	case len(s.LossMask) != n:
		return fmt.Errorf("%w: loss mask has %d entries for %d tokens", ErrBadInput, len(s.LossMask), n)
	case len(s.Advantages) != n:
		return fmt.Errorf("%w: %d advantages for %d tokens", ErrBadInput, len(s.Advantages), n)
	case s.OldLogprobs != nil && len(s.OldLogprobs) != n:
		return fmt.Errorf("%w: %d old logprobs for %d tokens", ErrBadInput, len(s.OldLogprobs), n)
	case s.RefLogprobs != nil && len(s.RefLogprobs) != n:
		return fmt.Errorf("%w: %d ref logprobs for %d tokens", ErrBadInput, len(s.RefLogprobs), n)
	}
	return CheckTokens(s.Tokens, vocab)
}

// CheckTokens reports a token id outside [0, vocab).
func CheckTokens(toks []int, vocab int) error {
	for i, t := range toks {
		if t < 0 || t >= vocab {
			return fmt.Errorf("%w: token %d at %d outside vocabulary of %d", ErrBadInput, t, i, vocab)
		}
	}
	return nil
}

// Recipe is the optimisation recipe of one TrainStep. The zero value means
// the defaults below.
type Recipe struct {
	// Loss configures the clipped surrogate (see model/loss).
	Loss loss.Config
	// LR is AdamW's learning rate (default 1e-4).
	LR float64
	// WeightDecay is AdamW's decoupled weight decay (default 0).
	WeightDecay float64
	// Beta1, Beta2 and Eps are Adam's moment decays and denominator
	// epsilon (defaults 0.9, 0.999, 1e-8).
	Beta1, Beta2, Eps float64
	// MaxGradNorm clips the global gradient norm (default 1; negative: off).
	MaxGradNorm float64
	// MicroBatch is how many sequences an engine holds activations for at
	// once (default 8); larger batches accumulate gradients over several
	// micro-batches into one optimizer step.
	MicroBatch int
}

// Recipe defaults.
const (
	DefaultLR          = 1e-4
	DefaultBeta1       = 0.9
	DefaultBeta2       = 0.999
	DefaultEps         = 1e-8
	DefaultMaxGradNorm = 1.0
	DefaultMicroBatch  = 8
)

// WithDefaults returns r with zero fields replaced by defaults.
func (r Recipe) WithDefaults() Recipe {
	if r.LR == 0 {
		r.LR = DefaultLR
	}
	if r.Beta1 == 0 {
		r.Beta1 = DefaultBeta1
	}
	if r.Beta2 == 0 {
		r.Beta2 = DefaultBeta2
	}
	if r.Eps == 0 {
		r.Eps = DefaultEps
	}
	if r.MaxGradNorm == 0 {
		r.MaxGradNorm = DefaultMaxGradNorm
	}
	if r.MicroBatch == 0 {
		r.MicroBatch = DefaultMicroBatch
	}
	return r
}

// Validate checks r (after defaults).
func (r Recipe) Validate() error {
	d := r.WithDefaults()
	switch {
	case !(d.LR > 0), !(d.WeightDecay >= 0), !(d.Beta1 >= 0 && d.Beta1 < 1),
		!(d.Beta2 >= 0 && d.Beta2 < 1), !(d.Eps > 0), d.MicroBatch < 0:
		return fmt.Errorf("%w: recipe %+v", ErrBadInput, r)
	}
	if err := d.Loss.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return nil
}

// StepStats reports one TrainStep.
type StepStats struct {
	Loss     float64
	GradNorm float64 // global norm before clipping
	ClipFrac float64 // fraction of tokens whose ratio was clipped
	KL       float64
	Entropy  float64
	Tokens   int // tokens that contributed to the loss
}

// GenOptions controls Generate.
type GenOptions struct {
	// MaxTokens bounds the tokens generated (default 256).
	MaxTokens int
	// Temperature 0 is greedy decoding.
	Temperature float64
	// TopP keeps the smallest set of tokens whose probability reaches TopP
	// (0 or 1: off).
	TopP float64
	// Seed makes sampling reproducible.
	Seed uint64
	// Stop ends generation after any of these ids (the model's EOS ids
	// always stop it); the stop token is included in the output.
	Stop []int
	// OnToken, when set, sees every token as it is produced; an error stops
	// generation and is returned.
	OnToken func(id int, logprob float32) error
	// TopLogprobs > 0 (at most MaxTopLogprobs) has OnTop see, at every
	// position before OnToken sees the token chosen there, the TopLogprobs
	// most likely tokens and their log-probs under the untempered
	// distribution, most likely first. The slices are reused: copy to keep.
	TopLogprobs int
	OnTop       func(ids []int, logprobs []float32) error
}

// MaxTopLogprobs bounds GenOptions.TopLogprobs (as OpenAI bounds
// top_logprobs).
const MaxTopLogprobs = 20

// Engine is a model engine holding a frozen base model and one trainable
// LoRA adapter. Methods are safe for concurrent use; TrainStep and the
// adapter methods exclude the others while they run.
type Engine interface {
	Info() ModelInfo
	// Logprobs returns, for each sequence, log p(tok[t] | tok[:t]) at every
	// t ≥ 1, with index 0 set to 0. base=true evaluates the frozen base model
	// without the adapter (the reference or teacher).
	Logprobs(ctx context.Context, seqs [][]int, base bool) ([][]float32, error)
	// TrainStep takes one optimizer step on batch.
	TrainStep(ctx context.Context, batch []TrainSample, r Recipe) (StepStats, error)
	// Generate samples a continuation of prompt with the adapter, returning
	// the new tokens and their log-probs under the model (temperature 1).
	Generate(ctx context.Context, prompt []int, o GenOptions) (tokens []int, logprobs []float32, err error)
	// ExportAdapter writes the adapter to dir in PEFT format
	// (adapter_config.json + adapter_model.safetensors).
	ExportAdapter(ctx context.Context, dir string) error
	// LoadAdapter replaces the adapter with the one in dir and resets the
	// optimizer state.
	LoadAdapter(ctx context.Context, dir string) error
	// ResetAdapter replaces the adapter with a fresh initialisation (B = 0,
	// so the policy equals the base model) and resets the optimizer state.
	ResetAdapter() error
	Close() error
}

// Forker is an engine that can clone itself: the clone shares the frozen
// base weights, copies the adapter, and runs independently (serve from one
// while training the other).
type Forker interface {
	Fork() (Engine, error)
}

// Merger is an engine that can fold its adapter into its base weights: the
// merged engine's frozen base model is this engine's policy (base plus
// adapter), and it starts with a fresh adapter, so its policy equals that
// base. This engine is left as it is.
type Merger interface {
	MergeAdapter() (Engine, error)
}
