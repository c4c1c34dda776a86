package torch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
)

// Sentinel errors. Bad inputs, bad adapters and out-of-memory report the
// shared engine.ErrBadInput, engine.ErrAdapter and engine.ErrOutOfMemory.
var (
	ErrUnavailable = errors.New("torch: PyTorch not available")
	ErrWorker      = errors.New("torch: worker failed")
	ErrProtocol    = errors.New("torch: protocol error")
	ErrModel       = errors.New("torch: bad model")
	ErrConfig      = errors.New("torch: bad options")
)

// Devices.
const (
	DeviceCPU  = "cpu"
	DeviceCUDA = "cuda"
)

// Options configure an Engine. The zero value means defaults.
type Options struct {
	// Python is the interpreter (default: the first of Candidates that
	// imports torch).
	Python string
	// Device is cpu (default) or cuda.
	Device string
	// Procs is how many worker processes train together, one per GPU
	// (default 1). More than one launches the worker with torchrun
	// (torch.distributed, data-parallel: NCCL on GPUs, gloo on the CPU);
	// the engine still acts as one.
	Procs int
	// DType is the base weights' dtype: float32, bfloat16 or float16
	// (default float32 on the CPU, bfloat16 on CUDA, where the forward
	// runs under autocast; LoRA parameters are always float32).
	DType string
	// GradCheckpoint recomputes each layer's activations in backward
	// instead of keeping them (less memory, about a third more compute).
	GradCheckpoint bool
	// LoRA shapes the adapter (native.LoRAConfig's defaults).
	LoRA native.LoRAConfig
	// Seed draws the adapter's initial A matrices exactly as the native
	// engine does (native.WriteFreshAdapter with native.ResetSeed), so both
	// engines start from the same adapter.
	Seed uint64
	// Name is reported by Info and written as the adapter's
	// base_model_name_or_path (default: the model directory's absolute
	// path).
	Name string
	// Threads bounds torch's CPU threads (0: torch's default).
	Threads int
	// CheckpointEvery bounds the train steps replayed after a restart: the
	// worker saves the adapter and the optimizer state every this many
	// steps (default 16).
	CheckpointEvery int
	// MaxRestarts bounds the restarts one call may make when the worker
	// dies (default 2).
	MaxRestarts int
	// StartTimeout bounds the wait for a starting worker to connect
	// (default 2 minutes; loading the model comes after and is bounded by
	// the caller's context).
	StartTimeout time.Duration
	// Logger receives the worker's logs and the engine's (nil: discard).
	Logger *slog.Logger

	// simulateOOMTokens, in tests, has the worker fail as out of memory on
	// a micro-batch of more than this many (padded) tokens; simulateCrash
	// {op, n} has the first worker exit on its n-th request of that op.
	simulateOOMTokens int
	simulateCrash     []int
}

