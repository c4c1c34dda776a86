package native

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/clawmesh/clawmesh/model/engine"
)

// SmallConfig is a Qwen2.5-0.5B-shaped model (hidden 896, 14 heads, 2 KV
// heads, head_dim 64, intermediate 4864, vocabulary 151936, tied) cut to
// layers layers.
func SmallConfig(layers int) Config {
	c := Config{VocabSize: 151936, Hidden: 896, Intermediate: 4864, Layers: layers, Heads: 14, KVHeads: 2,
		HeadDim: 64, RopeTheta: 1e6, RMSNormEps: 1e-6, TiedEmbeddings: true, MaxPosition: 32768,
		EOS: []int{151645}}
	c.defaults()
	return c
}

// BenchConfig configures Bench. The zero value benchmarks the tiny model.
type BenchConfig struct {
	// Model is "tiny" (TinyConfig(512), the default) or "small"
	// (SmallConfig(2)).
	Model string
	// Vocab and Layers override the model's vocabulary and depth (0: keep).
	Vocab, Layers int
	// Seqs and SeqLen shape a training batch (defaults 4 × 64).
	Seqs, SeqLen int
	// Steps is how many train steps are timed (default 2; negative: skip).
	Steps int
	// GenTokens is how many tokens are generated after a 16-token prompt
	// (default 32; negative: skip).
	GenTokens int
	// Threads bounds matmul goroutines (default GOMAXPROCS).
	Threads int
	// Now reads the clock (default time.Now).
	Now func() time.Time
}

// BenchResult reports Bench's measurements.
type BenchResult struct {
	Model   string
	Config  Config
	Threads int
	// MatmulGFLOPS is the matmul kernel's peak on this machine, measured in
	// the same run (the best of a 0.5B layer's products), the reference
	// for the figures below.
	MatmulGFLOPS float64
	// GonumGFLOPS is gonum's Sgemm (assembly kernels, all cores) on the
	// same products in the same run: an independent measure of what this
	// machine's cores reach from Go.
	GonumGFLOPS float64
	// TrainTokensPerSec counts every token of the batch; TrainGFLOPS is the
	// arithmetic the step did (forward, LM-head recompute, backward).
	TrainTokensPerSec, TrainGFLOPS float64
	// GenTokensPerSec is decoding speed with the KV cache (prompt excluded).
	GenTokensPerSec, GenGFLOPS float64
}

func (r BenchResult) String() string {
	peak := r.Peak()
	return fmt.Sprintf("%s (%d layers, hidden %d, vocab %d, %d threads): matmul %.2f GFLOP/s, gonum Sgemm %.2f; train %.1f tok/s (%.2f GFLOP/s, %.0f%% of the better); generate %.1f tok/s (%.2f GFLOP/s, %.0f%%)",
		r.Model, r.Config.Layers, r.Config.Hidden, r.Config.VocabSize, r.Threads, r.MatmulGFLOPS, r.GonumGFLOPS,
		r.TrainTokensPerSec, r.TrainGFLOPS, 100*r.TrainGFLOPS/peak,
		r.GenTokensPerSec, r.GenGFLOPS, 100*r.GenGFLOPS/peak)
}

// Peak is the reference rate: the better of the engine's matmul kernel and
// gonum's Sgemm, both measured in the same run.
func (r BenchResult) Peak() float64 {
	return max(r.MatmulGFLOPS, r.GonumGFLOPS)
}

