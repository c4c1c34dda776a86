package torch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
)

// BenchOptions configures Bench. The zero value benchmarks the torch
// engine on the CPU on the tiny model.
type BenchOptions struct {
	// Engine is the engine measured: torch (default) or native.
	Engine string
	// Base is "tiny" (default: native.TinyConfig(512)) or an HF model
	// directory.
	Base string
	// Device is cpu (default) or cuda (the torch engine only).
	Device string
	// Python, Procs, DType and GradCheckpoint configure the torch engine
	// (see Options).
	Python         string
	Procs          int
	DType          string
	GradCheckpoint bool
	// Seqs and SeqLen shape a training batch (defaults 4 × 64); the first
	// quarter of each sequence is prompt, the rest is trained.
	Seqs, SeqLen int
	// Steps is how many train steps are timed after one untimed (default 3).
	Steps int
	// GenTokens is how many tokens are generated greedily after a 16-token
	// prompt (default 32).
	GenTokens int
	// Log receives the engines' logs as text (nil: discard).
	Log io.Writer
}

// EngineFigures are one engine's measurements.
type EngineFigures struct {
	Engine, Device    string
	TrainTokensPerSec float64 // every token of the batch
	GenTokensPerSec   float64
	// TrainFLOPS is the model arithmetic of the timed steps per second
	// (see BenchResult.FLOPsPerStep).
	TrainFLOPS float64
}

// BenchResult reports Bench.
type BenchResult struct {
	Model        string
	Params       int64
	Seqs, SeqLen int
	// FLOPsPerStep is a train step's model arithmetic: forward and
	// backward to the activations (2 + 2 FLOPs per weight per token) of
	// every projection and attention product, the LM head on the trained
	// tokens; the frozen weights need no weight gradient, LoRA's own
	// arithmetic is left out.
	FLOPsPerStep float64
	Subject      EngineFigures
	// Baseline is measured in the same run: on the CPU, the other engine
	// on the same model.
	Baseline *EngineFigures
	// Device is the torch worker's device: on CUDA, the GPU's name, the
	// peak memory of the train steps, and its measured matmul rate, the
	// reference for MFU (model FLOPs utilisation).
	Device *DeviceStats
	MFU    float64
}

func (o BenchOptions) withDefaults() BenchOptions {
	if o.Engine == "" {
		o.Engine = "torch"
	}
	if o.Base == "" {
		o.Base = "tiny"
	}
	if o.Device == "" {
		o.Device = DeviceCPU
	}
	if o.Seqs == 0 {
		o.Seqs = 4
	}
	if o.SeqLen == 0 {
		o.SeqLen = 64
	}
	if o.Steps == 0 {
		o.Steps = 3
	}
	if o.GenTokens == 0 {
		o.GenTokens = 32
	}
	return o
}

// Bench measures an engine's train step and generation on one model, with
// a baseline from the same run: on the CPU the other engine on the same
// model, on CUDA the GPU's own measured matmul rate (MFU).
func Bench(ctx context.Context, o BenchOptions) (BenchResult, error) {
	o = o.withDefaults()
	switch {
	case o.Engine != "torch" && o.Engine != "native":
		return BenchResult{}, fmt.Errorf("%w: engine %q (native or torch)", ErrConfig, o.Engine)
	case o.Device != DeviceCPU && o.Device != DeviceCUDA:
		return BenchResult{}, fmt.Errorf("%w: device %q (cpu or cuda)", ErrConfig, o.Device)
	case o.Engine == "native" && o.Device == DeviceCUDA:
		return BenchResult{}, fmt.Errorf("%w: the native engine runs on the CPU; CUDA needs --engine torch", ErrConfig)
	case o.Seqs < 1 || o.SeqLen < 8 || o.Steps < 1 || o.GenTokens < 1:
		return BenchResult{}, fmt.Errorf("%w: %d sequences of %d tokens, %d steps, %d generated tokens", ErrConfig, o.Seqs, o.SeqLen, o.Steps, o.GenTokens)
	}
	var logger = discardLogger()
	if o.Log != nil {
		logger = textLogger(o.Log)
	}
	topt := Options{Python: o.Python, Device: o.Device, Procs: o.Procs, DType: o.DType, GradCheckpoint: o.GradCheckpoint, Logger: logger}
	var cfg native.Config
	openTorch := func() (*Engine, error) {
		if o.Base == "tiny" {
			return OpenTiny(ctx, cfg, 1, topt)
		}
		return Open(ctx, o.Base, topt)
	}
	openNative := func() (engine.Engine, error) {
		if o.Base == "tiny" {
			return native.NewTiny(cfg, 1, native.Options{Name: "tiny"})
		}
		return native.Open(ctx, o.Base, native.Options{})
	}
	if o.Base == "tiny" {
		cfg = native.TinyConfig(512)
	} else {
		var err error
		if cfg, err = native.ReadConfig(o.Base); err != nil {
			return BenchResult{}, err
		}
	}
	res := BenchResult{Model: o.Base, Seqs: o.Seqs, SeqLen: min(o.SeqLen, cfg.MaxPosition), FLOPsPerStep: stepFLOPs(cfg, o.Seqs, min(o.SeqLen, cfg.MaxPosition))}
	r := rand.New(rand.NewPCG(1, 1))
	batch := benchBatch(r, cfg, o.Seqs, res.SeqLen)
	prompt := benchBatch(r, cfg, 1, 16)[0].Tokens

	te, err := openTorch()
	if err != nil {
		return res, err
	}
	defer te.Close()
	res.Params = te.Info().Params
	if o.Device == DeviceCUDA {
		if _, err := te.Device(ctx, 0, true); err != nil {
			return res, err
		}
	}
	tf, err := measure(ctx, te, batch, prompt, o, res.FLOPsPerStep)
	if err != nil {
		return res, fmt.Errorf("torch engine: %w", err)
	}
	tf.Engine, tf.Device = "torch", o.Device
	if o.Device == DeviceCUDA {
		d, err := te.Device(ctx, 8192, false)
		if err != nil {
			return res, err
		}
		res.Device = &d
		if d.MatmulFLOPS > 0 {
			res.MFU = tf.TrainFLOPS / d.MatmulFLOPS
		}
	}
	var nf *EngineFigures
	if o.Device == DeviceCPU {
		ne, err := openNative()
		if err != nil {
			return res, err
		}
		f, err := measure(ctx, ne, batch, prompt, o, res.FLOPsPerStep)
		ne.Close()
		if err != nil {
			return res, fmt.Errorf("native engine: %w", err)
		}
		f.Engine, f.Device = "native", DeviceCPU
		nf = &f
	}
	if o.Engine == "torch" {
		res.Subject, res.Baseline = tf, nf
	} else {
		res.Subject, res.Baseline = *nf, &tf
	}
	return res, nil
}