func (o Options) validate() (Options, error) {
	if o.Device == "" {
		o.Device = DeviceCPU
	}
	if o.Device != DeviceCPU && o.Device != DeviceCUDA {
		return o, fmt.Errorf("%w: device %q (cpu or cuda)", ErrConfig, o.Device)
	}
	switch o.DType {
	case "", "float32":
	case "bfloat16", "float16":
		if o.Device != DeviceCUDA {
			return o, fmt.Errorf("%w: dtype %s needs device cuda (the CPU runs float32)", ErrConfig, o.DType)
		}
	default:
		return o, fmt.Errorf("%w: dtype %q (float32, bfloat16 or float16)", ErrConfig, o.DType)
	}
	if o.Procs == 0 {
		o.Procs = 1
	}
	if o.Procs < 0 || o.Procs > 64 || o.Threads < 0 || o.CheckpointEvery < 0 || o.MaxRestarts < 0 {
		return o, fmt.Errorf("%w: procs %d, threads %d, checkpoint every %d, restarts %d", ErrConfig, o.Procs, o.Threads, o.CheckpointEvery, o.MaxRestarts)
	}
	if o.CheckpointEvery == 0 {
		o.CheckpointEvery = 16
	}
	if o.MaxRestarts == 0 {
		o.MaxRestarts = 2
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o, nil
}

// Engine is the torch engine: the Go side of a worker process that holds
// the model. It implements engine.Engine. Calls are serialised (one
// request to the worker at a time). A worker that dies is restarted on the
// next call, its adapter and optimizer restored from the last checkpoint
// and the train steps since replayed; a call cancelled by its context
// kills the worker (the next call restarts it), except generation, which
// stops at the next token.
type Engine struct {
	opt      Options
	modelDir string
	dir      string // state: Python sources, socket, checkpoints
	py       string // PYTHONPATH
	log      *slog.Logger
	info     engine.ModelInfo
	cfg      native.Config

	mu       sync.Mutex
	p        *proc
	ckpt     string   // last checkpoint directory
	ckpts    int      // checkpoints made (names them)
	replay   [][]byte // TRAIN frames since ckpt, encoded
	resets   uint64
	restarts int // over the engine's life
	closed   bool
}

var _ engine.Engine = (*Engine)(nil)

// Open starts a worker on the HF model directory modelDir.
func Open(ctx context.Context, modelDir string, o Options) (*Engine, error) {
	return open(ctx, modelDir, "", o)
}

// OpenTiny starts a worker on the random model native.NewTiny builds for
// cfg and seed (written to the engine's state directory), named "tiny"
// unless o names it.
func OpenTiny(ctx context.Context, cfg native.Config, seed uint64, o Options) (*Engine, error) {
	dir, err := os.MkdirTemp("", "clawmesh-torch-")
	if err != nil {
		return nil, err
	}
	model := filepath.Join(dir, "model")
	if err := native.CreateTiny(model, cfg, seed); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if o.Name == "" {
		o.Name = "tiny"
	}
	return open(ctx, model, dir, o)
}

func open(ctx context.Context, modelDir, dir string, o Options) (_ *Engine, err error) {
	if dir == "" {
		if dir, err = os.MkdirTemp("", "clawmesh-torch-"); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if o, err = o.validate(); err != nil {
		return nil, err
	}
	cfg, err := native.ReadConfig(modelDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrModel, err)
	}
	if o.Name == "" {
		o.Name = modelDir
		if abs, err := filepath.Abs(modelDir); err == nil {
			o.Name = abs
		}
	}
	if abs, err := filepath.Abs(modelDir); err == nil {
		modelDir = abs
	}
	if o.Python == "" {
		env, err := Probe(ctx, "")
		if err != nil {
			return nil, err
		}
		o.Python = env.Python
	} else if p, err := exec.LookPath(o.Python); err != nil {
		return nil, fmt.Errorf("%w: %s not found; %s", ErrUnavailable, o.Python, HowToInstall)
	} else {
		o.Python = p
	}
	py, err := writeWorker(filepath.Join(dir, "py"))
	if err != nil {
		return nil, err
	}
	e := &Engine{opt: o, modelDir: modelDir, dir: dir, py: py, cfg: cfg,
		log: o.Logger.With("component", "engine/torch")}
	if err := e.start(ctx); err != nil {
		return nil, err
	}
	// Start from the native engine's fresh adapter for this seed.
	if err := e.loadFresh(ctx); err != nil {
		e.p.kill()
		return nil, err
	}
	return e, nil
}

type openMeta struct {
	ModelDir          string   `json:"model_dir"`
	Device            string   `json:"device"`
	DType             string   `json:"dtype,omitempty"`
	GradCheckpoint    bool     `json:"grad_checkpoint"`
	LoRA              loraMeta `json:"lora"`
	Seed              uint64   `json:"seed"`
	Name              string   `json:"name"`
	Threads           int      `json:"threads,omitempty"`
	SimulateOOMTokens int      `json:"simulate_oom_tokens,omitempty"`
	SimulateCrash     []int    `json:"simulate_crash,omitempty"`
}

type loraMeta struct {
	Rank    int      `json:"rank"`
	Alpha   float64  `json:"alpha"`
	Targets []string `json:"targets,omitempty"`
}

type infoMeta struct {
	Name           string  `json:"name"`
	Arch           string  `json:"arch"`
	VocabSize      int     `json:"vocab_size"`
	Layers         int     `json:"layers"`
	Hidden         int     `json:"hidden"`
	Heads          int     `json:"heads"`
	KVHeads        int     `json:"kv_heads"`
	HeadDim        int     `json:"head_dim"`
	Intermediate   int     `json:"intermediate"`
	MaxPosition    int     `json:"max_position"`
	TiedEmbeddings bool    `json:"tied_embeddings"`
	EOS            []int   `json:"eos"`
	Params         int64   `json:"params"`
	LoRAParams     int64   `json:"lora_params"`
	LoRARank       int     `json:"lora_rank"`
	LoRAAlpha      float64 `json:"lora_alpha"`
	Device         string  `json:"device"`
	DType          string  `json:"dtype"`
	Torch          string  `json:"torch"`
	WorldSize      int     `json:"world_size"`
}

// start starts a worker and opens the model in it (e.mu held or not yet
// shared).
func (e *Engine) start(ctx context.Context) error {
	p, err := startProc(ctx, &e.opt, e.py, e.dir, e.log)
	if err != nil {
		if strings.Contains(err.Error(), "No module named 'torch'") {
			return fmt.Errorf("%w: %s cannot import torch; %s", ErrUnavailable, e.opt.Python, HowToInstall)
		}
		return err
	}
	if h := p.hello; e.opt.Device == DeviceCUDA && (!h.CUDA || e.opt.Procs > h.GPUs) {
		p.kill()
		if !h.CUDA {
			return fmt.Errorf("%w: torch %s at %s sees no CUDA device; use --device cpu, or install a CUDA build of PyTorch", ErrUnavailable, h.Torch, e.opt.Python)
		}
		return fmt.Errorf("%w: %d GPUs asked for, torch sees %d", ErrConfig, e.opt.Procs, h.GPUs)
	}
	lc := e.opt.LoRA
	if lc.Rank == 0 {
		lc.Rank = 8
	}
	if lc.Alpha == 0 {
		lc.Alpha = 2 * float64(lc.Rank)
	}
	m := openMeta{ModelDir: e.modelDir, Device: e.opt.Device, DType: e.opt.DType, GradCheckpoint: e.opt.GradCheckpoint,
		LoRA: loraMeta{Rank: lc.Rank, Alpha: lc.Alpha, Targets: lc.Targets}, Seed: e.opt.Seed, Name: e.opt.Name,
		Threads: e.opt.Threads, SimulateOOMTokens: e.opt.simulateOOMTokens}
	if e.restarts == 0 {
		m.SimulateCrash = e.opt.simulateCrash
	}
	rep, err := p.call(ctx, &frame{op: opOpen, meta: metaOf(m)}, nil)
	if err != nil {
		p.kill()
		return err
	}
	im, err := e.setInfo(rep)
	if err != nil {
		p.kill()
		return err
	}
	e.p = p
	e.log.Info("torch worker ready", "model", im.Name, "device", im.Device, "dtype", im.DType, "torch", im.Torch,
		"processes", im.WorldSize, "params", im.Params, "lora_params", im.LoRAParams)
	return nil
}

// setInfo takes the model's description from a reply that carries it
// (opening the model, loading or restoring an adapter).
func (e *Engine) setInfo(rep *frame) (infoMeta, error) {
	var im infoMeta
	if err := json.Unmarshal(rep.meta, &im); err != nil || im.VocabSize <= 0 {
		return im, fmt.Errorf("%w: model description: %v", ErrProtocol, err)
	}
	e.info = engine.ModelInfo{Name: im.Name, Arch: im.Arch, VocabSize: im.VocabSize, Layers: im.Layers, Hidden: im.Hidden,
		Heads: im.Heads, KVHeads: im.KVHeads, HeadDim: im.HeadDim, Intermediate: im.Intermediate, MaxPosition: im.MaxPosition,
		TiedEmbeddings: im.TiedEmbeddings, EOS: im.EOS, Params: im.Params, LoRAParams: im.LoRAParams, LoRARank: im.LoRARank,
		LoRAAlpha: im.LoRAAlpha}
	return im, nil
}

// call sends req and waits for its RESULT, handing TOKEN events to onToken
// (which answers whether to go on). An ERROR reply maps to the shared
// sentinels.
func (p *proc) call(ctx context.Context, req *frame, onToken func(*frame) bool) (*frame, error) {
	p.nextID++
	req.id = p.nextID
	if err := p.send(req); err != nil {
		return nil, err
	}
	for {
		f, err := p.next(ctx)
		if err != nil {
			return nil, err
		}
		if f.id != req.id {
			return nil, fmt.Errorf("%w: reply to request %d while waiting for %d", ErrProtocol, f.id, req.id)
		}
		switch f.op {
		case opResult:
			return f, nil
		case opError:
			return nil, errorOf(f)
		case opToken:
			if onToken == nil {
				return nil, fmt.Errorf("%w: token outside generation", ErrProtocol)
			}
			op := opContinue
			if !onToken(f) {
				op = opStop
			}
			if err := p.send(&frame{op: op, id: req.id}); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%w: reply op %d", ErrProtocol, f.op)
		}
	}
}

// do runs req on the worker, starting it (and restoring its state) first
// if it is not running. When the worker dies during the call and retry
// is set, do restarts it, replays, and tries again, at most MaxRestarts
// times. A cancelled context kills the worker.
func (e *Engine) do(ctx context.Context, req *frame, retry bool, onToken func(*frame) bool) (*frame, error) {
	if e.closed {
		return nil, engine.ErrClosed
	}
	for attempt := 0; ; attempt++ {
		if e.p == nil {
			if err := e.restart(ctx); err != nil {
				return nil, err
			}
		}
		rep, err := e.p.call(ctx, req, onToken)
		if err == nil {
			return rep, nil
		}
		if ctx.Err() != nil {
			e.drop()
			return nil, ctx.Err()
		}
		if !errors.Is(err, errDied) && !errors.Is(err, ErrProtocol) {
			return nil, err
		}
		e.drop()
		if !retry || attempt >= e.opt.MaxRestarts {
			return nil, fmt.Errorf("%w: %w", ErrWorker, err)
		}
		e.log.Warn("torch worker died; restarting it", "error", err, "attempt", attempt+1)
	}
}

// drop kills the worker; the next call starts another.
func (e *Engine) drop() {
	if e.p != nil {
		e.p.kill()
		<-e.p.exited
		e.p = nil
	}
}

// restart starts a worker and brings it to the state the last one had:
// the last checkpoint, then the train steps since.
func (e *Engine) restart(ctx context.Context) error {
	e.restarts++
	if err := e.start(ctx); err != nil {
		return err
	}
	if e.ckpt != "" {
		rep, err := e.p.call(ctx, &frame{op: opRestore, meta: metaOf(map[string]string{"dir": e.ckpt})}, nil)
		if err == nil {
			_, err = e.setInfo(rep)
		}
		if err != nil {
			e.drop()
			return err
		}
	}
	for i, b := range e.replay {
		f, err := decodeFrame(b[4:])
		if err != nil {
			return err
		}
		if _, err := e.p.call(ctx, f, nil); err != nil {
			e.drop()
			return fmt.Errorf("replaying train step %d of %d: %w", i+1, len(e.replay), err)
		}
	}
	e.log.Info("torch worker restored", "checkpoint", e.ckpt, "replayed_steps", len(e.replay))
	return nil
}

// checkpoint has the worker save its adapter and optimizer state, which
// becomes the base of any replay.
func (e *Engine) checkpoint(ctx context.Context) error {
	e.ckpts++
	dir := filepath.Join(e.dir, fmt.Sprintf("ckpt-%d", e.ckpts))
	if _, err := e.do(ctx, &frame{op: opCheckpoint, meta: metaOf(map[string]string{"dir": dir})}, true, nil); err != nil {
		return err
	}
	if e.ckpt != "" {
		os.RemoveAll(e.ckpt)
	}
	e.ckpt, e.replay = dir, nil
	return nil
}

// loadFresh loads the native engine's fresh adapter for the current reset.
func (e *Engine) loadFresh(ctx context.Context) error {
	dir := filepath.Join(e.dir, "fresh")
	defer os.RemoveAll(dir)
	if err := native.WriteFreshAdapter(dir, e.cfg, e.opt.LoRA, native.ResetSeed(e.opt.Seed, e.resets), e.opt.Name); err != nil {
		return err
	}
	rep, err := e.do(ctx, &frame{op: opLoad, meta: metaOf(map[string]string{"dir": dir})}, true, nil)
	if err != nil {
		return err
	}
	if _, err := e.setInfo(rep); err != nil {
		return err
	}
	return e.checkpoint(ctx)
}

// Info implements engine.Engine.
func (e *Engine) Info() engine.ModelInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := e.info
	i.EOS = slices.Clone(i.EOS)
	return i
}

