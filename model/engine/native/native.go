// Package native is clawmesh's pure-Go model engine: a Qwen3-shaped decoder
// (RMSNorm, grouped-query attention with per-head q/k RMSNorm and RoPE,
// SwiGLU MLP, tied or untied LM head) in float32 on the CPU, with LoRA
// adapters on the seven projections, exact backward passes for the adapter
// parameters, and AdamW. It loads HF model directories (config.json +
// safetensors, F32/BF16/F16), reads and writes adapters in PEFT format, and
// samples with a KV cache. It is meant for small models: tests, the demo,
// and trainer peers without a GPU.
package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

// Sentinel errors. Closed engines and bad inputs report the shared
// engine.ErrClosed, engine.ErrBadInput and engine.ErrAdapter.
var (
	ErrConfig = errors.New("native: bad model config")
	ErrModel  = errors.New("native: bad model weights")
)

// Options configure an Engine. The zero value means defaults.
type Options struct {
	// Name is reported by Info and written as the adapter's
	// base_model_name_or_path, which transformers' and PEFT's Auto classes
	// load: a Hugging Face model id or a model directory (default: the
	// model directory as an absolute path, or "tiny").
	Name string
	// LoRA shapes the adapter (default rank 8, alpha 16, all projections).
	LoRA LoRAConfig
	// Seed draws the adapter's initial A matrices; ResetAdapter draws anew
	// from Seed and a reset counter.
	Seed uint64
	// Threads bounds the goroutines a matrix product uses (default
	// runtime.GOMAXPROCS(0)).
	Threads int
	// Logger receives debug logs (nil: discard).
	Logger *slog.Logger
}

func (o Options) validate() (Options, error) {
	o.LoRA = o.LoRA.withDefaults()
	if err := o.LoRA.validate(); err != nil {
		return o, err
	}
	if o.Threads < 0 {
		return o, fmt.Errorf("%w: threads %d", ErrConfig, o.Threads)
	}
	if o.Threads == 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o, nil
}

// Engine is the native engine. It implements engine.Engine, engine.Forker
// and engine.Merger.
type Engine struct {
	opt Options
	w   *weights // frozen, shared with forks
	log *slog.Logger

	mu     sync.RWMutex
	ad     *adapter
	adam   adamState
	resets uint64
	closed bool
}

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Forker = (*Engine)(nil)
	_ engine.Merger = (*Engine)(nil)
)

// Open loads the HF model directory dir.
func Open(ctx context.Context, dir string, o Options) (*Engine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = dir
		if abs, err := filepath.Abs(dir); err == nil {
			o.Name = abs
		}
	}
	w, err := loadDir(dir)
	if err != nil {
		return nil, err
	}
	return newEngine(w, o)
}

// NewTiny builds an engine on a random model of shape cfg (see TinyConfig)
// drawn from seed, without touching disk. The model equals the one
// CreateTiny writes for the same cfg and seed.
func NewTiny(cfg Config, seed uint64, o Options) (*Engine, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = "tiny"
	}
	return newEngine(randomWeights(cfg, seed), o)
}

func newEngine(w *weights, o Options) (*Engine, error) {
	o, err := o.validate()
	if err != nil {
		return nil, err
	}
	e := &Engine{opt: o, w: w, log: o.Logger.With("component", "engine/native")}
	e.ad = newAdapter(w.cfg, o.LoRA)
	e.ad.init(o.Seed)
	return e, nil
}

func (e *Engine) runner(base bool) *runner {
	r := &runner{w: e.w, ad: e.ad, par: e.opt.Threads}
	if !base {
		r.params = e.ad.params
	}
	return r
}

// Info describes the model.
func (e *Engine) Info() engine.ModelInfo {
	e.mu.RLock()
	defer e.mu.RUnlock()
	c := e.w.cfg
	var n int64
	for _, s := range c.tensorShapes() {
		k := int64(1)
		for _, d := range s {
			k *= int64(d)
		}
		n += k
	}
	return engine.ModelInfo{Name: e.opt.Name, Arch: c.Arch, VocabSize: c.VocabSize, Layers: c.Layers,
		Hidden: c.Hidden, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Intermediate: c.Intermediate,
		MaxPosition: c.MaxPosition, TiedEmbeddings: c.TiedEmbeddings, EOS: slices.Clone(c.EOS),
		Params: n, LoRAParams: int64(len(e.ad.params)), LoRARank: e.ad.rank, LoRAAlpha: e.ad.alpha}
}