func (c BenchConfig) withDefaults() (BenchConfig, Config, error) {
	var mc Config
	switch c.Model {
	case "", "tiny":
		c.Model = "tiny"
		mc = TinyConfig(512)
	case "small":
		mc = SmallConfig(2)
	default:
		return c, mc, fmt.Errorf("%w: unknown bench model %q", ErrConfig, c.Model)
	}
	if c.Vocab > 0 {
		mc.VocabSize = c.Vocab
		mc.EOS = []int{c.Vocab - 1}
	}
	if c.Layers > 0 {
		mc.Layers = c.Layers
	}
	if c.Seqs == 0 {
		c.Seqs = 4
	}
	if c.SeqLen == 0 {
		c.SeqLen = 64
	}
	if c.Steps == 0 {
		c.Steps = 2
	}
	if c.GenTokens == 0 {
		c.GenTokens = 32
	}
	if c.Threads == 0 {
		c.Threads = runtime.GOMAXPROCS(0)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Seqs < 0 || c.SeqLen < 2 || c.Threads < 0 {
		return c, mc, fmt.Errorf("%w: bench config %+v", ErrConfig, c)
	}
	return c, mc, mc.Validate()
}

// linearFlops is 2 × the multiply-adds of one token through every projection.
func (c Config) linearFlops() float64 {
	var n float64
	for m := module(0); m < numModules; m++ {
		out, in := c.dims(m)
		n += float64(out) * float64(in)
	}
	return 2 * n * float64(c.Layers)
}

// trainFlops counts one sequence of T tokens, trained of them in the loss,
// in a single-pass TrainStep: forward (LM head on trained rows only), the
// LM-head recompute, and backward through the frozen weights (about one
// forward's projections, twice the attention, one LM head).
func (c Config) trainFlops(T, trained int) float64 {
	attn := 2 * 2 * float64(T) * float64(T+1) / 2 * float64(c.Heads*c.HeadDim) * float64(c.Layers)
	head := 2 * float64(trained) * float64(c.Hidden) * float64(c.VocabSize)
	return 2*float64(T)*c.linearFlops() + 3*attn + 3*head
}

// Bench measures the matmul kernel, TrainStep and Generate on a random
// model; `clawmesh bench engine` prints its result.
func Bench(ctx context.Context, bc BenchConfig) (BenchResult, error) {
	bc, mc, err := bc.withDefaults()
	if err != nil {
		return BenchResult{}, err
	}
	res := BenchResult{Model: bc.Model, Config: mc, Threads: bc.Threads}
	res.MatmulGFLOPS = matmulRate(bc.Threads, bc.Now)
	res.GonumGFLOPS = gonumRate(bc.Now)
	gen := mc
	gen.EOS = nil // decode a fixed number of tokens
	e, err := NewTiny(gen, 1, Options{Threads: bc.Threads, Name: bc.Model})
	if err != nil {
		return res, err
	}
	defer e.Close()
	r := rand.New(rand.NewPCG(1, 1))
	batch := make([]engine.TrainSample, bc.Seqs)
	for i := range batch {
		s := engine.TrainSample{Tokens: make([]int, bc.SeqLen), LossMask: make([]bool, bc.SeqLen), Advantages: make([]float32, bc.SeqLen)}
		for t := range s.Tokens {
			s.Tokens[t] = r.IntN(mc.VocabSize)
			s.LossMask[t] = t >= bc.SeqLen/2 // a prompt, then the trained reply
			s.Advantages[t] = float32(i%2*2 - 1)
		}
		batch[i] = s
	}
	rc := engine.Recipe{MicroBatch: bc.Seqs}
	if bc.Steps > 0 {
		t0 := bc.Now()
		for range bc.Steps {
			if _, err := e.TrainStep(ctx, batch, rc); err != nil {
				return res, err
			}
		}
		sec := bc.Now().Sub(t0).Seconds()
		toks := float64(bc.Steps * bc.Seqs * bc.SeqLen)
		res.TrainTokensPerSec = toks / sec
		res.TrainGFLOPS = float64(bc.Steps*bc.Seqs) * mc.trainFlops(bc.SeqLen, bc.SeqLen-bc.SeqLen/2) / sec / 1e9
	}
	if bc.GenTokens > 0 {
		prompt := make([]int, 16)
		for i := range prompt {
			prompt[i] = r.IntN(mc.VocabSize)
		}
		var tFirst time.Time
		n := 0
		_, _, err := e.Generate(ctx, prompt, engine.GenOptions{MaxTokens: bc.GenTokens + 1, OnToken: func(int, float32) error {
			if n == 0 {
				tFirst = bc.Now() // the first token includes the prompt's prefill
			}
			n++
			return nil
		}})
		if err != nil {
			return res, err
		}
		sec := bc.Now().Sub(tFirst).Seconds()
		res.GenTokensPerSec = float64(n-1) / sec
		var fl float64
		for p := len(prompt) + 1; p < len(prompt)+n; p++ {
			fl += mc.linearFlops() + 2*2*float64(p+1)*float64(mc.Heads*mc.HeadDim)*float64(mc.Layers) + 2*float64(mc.Hidden)*float64(mc.VocabSize)
		}
		res.GenGFLOPS = fl / sec / 1e9
	}
	return res, nil
}

// matmulRate is the matmul kernel's peak here: the best rate of the forward
// kernel over the products a 0.5B-shaped layer does (attention projections
// and the MLP's up and down), 256 rows each.
func matmulRate(par int, now func() time.Time) float64 {
	best := 0.0
	for _, s := range [][3]int{{256, 896, 896}, {256, 4864, 896}, {256, 896, 4864}} {
		m, n, k := s[0], s[1], s[2]
		r := rand.New(rand.NewPCG(2, 2))
		a, b, c := randVec(r, m*k), randVec(r, n*k), make([]float32, m*n)
		gemmNT(c, a, b, m, n, k, par, false) // warm up
		const reps = 3
		t0 := now()
		for range reps {
			gemmNT(c, a, b, m, n, k, par, false)
		}
		best = max(best, reps*2*float64(m*n*k)/now().Sub(t0).Seconds()/1e9)
	}
	return best
}

// gonumRate is gonum's Sgemm on the products matmulRate measures, C = A·Bᵀ
// as the engine computes them.
func gonumRate(now func() time.Time) float64 {
	var impl gonum.Implementation
	best := 0.0
	for _, s := range [][3]int{{256, 896, 896}, {256, 4864, 896}, {256, 896, 4864}} {
		m, n, k := s[0], s[1], s[2]
		r := rand.New(rand.NewPCG(2, 2))
		a, b, c := randVec(r, m*k), randVec(r, n*k), make([]float32, m*n)
		impl.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, k, b, k, 0, c, n) // warm up
		const reps = 3
		t0 := now()
		for range reps {
			impl.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, k, b, k, 0, c, n)
		}
		best = max(best, reps*2*float64(m*n*k)/now().Sub(t0).Seconds()/1e9)
	}
	return best
}

func randVec(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}