// Restarts reports how many times the worker was restarted after dying.
func (e *Engine) Restarts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restarts
}

func (e *Engine) checkSeq(s []int) error {
	if len(s) > e.info.MaxPosition {
		return fmt.Errorf("%w: %d tokens beyond max position %d", engine.ErrBadInput, len(s), e.info.MaxPosition)
	}
	return engine.CheckTokens(s, e.info.VocabSize)
}

// Logprobs implements engine.Engine.
func (e *Engine) Logprobs(ctx context.Context, seqs [][]int, base bool) ([][]float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, engine.ErrClosed
	}
	lengths := make([]int32, len(seqs))
	var flat []int32
	for i, s := range seqs {
		if err := e.checkSeq(s); err != nil {
			return nil, err
		}
		lengths[i] = int32(len(s))
		for _, t := range s {
			flat = append(flat, int32(t))
		}
	}
	if len(seqs) == 0 {
		return [][]float32{}, nil
	}
	rep, err := e.do(ctx, &frame{op: opLogprobs, meta: metaOf(map[string]bool{"base": base}),
		tensors: []tensor{i32Tensor(lengths), i32Tensor(flat)}}, true, nil)
	if err != nil {
		return nil, err
	}
	if len(rep.tensors) != 1 {
		return nil, fmt.Errorf("%w: log-probs reply with %d tensors", ErrProtocol, len(rep.tensors))
	}
	all, err := rep.tensors[0].floats()
	if err != nil {
		return nil, err
	}
	if len(all) != len(flat) {
		return nil, fmt.Errorf("%w: %d log-probs for %d tokens", ErrProtocol, len(all), len(flat))
	}
	out := make([][]float32, len(seqs))
	off := 0
	for i, s := range seqs {
		out[i] = all[off : off+len(s) : off+len(s)]
		if len(s) > 0 {
			out[i][0] = 0
		}
		off += len(s)
	}
	return out, nil
}