func benchBatch(r *rand.Rand, cfg native.Config, n, length int) []engine.TrainSample {
	out := make([]engine.TrainSample, n)
	for i := range out {
		s := engine.TrainSample{Tokens: make([]int, length), LossMask: make([]bool, length), Advantages: make([]float32, length)}
		adv := float32(2*(i%2) - 1)
		for t := range length {
			s.Tokens[t] = r.IntN(cfg.VocabSize)
			s.LossMask[t] = t >= length/4
			s.Advantages[t] = adv
		}
		out[i] = s
	}
	return out
}

// stepFLOPs is BenchResult.FLOPsPerStep for n sequences of T tokens.
func stepFLOPs(c native.Config, n, T int) float64 {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	perTok := float64(c.Hidden*(q+2*kv) + q*c.Hidden + 3*c.Hidden*c.Intermediate)
	// Causal attention: Q·Kᵀ and P·V over T(T+1)/2 pairs per head.
	attn := 2 * float64(T*(T+1)/2) * float64(q)
	trained := T - T/4
	head := float64(c.VocabSize * c.Hidden)
	fwd := float64(n) * (2*perTok*float64(T)*float64(c.Layers) + 2*attn*float64(c.Layers) + 2*head*float64(trained))
	return 2 * fwd // forward, and backward to the activations
}

func measure(ctx context.Context, e engine.Engine, batch []engine.TrainSample, prompt []int, o BenchOptions, flops float64) (EngineFigures, error) {
	rc := engine.Recipe{LR: 1e-5, MicroBatch: len(batch)}
	if _, err := e.TrainStep(ctx, batch, rc); err != nil { // warm-up
		return EngineFigures{}, err
	}
	start := time.Now()
	for range o.Steps {
		if _, err := e.TrainStep(ctx, batch, rc); err != nil {
			return EngineFigures{}, err
		}
	}
	secs := time.Since(start).Seconds()
	tokens := float64(o.Steps * len(batch) * len(batch[0].Tokens))
	f := EngineFigures{TrainTokensPerSec: tokens / secs, TrainFLOPS: flops * float64(o.Steps) / secs}
	if _, _, err := e.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 4}); err != nil {
		return f, err
	}
	start = time.Now()
	toks, _, err := e.Generate(ctx, prompt, engine.GenOptions{MaxTokens: o.GenTokens, Stop: nil})
	if err != nil && !errors.Is(err, context.Canceled) {
		return f, err
	}
	f.GenTokensPerSec = float64(len(toks)) / time.Since(start).Seconds()
	return f, nil
}

// Print writes the result for people.
func (r BenchResult) Print(w io.Writer) {
	fmt.Fprintf(w, "engine benchmark on %s (%.3g M parameters): train steps of %d × %d tokens (%.3g GFLOP each), greedy generation after a 16-token prompt\n",
		r.Model, float64(r.Params)/1e6, r.Seqs, r.SeqLen, r.FLOPsPerStep/1e9)
	line := func(f EngineFigures) {
		fmt.Fprintf(w, "  %-6s %-4s  train %9.1f tok/s (%7.2f GFLOP/s)   generate %7.1f tok/s\n",
			f.Engine, f.Device, f.TrainTokensPerSec, f.TrainFLOPS/1e9, f.GenTokensPerSec)
	}
	line(r.Subject)
	if b := r.Baseline; b != nil {
		line(*b)
		fmt.Fprintf(w, "  %s / %s: train %.2fx, generate %.2fx (same run, same model)\n", r.Subject.Engine, b.Engine,
			r.Subject.TrainTokensPerSec/b.TrainTokensPerSec, r.Subject.GenTokensPerSec/b.GenTokensPerSec)
	}
	if d := r.Device; d != nil {
		fmt.Fprintf(w, "  %s (%s): %s matmul %.1f TFLOP/s measured in this run; train MFU %.1f%%; peak memory %.2f GiB of %.1f\n",
			d.Name, d.Device, d.DType, d.MatmulFLOPS/1e12, 100*r.MFU, float64(d.PeakMemory)/(1<<30), float64(d.TotalMemory)/(1<<30))
	}
}