func (e *Engine) checkSeq(toks []int) error {
	if len(toks) > e.w.cfg.MaxPosition {
		return fmt.Errorf("%w: %d tokens beyond max position %d", engine.ErrBadInput, len(toks), e.w.cfg.MaxPosition)
	}
	return engine.CheckTokens(toks, e.w.cfg.VocabSize)
}

// Logprobs implements engine.Engine.
func (e *Engine) Logprobs(ctx context.Context, seqs [][]int, base bool) ([][]float32, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, engine.ErrClosed
	}
	for _, s := range seqs {
		if err := e.checkSeq(s); err != nil {
			return nil, err
		}
	}
	out := make([][]float32, len(seqs))
	r, workers := e.seqRunner(base, len(seqs))
	err := forEach(ctx, len(seqs), workers, func(i, _ int) {
		s := seqs[i]
		out[i] = make([]float32, len(s))
		if len(s) < 2 {
			return
		}
		lp := make([]float64, len(s))
		r.logprobs(r.forward(s, false), lp, nil, nil)
		for t, v := range lp {
			out[i][t] = float32(v)
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// seqRunner splits the engine's threads between n sequences run at once:
// small models gain from running sequences side by side, large ones from
// threads inside each product; both are used.
func (e *Engine) seqRunner(base bool, n int) (*runner, int) {
	r := e.runner(base)
	workers := max(1, min(n, r.par))
	r.par = max(1, r.par/workers)
	return r, workers
}

// forEach runs fn(i, worker) for i in [0, n) on workers goroutines, worker
// w taking i = w, w+workers, ... in order, so that what each worker sums
// does not depend on scheduling. It stops early, returning ctx.Err(), when
// ctx ends.
func forEach(ctx context.Context, n, workers int, fn func(i, worker int)) error {
	var wg sync.WaitGroup
	for w := range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n && ctx.Err() == nil; i += workers {
				fn(i, w)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// TrainStep implements engine.Engine: one AdamW step on the LoRA parameters
// of the clipped surrogate (model/loss) over the whole batch. When the
// batch exceeds one micro-batch, a first pass computes every log-prob for
// the loss and a second recomputes activations micro-batch by micro-batch.
func (e *Engine) TrainStep(ctx context.Context, batch []engine.TrainSample, rc engine.Recipe) (engine.StepStats, error) {
	if err := rc.Validate(); err != nil {
		return engine.StepStats{}, err
	}
	rc = rc.WithDefaults()
	e.mu.Lock()
	defer e.mu.Unlock()
	grad, st, err := e.gradient(ctx, batch, rc)
	if err != nil {
		return st, err
	}
	if rc.MaxGradNorm > 0 && st.GradNorm > rc.MaxGradNorm {
		s := float32(rc.MaxGradNorm / st.GradNorm)
		for i := range grad {
			grad[i] *= s
		}
	}
	e.adam.step(e.ad.params, grad, rc)
	e.log.Debug("train step", "loss", st.Loss, "grad_norm", st.GradNorm, "tokens", st.Tokens)
	return st, nil
}

// Gradient returns the gradient TrainStep would apply for batch and rc,
// before clipping, by PEFT tensor name (row-major, as the adapter's
// safetensors hold them), with the step's statistics; it changes nothing.
// Other engines are checked against it.
func (e *Engine) Gradient(ctx context.Context, batch []engine.TrainSample, rc engine.Recipe) (map[string][]float32, engine.StepStats, error) {
	if err := rc.Validate(); err != nil {
		return nil, engine.StepStats{}, err
	}
	rc = rc.WithDefaults()
	e.mu.RLock()
	defer e.mu.RUnlock()
	grad, st, err := e.gradient(ctx, batch, rc)
	if err != nil {
		return nil, st, err
	}
	out := map[string][]float32{}
	for l := range e.ad.slots {
		for m := module(0); m < numModules; m++ {
			if e.ad.slots[l][m].on {
				out[tensorName(l, m, "A")] = slices.Clone(e.ad.A(grad, l, m))
				out[tensorName(l, m, "B")] = slices.Clone(e.ad.B(grad, l, m))
			}
		}
	}
	return out, st, nil
}

// gradient computes the unclipped gradient of the surrogate over batch (rc
// with defaults) in the adapter's flat layout. A non-finite norm is an
// error. The caller holds e.mu.
func (e *Engine) gradient(ctx context.Context, batch []engine.TrainSample, rc engine.Recipe) ([]float32, engine.StepStats, error) {
	if e.closed {
		return nil, engine.StepStats{}, engine.ErrClosed
	}
	if len(batch) == 0 {
		return nil, engine.StepStats{}, fmt.Errorf("%w: empty batch", engine.ErrBadInput)
	}
	for i, s := range batch {
		if err := s.Validate(e.w.cfg.VocabSize); err != nil {
			return nil, engine.StepStats{}, fmt.Errorf("sample %d: %w", i, err)
		}
		if err := e.checkSeq(s.Tokens); err != nil {
			return nil, engine.StepStats{}, fmt.Errorf("sample %d: %w", i, err)
		}
	}
	r, workers := e.seqRunner(false, min(len(batch), rc.MicroBatch))
	wantEnt := rc.Loss.EntropyCoef != 0
	seqs := make([]loss.Seq, len(batch))
	onePass := len(batch) <= rc.MicroBatch
	acts := make([]*seqActs, len(batch))
	err := forEach(ctx, len(batch), workers, func(i, _ int) {
		s := batch[i]
		sa := r.forward(s.Tokens, onePass)
		lp := make([]float64, len(s.Tokens))
		var ent []float64
		if wantEnt {
			ent = make([]float64, len(s.Tokens))
		}
		// Only trained positions need the LM head.
		r.logprobs(sa, lp, ent, maskFrom(s.LossMask))
		if onePass {
			acts[i] = sa
		}
		seqs[i] = loss.Seq{NewLogp: lp, OldLogp: widen(s.OldLogprobs), Adv: widen(s.Advantages),
			Mask: maskFrom(s.LossMask), RefLogp: widen(s.RefLogprobs), Entropy: ent}
		if s.OldLogprobs == nil {
			seqs[i].OldLogp = slices.Clone(lp)
		}
	})
	if err != nil {
		return nil, engine.StepStats{}, err
	}
	res := loss.Surrogate(seqs, rc.Loss)
	// Backward, micro-batch by micro-batch; each worker sums into its own
	// gradient buffer.
	grads := make([][]float32, workers)
	for w := range grads {
		grads[w] = make([]float32, len(e.ad.params))
	}
	for lo := 0; lo < len(batch); lo += rc.MicroBatch {
		hi := min(lo+rc.MicroBatch, len(batch))
		err := forEach(ctx, hi-lo, workers, func(j, w int) {
			i := lo + j
			if allZero(res.DNewLogp[i]) && allZero(res.DEntropy[i]) {
				acts[i] = nil
				return
			}
			sa := acts[i]
			acts[i] = nil
			if sa == nil {
				sa = r.forward(batch[i].Tokens, true)
				r.logprobs(sa, make([]float64, len(batch[i].Tokens)), nil, maskFrom(batch[i].LossMask))
			}
			r.backward(sa, res.DNewLogp[i], res.DEntropy[i], seqs[i].Entropy, grads[w])
		})
		if err != nil {
			return nil, engine.StepStats{}, err
		}
	}
	grad := grads[0]
	for _, g := range grads[1:] {
		for i, v := range g {
			grad[i] += v
		}
	}
	norm := l2(grad)
	st := engine.StepStats{Loss: res.Loss, GradNorm: norm, ClipFrac: res.ClipFrac, KL: res.KL,
		Entropy: res.Entropy, Tokens: res.Tokens}
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return nil, st, fmt.Errorf("%w: gradient norm %v", engine.ErrBadInput, norm)
	}
	return grad, st, nil
}

func widen(v []float32) []float64 {
	if v == nil {
		return nil
	}
	o := make([]float64, len(v))
	for i, x := range v {
		o[i] = float64(x)
	}
	return o
}

// maskFrom copies the mask; position 0 has no context and is never trained.
func maskFrom(m []bool) []bool {
	o := slices.Clone(m)
	if len(o) > 0 {
		o[0] = false
	}
	return o
}

func allZero(v []float64) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

func l2(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// adamState is AdamW's moment estimates over the adapter's flat vector.
type adamState struct {
	m, v []float32
	t    int
}

// step applies one AdamW update (decoupled weight decay) to p.
func (a *adamState) step(p, g []float32, rc engine.Recipe) {
	if len(a.m) != len(p) {
		a.m, a.v, a.t = make([]float32, len(p)), make([]float32, len(p)), 0
	}
	a.t++
	b1, b2 := rc.Beta1, rc.Beta2
	c1 := 1 - math.Pow(b1, float64(a.t))
	c2 := 1 - math.Pow(b2, float64(a.t))
	lr, wd, eps := rc.LR, rc.WeightDecay, rc.Eps
	for i, gi := range g {
		m := b1*float64(a.m[i]) + (1-b1)*float64(gi)
		v := b2*float64(a.v[i]) + (1-b2)*float64(gi)*float64(gi)
		a.m[i], a.v[i] = float32(m), float32(v)
		x := float64(p[i])
		x -= lr * (m/c1/(math.Sqrt(v/c2)+eps) + wd*x)
		p[i] = float32(x)
	}
}

// Generate implements engine.Engine with a KV cache.
func (e *Engine) Generate(ctx context.Context, prompt []int, o engine.GenOptions) ([]int, []float32, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, nil, engine.ErrClosed
	}
	c := e.w.cfg
	if len(prompt) == 0 {
		return nil, nil, fmt.Errorf("%w: empty prompt", engine.ErrBadInput)
	}
	if err := e.checkSeq(prompt); err != nil {
		return nil, nil, err
	}
	if o.MaxTokens == 0 {
		o.MaxTokens = 256
	}
	if o.MaxTokens < 0 || o.Temperature < 0 || o.TopP < 0 || o.TopP > 1 || o.TopLogprobs < 0 || o.TopLogprobs > engine.MaxTopLogprobs {
		return nil, nil, fmt.Errorf("%w: generation options %+v", engine.ErrBadInput, o)
	}
	n := min(o.MaxTokens, c.MaxPosition-len(prompt))
	if n <= 0 {
		return nil, nil, fmt.Errorf("%w: prompt of %d fills the context", engine.ErrBadInput, len(prompt))
	}
	stop := map[int]bool{}
	for _, s := range append(slices.Clone(c.EOS), o.Stop...) {
		stop[s] = true
	}
	r := e.runner(false)
	kc := newKVCache(c, len(prompt)+n)
	logits := make([]float32, c.VocabSize)
	rng := rand.New(rand.NewPCG(o.Seed, 0xda3e39cb94b95bdb))
	var toks, topIDs []int
	var lps, topLps []float32
	next := prompt
	for len(toks) < n {
		if err := ctx.Err(); err != nil {
			return toks, lps, err
		}
		r.step(next, kc, logits)
		if o.TopLogprobs > 0 && o.OnTop != nil {
			topIDs, topLps = topLogprobs(logits, o.TopLogprobs, topIDs[:0], topLps[:0])
			if err := o.OnTop(topIDs, topLps); err != nil {
				return toks, lps, err
			}
		}
		id, lp := sample(logits, o.Temperature, o.TopP, rng)
		toks = append(toks, id)
		lps = append(lps, lp)
		if o.OnToken != nil {
			if err := o.OnToken(id, lp); err != nil {
				return toks, lps, err
			}
		}
		if stop[id] {
			break
		}
		next = []int{id}
	}
	return toks, lps, nil
}

// topLogprobs appends to ids and lps the k most likely tokens of logits z
// (ties: the lower id first) and their log-probs, most likely first.
func topLogprobs(z []float32, k int, ids []int, lps []float32) ([]int, []float32) {
	k = min(k, len(z))
	// Insertion into a sorted list of k: k is at most 20.
	for i, v := range z {
		if len(ids) == k && v <= z[ids[k-1]] {
			continue
		}
		j := len(ids)
		if j < k {
			ids = append(ids, 0)
		} else {
			j = k - 1
		}
		for j > 0 && z[ids[j-1]] < v {
			ids[j] = ids[j-1]
			j--
		}
		ids[j] = i
	}
	lse, _ := logSoftmaxRow(z) // as sample computes the chosen token's
	for _, id := range ids {
		lps = append(lps, float32(float64(z[id])-lse))
	}
	return ids, lps
}

// sample picks a token from logits and returns it with its log-prob under
// the untempered distribution.
func sample(z []float32, temp, topP float64, rng *rand.Rand) (int, float32) {
	lse, _ := logSoftmaxRow(z)
	best := 0
	for i, v := range z {
		if v > z[best] {
			best = i
		}
	}
	if temp == 0 {
		return best, float32(float64(z[best]) - lse)
	}
	// Tempered probabilities, max-subtracted, in float64.
	p := make([]float64, len(z))
	var sum float64
	for i, v := range z {
		p[i] = math.Exp((float64(v) - float64(z[best])) / temp)
		sum += p[i]
	}
	idx := make([]int, 0, len(z))
	if topP > 0 && topP < 1 {
		order := make([]int, len(z))
		for i := range order {
			order[i] = i
		}
		sort.Slice(order, func(a, b int) bool { return p[order[a]] > p[order[b]] })
		var acc float64
		for _, i := range order {
			idx = append(idx, i)
			acc += p[i] / sum
			if acc >= topP {
				break
			}
		}
	} else {
		for i := range z {
			idx = append(idx, i)
		}
	}
	var tot float64
	for _, i := range idx {
		tot += p[i]
	}
	u := rng.Float64() * tot
	pick := idx[len(idx)-1]
	for _, i := range idx {
		u -= p[i]
		if u < 0 {
			pick = i
			break
		}
	}
	return pick, float32(float64(z[pick]) - lse)
}

// ExportAdapter implements engine.Engine.
func (e *Engine) ExportAdapter(ctx context.Context, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return engine.ErrClosed
	}
	return e.ad.export(dir, e.opt.Name)
}

// LoadAdapter implements engine.Engine.
func (e *Engine) LoadAdapter(ctx context.Context, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ad, err := loadAdapter(dir, e.w.cfg)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	e.ad, e.adam = ad, adamState{}
	return nil
}

// ResetAdapter implements engine.Engine.
func (e *Engine) ResetAdapter() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	e.resets++
	ad := newAdapter(e.w.cfg, e.opt.LoRA)
	ad.init(ResetSeed(e.opt.Seed, e.resets))
	e.ad, e.adam = ad, adamState{}
	return nil
}

// ResetSeed is the seed the resets-th ResetAdapter draws a fresh adapter
// from, for an engine opened with Options.Seed seed (reset 0 is the adapter
// an engine starts with): other engines reproduce the native engine's
// adapters with it and WriteFreshAdapter.
func ResetSeed(seed, resets uint64) uint64 { return seed + resets*0x9e3779b97f4a7c15 }

// Fork implements engine.Forker: the fork shares the base weights and
// starts from a copy of the adapter with fresh optimizer state.
func (e *Engine) Fork() (engine.Engine, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, engine.ErrClosed
	}
	return &Engine{opt: e.opt, w: e.w, log: e.log, ad: e.ad.clone(), resets: e.resets}, nil
}

// MergeAdapter implements engine.Merger, as PEFT's merge_and_unload: it
// returns a new engine whose frozen base model is e's policy, every adapted
// projection W replaced by W + s·B·A (summed in float64), with a fresh
// adapter (so its policy starts equal to its base) drawn from the same
// Options.Seed. e is unchanged; the new engine shares the weights the
// adapter does not touch (embeddings, norms, unadapted projections) and is
// named Options.Name + "+merged".
func (e *Engine) MergeAdapter() (engine.Engine, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, engine.ErrClosed
	}
	o := e.opt
	o.Name += "+merged"
	return newEngine(e.w.merge(e.ad), o)
}

// SaveModel writes e's frozen base model (not its adapter) to dir as a
// Hugging Face model directory, config.json and model.safetensors in
// float32, that Open loads back. With MergeAdapter it turns a trained
// adapter into a base model of its own.
func (e *Engine) SaveModel(dir string) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return engine.ErrClosed
	}
	return e.w.save(dir, safetensors.F32)
}

// Close implements engine.Engine; later calls report engine.ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}