type recipeMeta struct {
	LR          float64  `json:"lr"`
	WeightDecay float64  `json:"weight_decay"`
	Beta1       float64  `json:"beta1"`
	Beta2       float64  `json:"beta2"`
	Eps         float64  `json:"eps"`
	MaxGradNorm float64  `json:"max_grad_norm"`
	MicroBatch  int      `json:"micro_batch"`
	Loss        lossMeta `json:"loss"`
}

type lossMeta struct {
	EpsLow        float64 `json:"eps_low"`
	EpsHigh       float64 `json:"eps_high"`
	Agg           string  `json:"agg"`
	RatioBound    float64 `json:"ratio_bound,omitempty"`
	RatioBoundOff bool    `json:"ratio_bound_off,omitempty"`
	KLCoef        float64 `json:"kl_coef"`
	EntropyCoef   float64 `json:"entropy_coef"`
}

type statsMeta struct {
	Loss     float64  `json:"loss"`
	GradNorm float64  `json:"grad_norm"`
	ClipFrac float64  `json:"clip_frac"`
	KL       float64  `json:"kl"`
	Entropy  float64  `json:"entropy"`
	Tokens   int      `json:"tokens"`
	Names    []string `json:"names,omitempty"`
}

// trainFrame validates batch and rc and encodes them as op's request.
func (e *Engine) trainFrame(op uint8, batch []engine.TrainSample, rc engine.Recipe) (*frame, error) {
	if err := rc.Validate(); err != nil {
		return nil, err
	}
	rc = rc.WithDefaults()
	if len(batch) == 0 {
		return nil, fmt.Errorf("%w: empty batch", engine.ErrBadInput)
	}
	lc := rc.Loss.WithDefaults()
	lm := lossMeta{EpsLow: lc.EpsLow, EpsHigh: lc.EpsHigh, Agg: lc.Agg.String(), RatioBound: lc.RatioBound,
		KLCoef: lc.KLCoef, EntropyCoef: lc.EntropyCoef}
	if lc.RatioBound > 1e300 { // +Inf: no JSON number
		lm.RatioBound, lm.RatioBoundOff = 0, true
	}
	m := recipeMeta{LR: rc.LR, WeightDecay: rc.WeightDecay, Beta1: rc.Beta1, Beta2: rc.Beta2, Eps: rc.Eps,
		MaxGradNorm: rc.MaxGradNorm, MicroBatch: rc.MicroBatch, Loss: lm}
	n := 0
	for i, s := range batch {
		if err := s.Validate(e.info.VocabSize); err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		if err := e.checkSeq(s.Tokens); err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		n += len(s.Tokens)
	}
	lengths := make([]int32, 0, len(batch))
	toks := make([]int32, 0, n)
	mask := make([]bool, 0, n)
	adv := make([]float32, 0, n)
	old := make([]float32, 0, n)
	ref := make([]float32, 0, n)
	hasOld := make([]bool, 0, len(batch))
	hasRef := make([]bool, 0, len(batch))
	for _, s := range batch {
		lengths = append(lengths, int32(len(s.Tokens)))
		for _, t := range s.Tokens {
			toks = append(toks, int32(t))
		}
		mask = append(mask, s.LossMask...)
		adv = append(adv, s.Advantages...)
		hasOld = append(hasOld, s.OldLogprobs != nil)
		hasRef = append(hasRef, s.RefLogprobs != nil)
		if s.OldLogprobs != nil {
			old = append(old, s.OldLogprobs...)
		} else {
			old = append(old, make([]float32, len(s.Tokens))...)
		}
		if s.RefLogprobs != nil {
			ref = append(ref, s.RefLogprobs...)
		} else {
			ref = append(ref, make([]float32, len(s.Tokens))...)
		}
	}
	return &frame{op: op, meta: metaOf(map[string]any{"recipe": m}), tensors: []tensor{
		i32Tensor(lengths), i32Tensor(toks), u8Tensor(mask), f32Tensor(adv), f32Tensor(old), u8Tensor(hasOld),
		f32Tensor(ref), u8Tensor(hasRef)}}, nil
}

