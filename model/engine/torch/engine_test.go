package torch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/loss"
)

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var tinyCfg = native.TinyConfig(40)

// batchOf draws a training batch over tinyCfg's vocabulary.
func batchOf(r *rand.Rand, n, length int) []engine.TrainSample {
	out := make([]engine.TrainSample, n)
	for i := range out {
		s := engine.TrainSample{Tokens: make([]int, length), LossMask: make([]bool, length), Advantages: make([]float32, length)}
		adv := float32(r.NormFloat64())
		for t := range length {
			s.Tokens[t] = r.IntN(tinyCfg.VocabSize - 1)
			s.LossMask[t] = t >= length/3
			s.Advantages[t] = adv
		}
		out[i] = s
	}
	return out
}

func export(t *testing.T, e engine.Engine) map[string][]float32 {
	t.Helper()
	d := t.TempDir()
	if err := e.ExportAdapter(ctx, d); err != nil {
		t.Fatal(err)
	}
	return readAdapter(t, d)
}

// TestRestartReplay kills the worker between steps: the next call starts
// another, restores the last checkpoint, replays the steps since, and the
// adapter ends where an engine that never died ends.
func TestRestartReplay(t *testing.T) {
	py := needTorch(t)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	te, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5, CheckpointEvery: 3, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	ref, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5, CheckpointEvery: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	r := rand.New(rand.NewPCG(1, 2))
	rc := engine.Recipe{LR: 1e-2, MicroBatch: 2, Loss: loss.Config{KLCoef: 0.01}}
	for step := range 7 {
		if step == 4 || step == 6 {
			// Steps 1-3 are checkpointed, 4 (and then 5-6) are not: the
			// restart must replay what the checkpoint lacks.
			if err := syscall.Kill(te.p.hello.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-te.p.exited
		}
		b := batchOf(r, 3, 12)
		a, err := te.TrainStep(ctx, b, rc)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		want, err := ref.TrainStep(ctx, b, rc)
		if err != nil {
			t.Fatal(err)
		}
		if a != want {
			t.Fatalf("step %d: %+v after a restart, %+v without", step, a, want)
		}
	}
	if n := te.Restarts(); n != 2 {
		t.Fatalf("%d restarts, want 2", n)
	}
	cmpTensors(t, "adapter after restarts", export(t, te), export(t, ref), 0)
	out := logs.String()
	for _, want := range []string{"torch worker died; restarting it", "replayed_steps=1", "replayed_steps=0", `msg="model open"`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

// TestDiesMidRequest: a worker that dies while it holds a request (here on
// its fifth train step, after a checkpoint at the third) is restarted, its
// state restored and replayed, and the request answered, as if nothing
// happened.
func TestDiesMidRequest(t *testing.T) {
	py := needTorch(t)
	o := Options{Python: py, Seed: 5, CheckpointEvery: 3}
	o.simulateCrash = []int{int(opTrain), 5}
	te, err := OpenTiny(ctx, tinyCfg, 3, o)
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	ref, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	r := rand.New(rand.NewPCG(6, 6))
	for step := range 6 {
		b := batchOf(r, 2, 10)
		a, err := te.TrainStep(ctx, b, engine.Recipe{LR: 1e-2})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		want, err := ref.TrainStep(ctx, b, engine.Recipe{LR: 1e-2})
		if err != nil {
			t.Fatal(err)
		}
		if a != want {
			t.Fatalf("step %d: %+v, want %+v", step, a, want)
		}
	}
	if te.Restarts() != 1 {
		t.Fatalf("%d restarts, want 1", te.Restarts())
	}
	cmpTensors(t, "adapter", export(t, te), export(t, ref), 0)
}

// TestOutOfMemory: a step that does not fit (the allocator fails: the test
// hook asks it for 2^60 bytes) answers engine.ErrOutOfMemory, changes
// nothing, and the same batch in smaller micro-batches trains.
func TestOutOfMemory(t *testing.T) {
	py := needTorch(t)
	o := Options{Python: py, Seed: 5}
	o.simulateOOMTokens = 40
	te, err := OpenTiny(ctx, tinyCfg, 3, o)
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	b := batchOf(rand.New(rand.NewPCG(3, 3)), 4, 16) // 64 tokens at micro-batch 8
	before := export(t, te)
	_, err = te.TrainStep(ctx, b, engine.Recipe{})
	if !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("TrainStep: %v, want ErrOutOfMemory", err)
	}
	// The hook makes the allocator itself fail: the error is torch's own.
	if !strings.Contains(err.Error(), "can't allocate memory") {
		t.Errorf("not the CPU allocator's error: %v", err)
	}
	cmpTensors(t, "adapter after the failed step", export(t, te), before, 0)
	st, err := te.TrainStep(ctx, b, engine.Recipe{MicroBatch: 2})
	if err != nil || st.Tokens == 0 {
		t.Fatalf("micro-batch 2: %+v %v", st, err)
	}
	// The scoring pass shrinks its own groups instead of failing.
	if _, err := te.Logprobs(ctx, [][]int{b[0].Tokens, b[1].Tokens, b[2].Tokens, b[3].Tokens}, false); err != nil {
		t.Fatal(err)
	}
	if te.Restarts() != 0 {
		t.Fatalf("the worker restarted %d times", te.Restarts())
	}
	// A native engine trained on the same batch in micro-batches of 2
	// agrees: the smaller micro-batches change nothing but memory.
	ne, err := native.Open(ctx, filepath.Join(te.dir, "model"), native.Options{Name: "tiny", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ne.TrainStep(ctx, b, engine.Recipe{}); err != nil {
		t.Fatal(err)
	}
	cmpTensors(t, "adapter", export(t, te), export(t, ne), relTol)
}

func TestGenerate(t *testing.T) {
	py := needTorch(t)
	te, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	ne, err := native.NewTiny(tinyCfg, 3, native.Options{Name: "tiny", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	// A trained adapter, the same on both.
	b := batchOf(rand.New(rand.NewPCG(4, 4)), 4, 10)
	for _, e := range []engine.Engine{te, ne} {
		for range 3 {
			if _, err := e.TrainStep(ctx, b, engine.Recipe{LR: 3e-2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	prompt := []int{3, 1, 4, 1, 5, 9, 2, 6}
	type top struct {
		ids []int
		lps []float32
	}
	run := func(e engine.Engine) ([]int, []float32, []top) {
		var tops []top
		toks, lps, err := e.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 12, TopLogprobs: 3,
			OnTop: func(ids []int, lps []float32) error {
				tops = append(tops, top{append([]int(nil), ids...), append([]float32(nil), lps...)})
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		return toks, lps, tops
	}
	tt, tl, ttop := run(te)
	nt, nl, ntop := run(ne)
	if fmt.Sprint(tt) != fmt.Sprint(nt) || len(ttop) != len(ntop) {
		t.Fatalf("greedy: torch %v, native %v", tt, nt)
	}
	cmpLogprobs(t, "generated log-probs", [][]float32{tl}, [][]float32{nl}, relTol)
	for i := range ttop {
		if fmt.Sprint(ttop[i].ids) != fmt.Sprint(ntop[i].ids) {
			t.Errorf("position %d: top ids torch %v, native %v", i, ttop[i].ids, ntop[i].ids)
		}
		cmpLogprobs(t, "top log-probs", [][]float32{ttop[i].lps}, [][]float32{ntop[i].lps}, relTol)
	}

	// Sampling is reproducible from the seed and reports untempered log-probs.
	o := engine.GenOptions{MaxTokens: 10, Temperature: 1.3, TopP: 0.9, Seed: 7}
	s1, l1, err := te.Generate(ctx, prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	s2, _, err := te.Generate(ctx, prompt, o)
	if err != nil || fmt.Sprint(s1) != fmt.Sprint(s2) {
		t.Fatalf("same seed: %v and %v (%v)", s1, s2, err)
	}
	full, err := te.Logprobs(ctx, [][]int{append(append([]int(nil), prompt...), s1...)}, false)
	if err != nil {
		t.Fatal(err)
	}
	cmpLogprobs(t, "sampled tokens' log-probs", [][]float32{l1}, [][]float32{full[0][len(prompt):]}, relTol)

	// A callback's error stops generation; so does the context, without
	// killing the worker.
	pid := te.p.hello.PID
	stop := errors.New("enough")
	got, _, err := te.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 10, OnToken: func(id int, lp float32) error {
		return stop
	}})
	if !errors.Is(err, stop) || len(got) != 1 {
		t.Fatalf("stopped generation: %v, %v", got, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	got, _, err = te.Generate(cctx, prompt, engine.GenOptions{MaxTokens: 10, OnToken: func(id int, lp float32) error {
		cancel()
		return nil
	}})
	if !errors.Is(err, context.Canceled) || len(got) != 1 {
		t.Fatalf("cancelled generation: %v, %v", got, err)
	}
	if te.p == nil || te.p.hello.PID != pid || te.Restarts() != 0 {
		t.Fatalf("the worker did not survive a stopped generation")
	}
	if _, _, err := te.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
}

// TestBadInputs: inputs are refused with the shared sentinels, and the
// worker's own refusals (an adapter of another shape) map to them too.
func TestBadInputs(t *testing.T) {
	py := needTorch(t)
	te, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	if _, err := te.Logprobs(ctx, [][]int{{1, 99}}, false); !errors.Is(err, engine.ErrBadInput) {
		t.Errorf("token outside the vocabulary: %v", err)
	}
	if _, err := te.TrainStep(ctx, nil, engine.Recipe{}); !errors.Is(err, engine.ErrBadInput) {
		t.Errorf("empty batch: %v", err)
	}
	// An adapter for another model shape: the worker refuses it.
	small := filepath.Join(t.TempDir(), "model")
	if err := native.CreateTiny(small, native.Config{VocabSize: 40, Hidden: 32, Intermediate: 64, Layers: 2, Heads: 4,
		KVHeads: 2, HeadDim: 8, TiedEmbeddings: true}, 1); err != nil {
		t.Fatal(err)
	}
	ad := filepath.Join(t.TempDir(), "ad")
	smallCfg, _ := native.ReadConfig(small)
	if err := native.WriteFreshAdapter(ad, smallCfg, native.LoRAConfig{}, 1, "x"); err != nil {
		t.Fatal(err)
	}
	if err := te.LoadAdapter(ctx, ad); !errors.Is(err, engine.ErrAdapter) {
		t.Errorf("adapter of another shape: %v", err)
	}
	// A null rank_pattern is refused as PEFT would fail on it.
	good := filepath.Join(t.TempDir(), "good")
	if err := te.ExportAdapter(ctx, good); err != nil {
		t.Fatal(err)
	}
	if err := te.LoadAdapter(ctx, good); err != nil {
		t.Fatalf("own export: %v", err)
	}
	b, _ := os.ReadFile(filepath.Join(good, "adapter_config.json"))
	b = bytes.Replace(b, []byte(`"rank_pattern": {}`), []byte(`"rank_pattern": null`), 1)
	os.WriteFile(filepath.Join(good, "adapter_config.json"), b, 0o644)
	if err := te.LoadAdapter(ctx, good); !errors.Is(err, engine.ErrAdapter) || !strings.Contains(err.Error(), "rank_pattern is null") {
		t.Errorf("null rank_pattern: %v", err)
	}
	if te.Restarts() != 0 {
		t.Errorf("refusals restarted the worker")
	}
}

// TestUnavailable: without PyTorch the engine says how to get it and that
// the native engine needs none.
func TestUnavailable(t *testing.T) {
	py := needTorch(t)
	_, err := Probe(ctx, filepath.Join(t.TempDir(), "no-python"))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "--engine native") || !strings.Contains(err.Error(), "python3-torch") {
		t.Errorf("Probe of a missing Python: %v", err)
	}
	// A Python that cannot import torch (site-packages off).
	wrapper := filepath.Join(t.TempDir(), "python")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+py+" -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = Probe(ctx, wrapper)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "No module named 'torch'") ||
		!strings.Contains(err.Error(), "apt-get install python3-torch libopenblas0-pthread") {
		t.Errorf("Probe of a Python without torch (the import's own error, and how to get it): %v", err)
	}
	_, err = OpenTiny(ctx, tinyCfg, 1, Options{Python: wrapper})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "--engine native") {
		t.Errorf("Open with a Python without torch: %v", err)
	}
	_, err = OpenTiny(ctx, tinyCfg, 1, Options{Python: py, Device: "tpu"})
	if !errors.Is(err, ErrConfig) {
		t.Errorf("device tpu: %v", err)
	}
}

// TestGradCheckpoint: recomputing activations in backward changes memory,
// not the gradient.
func TestGradCheckpoint(t *testing.T) {
	py := needTorch(t)
	te, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5, GradCheckpoint: true})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	ne, err := native.NewTiny(tinyCfg, 3, native.Options{Name: "tiny", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	b := batchOf(rand.New(rand.NewPCG(5, 5)), 3, 12)
	for _, rc := range []engine.Recipe{{}, {MicroBatch: 1, Loss: loss.Config{EntropyCoef: 0.05}}} {
		// A trained adapter (B ≠ 0: every gradient non-zero), the same on both.
		if _, err := ne.TrainStep(ctx, b, engine.Recipe{LR: 1e-2}); err != nil {
			t.Fatal(err)
		}
		d := t.TempDir()
		if err := ne.ExportAdapter(ctx, d); err != nil {
			t.Fatal(err)
		}
		if err := te.LoadAdapter(ctx, d); err != nil {
			t.Fatal(err)
		}
		g, gs, err := te.Gradient(ctx, b, rc)
		if err != nil {
			t.Fatal(err)
		}
		w, ws, err := ne.Gradient(ctx, b, rc)
		if err != nil {
			t.Fatal(err)
		}
		cmpStats(t, "with checkpointing", gs, ws)
		cmpTensors(t, "gradient with checkpointing", g, w, relTol)
	}
	if _, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, DType: "bfloat16"}); !errors.Is(err, ErrConfig) {
		t.Errorf("bfloat16 on the CPU: %v", err)
	}
}

// TestDataParallel runs the worker as two processes under torchrun (gloo
// on the CPU, as NCCL would be on GPUs): each takes half of every batch,
// and the engine gives what one process gives.
func TestDataParallel(t *testing.T) {
	py := needTorch(t)
	if testing.Short() {
		t.Skip("starts torchrun with two workers")
	}
	one, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	two, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py, Seed: 5, Procs: 2, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close()
	r := rand.New(rand.NewPCG(9, 9))
	for step := range 3 {
		b := batchOf(r, 5, 8+step)
		rc := engine.Recipe{LR: 1e-2, MicroBatch: 2, Loss: loss.Config{Agg: loss.SeqMean}}
		g1, s1, err := one.Gradient(ctx, b, rc)
		if err != nil {
			t.Fatal(err)
		}
		g2, s2, err := two.Gradient(ctx, b, rc)
		if err != nil {
			t.Fatal(err)
		}
		cmpStats(t, "gradient stats", s2, s1)
		cmpTensors(t, "gradient", g2, g1, relTol)
		if _, err := one.TrainStep(ctx, b, rc); err != nil {
			t.Fatal(err)
		}
		if _, err := two.TrainStep(ctx, b, rc); err != nil {
			t.Fatal(err)
		}
	}
	cmpTensors(t, "adapter", export(t, two), export(t, one), relTol)
	seqs := [][]int{{1, 2, 3, 4}, {5, 6, 7}, {8, 9, 10, 11, 12}}
	l1, err := one.Logprobs(ctx, seqs, false)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := two.Logprobs(ctx, seqs, false)
	if err != nil {
		t.Fatal(err)
	}
	cmpLogprobs(t, "log-probs", l2, l1, relTol)
	if _, _, err := two.Generate(ctx, []int{1, 2, 3}, engine.GenOptions{MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
}

// TestDevice: the worker reports its device and measures a matmul rate on
// request (the reference bench uses for MFU on a GPU); a closed engine
// refuses.
func TestDevice(t *testing.T) {
	py := needTorch(t)
	te, err := OpenTiny(ctx, tinyCfg, 3, Options{Python: py})
	if err != nil {
		t.Fatal(err)
	}
	d, err := te.Device(ctx, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if d.Device != "cpu" || d.DType != "float32" || d.MatmulFLOPS != 0 || d.PeakMemory != 0 || d.Name != "" {
		t.Errorf("device without a measure: %+v", d)
	}
	d, err = te.Device(ctx, 128, false)
	if err != nil {
		t.Fatal(err)
	}
	if !(d.MatmulFLOPS > 0) {
		t.Errorf("device with a 128³ product: %+v", d)
	}
	if err := te.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := te.Device(ctx, 0, false); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}

// TestDataParallelOutOfMemory: under torchrun, a step that runs out of
// memory on one rank only (rank 0 holds samples 0 and 2, rank 1 sample 1),
// either one, answers engine.ErrOutOfMemory instead of leaving the other
// rank waiting in a collective, changes nothing, and smaller micro-batches
// train.
func TestDataParallelOutOfMemory(t *testing.T) {
	py := needTorch(t)
	if testing.Short() {
		t.Skip("starts torchrun with two workers")
	}
	o := Options{Python: py, Seed: 5, Procs: 2, Threads: 1}
	o.simulateOOMTokens = 24
	te, err := OpenTiny(ctx, tinyCfg, 3, o)
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	b := batchOf(rand.New(rand.NewPCG(8, 8)), 3, 16)
	before := export(t, te)
	if _, err := te.TrainStep(tctx, b, engine.Recipe{}); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("TrainStep: %v, want ErrOutOfMemory", err)
	}
	cmpTensors(t, "adapter after the failed step", export(t, te), before, 0)
	// Rank 1 alone out of memory: one long sample, rank 0's two short.
	r := rand.New(rand.NewPCG(9, 8))
	b1 := batchOf(r, 3, 8)
	b1[1] = batchOf(r, 1, 30)[0]
	if _, err := te.TrainStep(tctx, b1, engine.Recipe{}); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("TrainStep, rank 1 out of memory: %v, want ErrOutOfMemory", err)
	}
	cmpTensors(t, "adapter after the failed step on rank 1", export(t, te), before, 0)
	if st, err := te.TrainStep(tctx, b, engine.Recipe{MicroBatch: 1}); err != nil || st.Tokens == 0 {
		t.Fatalf("micro-batch 1: %+v %v", st, err)
	}
	if te.Restarts() != 0 {
		t.Fatalf("the workers restarted %d times", te.Restarts())
	}
}