func (s statsMeta) stats() engine.StepStats {
	return engine.StepStats{Loss: s.Loss, GradNorm: s.GradNorm, ClipFrac: s.ClipFrac, KL: s.KL, Entropy: s.Entropy, Tokens: s.Tokens}
}

// TrainStep implements engine.Engine. A step that runs out of device memory
// reports engine.ErrOutOfMemory and leaves the adapter as it was.
func (e *Engine) TrainStep(ctx context.Context, batch []engine.TrainSample, rc engine.Recipe) (engine.StepStats, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.StepStats{}, engine.ErrClosed
	}
	req, err := e.trainFrame(opTrain, batch, rc)
	if err != nil {
		return engine.StepStats{}, err
	}
	enc, err := req.encode(nil)
	if err != nil {
		return engine.StepStats{}, err
	}
	rep, err := e.do(ctx, req, true, nil)
	if err != nil {
		return engine.StepStats{}, err
	}
	var sm statsMeta
	if err := json.Unmarshal(rep.meta, &sm); err != nil {
		return engine.StepStats{}, fmt.Errorf("%w: train reply: %v", ErrProtocol, err)
	}
	e.replay = append(e.replay, enc)
	if len(e.replay) >= e.opt.CheckpointEvery {
		if err := e.checkpoint(ctx); err != nil {
			return sm.stats(), err
		}
	}
	e.log.Debug("train step", "loss", sm.Loss, "grad_norm", sm.GradNorm, "tokens", sm.Tokens)
	return sm.stats(), nil
}

// Gradient returns the gradient TrainStep would apply for batch and rc,
// before clipping, by PEFT tensor name, with the step's statistics; it
// changes nothing (as native.Engine.Gradient, which it is checked against).
func (e *Engine) Gradient(ctx context.Context, batch []engine.TrainSample, rc engine.Recipe) (map[string][]float32, engine.StepStats, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, engine.StepStats{}, engine.ErrClosed
	}
	req, err := e.trainFrame(opGrad, batch, rc)
	if err != nil {
		return nil, engine.StepStats{}, err
	}
	rep, err := e.do(ctx, req, true, nil)
	if err != nil {
		return nil, engine.StepStats{}, err
	}
	var sm statsMeta
	if err := json.Unmarshal(rep.meta, &sm); err != nil {
		return nil, engine.StepStats{}, fmt.Errorf("%w: gradient reply: %v", ErrProtocol, err)
	}
	if len(sm.Names) != len(rep.tensors) {
		return nil, engine.StepStats{}, fmt.Errorf("%w: %d names for %d gradients", ErrProtocol, len(sm.Names), len(rep.tensors))
	}
	out := make(map[string][]float32, len(sm.Names))
	for i, n := range sm.Names {
		if out[n], err = rep.tensors[i].floats(); err != nil {
			return nil, engine.StepStats{}, err
		}
	}
	return out, sm.stats(), nil
}

type genMeta struct {
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	Seed        uint64  `json:"seed"`
	Stop        []int   `json:"stop,omitempty"`
	TopLogprobs int     `json:"top_logprobs"`
	Stream      bool    `json:"stream"`
}

type tokenMeta struct {
	ID      int     `json:"id"`
	Logprob float32 `json:"logprob"`
}

// Generate implements engine.Engine. The worker samples with torch's
// generator seeded by o.Seed: reproducible, but not the native engine's
// draws (greedy decoding is the same on both).
func (e *Engine) Generate(ctx context.Context, prompt []int, o engine.GenOptions) ([]int, []float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, nil, engine.ErrClosed
	}
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
	if len(prompt) >= e.info.MaxPosition {
		return nil, nil, fmt.Errorf("%w: prompt of %d fills the context", engine.ErrBadInput, len(prompt))
	}
	p32 := make([]int32, len(prompt))
	for i, t := range prompt {
		p32[i] = int32(t)
	}
	top := 0
	if o.OnTop != nil {
		top = o.TopLogprobs
	}
	m := genMeta{MaxTokens: o.MaxTokens, Temperature: o.Temperature, TopP: o.TopP, Seed: o.Seed, Stop: o.Stop,
		TopLogprobs: top, Stream: true}
	var (
		toks    []int
		lps     []float32
		cbErr   error
		decoded error
	)
	onToken := func(f *frame) bool {
		var tm tokenMeta
		if err := json.Unmarshal(f.meta, &tm); err != nil || len(f.tensors) != 2 {
			decoded = fmt.Errorf("%w: token event", ErrProtocol)
			return false
		}
		toks = append(toks, tm.ID)
		lps = append(lps, tm.Logprob)
		if top > 0 {
			ids, err1 := f.tensors[0].ints()
			tl, err2 := f.tensors[1].floats()
			if err := errors.Join(err1, err2); err != nil {
				decoded = err
				return false
			}
			if cbErr = o.OnTop(ids, tl); cbErr != nil {
				return false
			}
		}
		if o.OnToken != nil {
			if cbErr = o.OnToken(tm.ID, tm.Logprob); cbErr != nil {
				return false
			}
		}
		return ctx.Err() == nil
	}
	// Generation streams with the caller's context left out of the wait:
	// cancelling stops it at the next token instead of killing the worker.
	// A worker that dies before the first token is restarted and asked
	// again; after, the tokens already seen cannot be taken back.
	req := &frame{op: opGenerate, meta: metaOf(m), tensors: []tensor{i32Tensor(p32)}}
	_, err := e.do(context.WithoutCancel(ctx), req, false, onToken)
	if err != nil && errors.Is(err, errDied) && len(toks) == 0 {
		_, err = e.do(context.WithoutCancel(ctx), req, true, onToken)
	}
	if err != nil {
		return toks, lps, err
	}
	if decoded != nil {
		return toks, lps, decoded
	}
	if cbErr != nil {
		return toks, lps, cbErr
	}
	return toks, lps, ctx.Err()
}

// ExportAdapter implements engine.Engine: the worker writes the adapter in
// PEFT format (float32 tensors).
func (e *Engine) ExportAdapter(ctx context.Context, dir string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	_, err = e.do(ctx, &frame{op: opExport, meta: metaOf(map[string]string{"dir": abs, "base_model": e.opt.Name})}, true, nil)
	return err
}

// LoadAdapter implements engine.Engine.
func (e *Engine) LoadAdapter(ctx context.Context, dir string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	rep, err := e.do(ctx, &frame{op: opLoad, meta: metaOf(map[string]string{"dir": abs})}, true, nil)
	if err != nil {
		return err
	}
	if _, err := e.setInfo(rep); err != nil {
		return err
	}
	return e.checkpoint(ctx)
}

// ResetAdapter implements engine.Engine: the native engine's fresh adapter
// for the next reset.
func (e *Engine) ResetAdapter() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	e.resets++
	return e.loadFresh(context.Background())
}

// Close implements engine.Engine: it stops the worker and removes the
// engine's state directory.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.p != nil {
		e.p.stop(10 * time.Second)
		e.p = nil
	}
	return os.RemoveAll(e.dir)
}

// DeviceStats describes the worker's device.
type DeviceStats struct {
	Device string `json:"device"`
	DType  string `json:"dtype"`
	// Name is the GPU's name; PeakMemory the most bytes torch allocated on
	// it so far (since the last reset), TotalMemory its capacity.
	Name        string `json:"name,omitempty"`
	PeakMemory  int64  `json:"peak_memory,omitempty"`
	TotalMemory int64  `json:"total_memory,omitempty"`
	// MatmulFLOPS is the measured rate of an n×n×n product in the model's
	// dtype (when asked for).
	MatmulFLOPS float64 `json:"matmul_flops,omitempty"`
}

// Device reports the worker's device; with matmul > 0 it also measures
// the rate of a matmul×matmul×matmul product, and resetPeak starts the
// peak memory count afresh.
func (e *Engine) Device(ctx context.Context, matmul int, resetPeak bool) (DeviceStats, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rep, err := e.do(ctx, &frame{op: opDevice, meta: metaOf(map[string]any{"matmul": matmul, "reset_peak": resetPeak})}, true, nil)
	if err != nil {
		return DeviceStats{}, err
	}
	var d DeviceStats
	if err := json.Unmarshal(rep.meta, &d); err != nil {
		return d, fmt.Errorf("%w: device reply: %v", ErrProtocol, err)
	}
	return d, nil
}
