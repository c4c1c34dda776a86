package reward

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/reward/internal/meter"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// ABI names; see wasm-rewards/ABI.md.
const (
	abiJSON      = 1 // JSON input and result
	abiFlat      = 2 // the flat layout
	hostModule   = "clawmesh"
	exportMemory = "memory"
	exportAlloc  = "clawmesh_alloc"
	exportScore  = "clawmesh_score"
	exportABI    = "clawmesh_abi"
	importLog    = "log"
	importJudge  = "judge"
	startReactor = "_initialize" // WASI reactors (Go's c-shared, Rust cdylib)
	startCommand = "_start"
)

// fakeEpoch is the wall clock every call starts from (2022-01-01, as
// wazero's own fake clock).
const fakeEpoch = 1640995200

// randSeed seeds the random bytes every call sees.
var randSeed = [32]byte{'c', 'l', 'a', 'w', 'm', 'e', 's', 'h', '.', 'r', 'e', 'w', 'a', 'r', 'd'}

// host is the wazero runtime shared by every plugin set of a runner.
type host struct {
	opts  Options
	log   *slog.Logger
	rt    wazero.Runtime
	cache wazero.CompilationCache
}

func newHost(opts Options) (*host, error) {
	ctx := context.Background()
	var cache wazero.CompilationCache
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("reward: compilation cache: %w", err)
		}
		cache = c
	} else {
		cache = wazero.NewCompilationCache()
	}
	// No WithCloseOnContextDone: its check at every loop iteration is an
	// exit from the compiled code into Go, which costs more than most
	// plugins' own work. Plugins are metered instead (see meter and
	// refuel), and the deadline is checked at every refill.
	cfg := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(opts.loopChecks).
		WithMemoryLimitPages(uint32(opts.MemoryLimit >> 16)).
		WithCompilationCache(cache)
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	h := &host{opts: opts, log: opts.Logger.With("component", "reward"), rt: rt, cache: cache}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		h.close(ctx)
		return nil, fmt.Errorf("reward: wasi: %w", err)
	}
	_, err := rt.NewHostModuleBuilder(hostModule).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(h.hostLog),
		[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, nil).Export(importLog).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(h.hostJudge),
		[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}).Export(importJudge).
		Instantiate(ctx)
	if err != nil {
		h.close(ctx)
		return nil, fmt.Errorf("reward: host module: %w", err)
	}
	_, err = rt.NewHostModuleBuilder(meter.ImportModule).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(h.refuel),
		nil, []api.ValueType{api.ValueTypeI64}).Export(meter.ImportName).
		Instantiate(ctx)
	if err != nil {
		h.close(ctx)
		return nil, fmt.Errorf("reward: meter module: %w", err)
	}
	return h, nil
}

// fuelChunk is the fuel refuel grants: about a quarter of a million
// WebAssembly instructions, well under a millisecond of most code, so the
// deadline is checked at least that often while a plugin computes.
const fuelChunk = 1 << 18

// refuel is called by a metered plugin that ran out of fuel. It stops the
// call if its time is up, and grants another chunk otherwise.
func (h *host) refuel(ctx context.Context, _ api.Module, stack []uint64) {
	switch err := ctx.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
	case err != nil:
		panic(sys.NewExitError(sys.ExitCodeContextCanceled))
	}
	if cs := stateOf(ctx); cs != nil && cs.judge && h.opts.Now().After(cs.computeEnd.Add(cs.judging)) {
		panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
	}
	stack[0] = fuelChunk
}

func (h *host) close(ctx context.Context) error {
	err := h.rt.Close(ctx)
	if cerr := h.cache.Close(ctx); err == nil {
		err = cerr
	}
	return err
}

// callState is what host functions know of the call they serve; it travels
// in the call's context.
type callState struct {
	plugin   string
	judge    bool
	inst     *instance
	judgeCtx context.Context // created at the first judge call
	cancel   context.CancelFunc

	// A judge plugin's own computing has the same deadline as any
	// plugin's: the time its judge calls took does not count.
	computeEnd time.Time     // when Deadline runs out, judge calls aside
	judging    time.Duration // time spent in judge calls so far

	// replay, set for a Replay, refuses judge calls and notes them.
	replay *replayState
}

type callKey struct{}

func stateOf(ctx context.Context) *callState {
	cs, _ := ctx.Value(callKey{}).(*callState)
	return cs
}

func (h *host) hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	cs := stateOf(ctx)
	b, ok := mod.Memory().Read(uint32(stack[0]), uint32(stack[1]))
	if cs == nil || !ok {
		return
	}
	// clawmesh.log shares the call's log budget with stdout and stderr.
	b = b[:cs.inst.output.take(len(b))]
	if len(b) > 0 {
		h.log.Info("plugin log", "plugin", cs.plugin, "msg", strings.ToValidUTF8(string(b), "\uFFFD"))
	}
}

// hostJudge asks the node's LLM and writes the reply into guest memory
// through the guest's clawmesh_alloc. It returns ptr<<32|len, or 0 on any
// failure.
func (h *host) hostJudge(ctx context.Context, mod api.Module, stack []uint64) {
	ptr, size := uint32(stack[0]), uint32(stack[1])
	stack[0] = 0
	cs := stateOf(ctx)
	if cs != nil && cs.replay != nil {
		cs.replay.judged = true
		return
	}
	if cs == nil || !cs.judge || h.opts.Judge == nil {
		return
	}
	prompt, ok := mod.Memory().Read(ptr, size)
	if !ok {
		return
	}
	if cs.judgeCtx == nil {
		cs.judgeCtx, cs.cancel = context.WithTimeout(ctx, h.opts.JudgeTimeout)
	}
	if cs.judgeCtx.Err() != nil {
		return
	}
	start := h.opts.Now()
	reply, err := h.opts.Judge(cs.judgeCtx, string(prompt))
	cs.judging += h.opts.Now().Sub(start)
	if err != nil {
		h.log.Info("judge call failed", "plugin", cs.plugin, "err", err)
		return
	}
	if len(reply) > maxOutput {
		reply = reply[:maxOutput]
	}
	at, ok := cs.inst.write(ctx, []byte(reply))
	if !ok {
		return
	}
	stack[0] = uint64(at)<<32 | uint64(len(reply))
}

// plugin is a loaded plugin: its compiled module and a pool of instances.
type plugin struct {
	h      *host
	cfg    PluginConfig
	hash   string
	broken string // why every call abstains; "" if usable
	fresh  bool
	free   chan *instance
	abi    int32 // the ABI version the module answers

	// The compiled code and the idle instances are made on demand: a
	// plugin unused for Options.ReleaseAfter lets them go (release), and
	// its next call compiles it again from the compilation cache.
	lmu     sync.Mutex
	code    wazero.CompiledModule // nil once released
	busy    int                   // calls holding an instance
	lastUse time.Time

	// Consecutive failed calls, and until when the plugin is set aside
	// after Options.FailureLimit of them.
	mu       sync.Mutex
	failures int
	last     string        // the last failure's reason
	backoff  time.Duration // the current period set aside
	until    time.Time
}

func normalize(c PluginConfig) (PluginConfig, error) {
	switch {
	case (c.Path == "") == (c.Builtin == ""):
		return c, fmt.Errorf("%w: plugin %q: set exactly one of path and builtin", ErrConfig, c.Name)
	case c.Weight < 0 || c.Weight != c.Weight || c.Weight > 1e6:
		return c, fmt.Errorf("%w: plugin %q: weight %v", ErrConfig, c.Name, c.Weight)
	}
	if c.Builtin != "" && !builtin.Has(c.Builtin) {
		return c, fmt.Errorf("%w: no built-in plugin %q (have %s)", ErrConfig, c.Builtin, strings.Join(builtin.Names(), ", "))
	}
	if c.Name == "" {
		if c.Builtin != "" {
			c.Name = c.Builtin
		} else {
			c.Name = strings.TrimSuffix(filepath.Base(c.Path), ".wasm")
		}
	}
	if c.Weight == 0 {
		c.Weight = 1
	}
	return c, nil
}

// load compiles and checks a plugin. A plugin that cannot be used is
// returned with broken set.
func (h *host) load(ctx context.Context, c PluginConfig, poolSize int) *plugin {
	p := &plugin{h: h, cfg: c, fresh: h.opts.FreshInstances, free: make(chan *instance, poolSize), lastUse: h.opts.Now()}
	bin, err := p.source()
	if err != nil {
		p.broken = "read: " + err.Error()
		return p
	}
	sum := sha256.Sum256(bin)
	p.hash = hex.EncodeToString(sum[:])
	code, err := h.compile(ctx, bin)
	if err != nil {
		p.broken = "compile: " + firstLine(err.Error())
		return p
	}
	p.code = code
	if why := checkABI(code, c.Judge); why != "" {
		p.broken = why
		return p
	}
	// Start one instance now: a module that cannot start is found at load
	// time, and the first call does not pay for it.
	inst, err := p.instantiate(ctx, code)
	if err != nil {
		p.broken = err.Error()
		return p
	}
	p.abi = inst.abi
	p.put(inst)
	return p
}

// source reads the plugin's module: the built-in's bytes or the file's.
func (p *plugin) source() ([]byte, error) {
	if p.cfg.Builtin != "" {
		return builtin.Module(p.cfg.Builtin)
	}
	return os.ReadFile(p.cfg.Path)
}

// compile instruments (unless loopChecks) and compiles a module.
func (h *host) compile(ctx context.Context, bin []byte) (wazero.CompiledModule, error) {
	if !h.opts.loopChecks {
		var err error
		if bin, err = meter.Instrument(bin); err != nil {
			return nil, err
		}
	}
	// More than one worker is also what makes wazero's compiler stop when
	// ctx ends: a node stopped during its first start does not wait for
	// the compilation.
	return h.rt.CompileModule(experimental.WithCompilationWorkers(ctx, max(runtime.GOMAXPROCS(0), 2)), bin)
}

// compiled returns the plugin's compiled code, compiling it again (from
// the compilation cache) if it was released. The module must still be the
// one loaded: a plugin file changed since then is refused until a reload.
func (p *plugin) compiled(ctx context.Context) (wazero.CompiledModule, error) {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	if p.code != nil {
		return p.code, nil
	}
	bin, err := p.source()
	if err != nil {
		return nil, fmt.Errorf("start: read: %w", err)
	}
	if sum := sha256.Sum256(bin); hex.EncodeToString(sum[:]) != p.hash {
		return nil, fmt.Errorf("start: %s has changed since the plugin was loaded (reload the plugins to use it)", p.cfg.Path)
	}
	code, err := p.h.compile(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("start: compile: %s", firstLine(err.Error()))
	}
	p.code = code
	return code, nil
}

// release closes the plugin's idle instances and, when compiled code can
// be had again from the on-disk cache, its compiled code, if no call holds
// an instance and none started after cutoff. It says whether it released
// anything.
func (p *plugin) release(ctx context.Context, cutoff time.Time) bool {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	if p.busy > 0 || p.lastUse.After(cutoff) {
		return false
	}
	released := false
	for done := false; !done; {
		select {
		case inst := <-p.free:
			inst.mod.Close(ctx)
			released = true
		default:
			done = true
		}
	}
	if p.code != nil && p.h.opts.CacheDir != "" {
		p.code.Close(ctx)
		p.code = nil
		released = true
	}
	return released
}

// checkABI reports what makes a compiled module unusable as a plugin.
func checkABI(code wazero.CompiledModule, judgeOK bool) string {
	if _, ok := code.ExportedMemories()[exportMemory]; !ok {
		return "missing export memory"
	}
	fns := code.ExportedFunctions()
	want := []struct {
		name        string
		params, res []api.ValueType
	}{
		{exportAlloc, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
		{exportScore, []api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}},
	}
	for _, w := range want {
		f, ok := fns[w.name]
		if !ok {
			return "missing export " + w.name
		}
		if !bytes.Equal(f.ParamTypes(), w.params) || !bytes.Equal(f.ResultTypes(), w.res) {
			return "export " + w.name + " has the wrong signature"
		}
	}
	if f, ok := fns[exportABI]; ok && (len(f.ParamTypes()) != 0 || !bytes.Equal(f.ResultTypes(), []api.ValueType{api.ValueTypeI32})) {
		return "export " + exportABI + " has the wrong signature"
	}
	for _, imp := range code.ImportedFunctions() {
		mod, name, _ := imp.Import()
		if mod != hostModule {
			continue
		}
		switch name {
		case importLog:
		case importJudge:
			if !judgeOK {
				return "judge not permitted"
			}
		default:
			return "unknown import " + hostModule + "." + name
		}
	}
	return ""
}

func (p *plugin) close(ctx context.Context) {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	for {
		select {
		case inst := <-p.free:
			inst.mod.Close(ctx)
		default:
			if p.code != nil {
				p.code.Close(ctx)
				p.code = nil
			}
			return
		}
	}
}

// get returns an idle instance or starts one; the caller calls done once
// the instance is put back or closed.
func (p *plugin) get(ctx context.Context) (*instance, error) {
	p.lmu.Lock()
	p.busy++
	p.lastUse = p.h.opts.Now()
	p.lmu.Unlock()
	select {
	case inst := <-p.free:
		return inst, nil
	default:
	}
	code, err := p.compiled(ctx)
	if err != nil {
		p.done()
		return nil, err
	}
	inst, err := p.instantiate(ctx, code)
	if err != nil {
		p.done()
	}
	return inst, err
}

// done ends a call that get gave an instance to.
func (p *plugin) done() {
	p.lmu.Lock()
	p.busy--
	p.lmu.Unlock()
}

func (p *plugin) put(inst *instance) {
	if !p.fresh {
		select {
		case p.free <- inst:
			return
		default:
		}
	}
	inst.mod.Close(context.Background())
}

// score runs the plugin on one input. It never fails: every failure is an
// abstention with its reason.
func (p *plugin) score(ctx context.Context, in *input) core.Score {
	sc, failed := p.run(ctx, in, p.cfg)
	if failed && p.h.opts.OnFailure != nil {
		p.h.opts.OnFailure(p.cfg.Name)
	}
	return sc
}

// run is score with the name and config the plugin is shown (c), which
// also says whether the abstention it may return is a failure rather than
// the plugin's verdict: the plugin is unusable or set aside, its input is
// over the limit, or the call trapped, exited or ran out of time.
func (p *plugin) run(ctx context.Context, in *input, c PluginConfig) (sc core.Score, failed bool) {
	sc = core.Score{Plugin: c.Name, Hash: p.hash, Weight: c.Weight}
	if p.broken != "" {
		sc.Reason = p.broken
		return sc, true
	}
	if why := p.setAside(); why != "" {
		sc.Reason = why
		return sc, true
	}
	var b []byte
	if p.abi == abiFlat {
		b = in.encodeFlat(c)
	} else {
		var err error
		if b, err = in.encode(c); err != nil {
			sc.Reason = "encode input: " + err.Error()
			return sc, true
		}
	}
	if len(b) > maxInput {
		sc.Reason = fmt.Sprintf("input of %d bytes exceeds %d", len(b), maxInput)
		return sc, true
	}
	out, err := p.call(ctx, b)
	if err != nil {
		sc.Reason = err.Error()
		p.h.log.Info("plugin abstained", "plugin", c.Name, "reason", sc.Reason)
		p.failed(sc.Reason)
		return sc, true
	}
	p.succeeded()
	decode := DecodeResult
	if p.abi == abiFlat {
		decode = DecodeFlatResult
	}
	res, err := decode(out)
	if err != nil {
		// A result the host rejects is the plugin's doing, the same on
		// every run: an abstention, not a failure.
		sc.Reason = err.Error()
		p.h.log.Info("plugin abstained", "plugin", c.Name, "reason", sc.Reason)
		return sc, false
	}
	sc.Value, sc.Hint, sc.Labels, sc.Reason = res.Score, res.Hint, res.Labels, res.Reason
	return sc, false
}

// setAside says why the plugin does not run now, or "" if it does.
func (p *plugin) setAside() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.until.IsZero() || !p.h.opts.Now().Before(p.until) {
		return ""
	}
	return fmt.Sprintf("disabled after %d consecutive failures, retry at %s (last: %s)",
		p.failures, p.until.UTC().Format(time.RFC3339), p.last)
}

// failed counts a failed call and sets the plugin aside after
// Options.FailureLimit of them in a row: for backoffBase, then twice as
// long after every retry that fails, up to backoffMax.
func (p *plugin) failed(reason string) {
	limit := p.h.opts.FailureLimit
	if limit < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failures++
	p.last = reason
	if p.failures < limit {
		return
	}
	p.backoff = min(max(2*p.backoff, backoffBase), backoffMax)
	p.until = p.h.opts.Now().Add(p.backoff)
	p.h.log.Warn("plugin set aside after consecutive failures; it abstains until then",
		"plugin", p.cfg.Name, "failures", p.failures, "until", p.until, "last", reason)
}

func (p *plugin) succeeded() {
	p.mu.Lock()
	p.failures, p.last, p.backoff, p.until = 0, "", 0, time.Time{}
	p.mu.Unlock()
}

func (p *plugin) call(ctx context.Context, in []byte) ([]byte, error) {
	inst, err := p.get(ctx)
	if err != nil {
		return nil, err
	}
	defer p.done()
	limit := p.h.opts.Deadline
	if p.cfg.Judge {
		limit += p.h.opts.JudgeTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cs := &callState{plugin: p.cfg.Name, judge: p.cfg.Judge, inst: inst,
		computeEnd: p.h.opts.Now().Add(p.h.opts.Deadline), replay: replayOf(ctx)}
	defer func() {
		if cs.cancel != nil {
			cs.cancel()
		}
	}()
	cctx = context.WithValue(cctx, callKey{}, cs)
	inst.reset()
	out, err := inst.run(cctx, in)
	if err != nil {
		inst.mod.Close(context.Background())
		return nil, explain(err, inst)
	}
	p.put(inst)
	return out, nil
}

// explain turns a failed call into an abstention reason.
func explain(err error, inst *instance) error {
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return errors.New("deadline exceeded")
		case sys.ExitCodeContextCanceled:
			return errors.New("canceled")
		}
		msg := fmt.Sprintf("plugin exited with code %d", exit.ExitCode())
		if tail := inst.stderrTail(); tail != "" {
			msg += ": " + tail
		}
		return errors.New(msg)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("deadline exceeded")
	}
	msg := "trap: " + firstLine(err.Error())
	if tail := inst.stderrTail(); tail != "" {
		msg += ": " + tail
	}
	return errors.New(msg)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// instance is one instantiated plugin module.
type instance struct {
	mod   api.Module
	mem   api.Memory
	alloc api.Function
	fn    api.Function

	abi    int32 // clawmesh_abi's answer, abiJSON if not exported
	wall   int64 // walltime reads this call
	rng    *rand.ChaCha8
	used   bool // rng read since reset
	output *logWriter
}

func (p *plugin) instantiate(ctx context.Context, code wazero.CompiledModule) (*instance, error) {
	inst := &instance{abi: abiJSON, rng: rand.NewChaCha8(randSeed)}
	inst.output = &logWriter{log: p.h.log, plugin: p.cfg.Name}
	var nano int64
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(startReactor).
		WithStdout(inst.output).
		WithStderr(inst.output).
		WithWalltime(func() (int64, int32) {
			t := int64(fakeEpoch)*1e9 + inst.wall*int64(time.Millisecond)
			inst.wall++
			return t / 1e9, int32(t % 1e9)
		}, sys.ClockResolution(time.Microsecond)).
		WithNanotime(func() int64 {
			nano += int64(time.Millisecond)
			return nano
		}, sys.ClockResolution(1)).
		WithRandSource(randReader{inst})
	sctx, cancel := context.WithTimeout(ctx, p.h.opts.StartTimeout)
	defer cancel()
	mod, err := p.h.rt.InstantiateModule(sctx, code, cfg)
	if err != nil {
		var exit *sys.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded {
			return nil, errors.New("start: deadline exceeded")
		}
		return nil, fmt.Errorf("start: %s", firstLine(err.Error()))
	}
	if mod.ExportedFunction(startCommand) != nil && mod.ExportedFunction(startReactor) == nil {
		mod.Close(ctx)
		return nil, errors.New("start: module is a WASI command (exports _start); build it as a reactor (-buildmode=c-shared)")
	}
	inst.mod = mod
	inst.mem = mod.Memory()
	inst.alloc = mod.ExportedFunction(exportAlloc)
	inst.fn = mod.ExportedFunction(exportScore)
	if v := mod.ExportedFunction(exportABI); v != nil {
		res, err := v.Call(sctx)
		if err != nil {
			mod.Close(ctx)
			return nil, fmt.Errorf("%s: %s", exportABI, firstLine(err.Error()))
		}
		switch v := int32(res[0]); v {
		case abiJSON, abiFlat:
			inst.abi = v
		default:
			mod.Close(ctx)
			return nil, fmt.Errorf("unsupported abi version %d", v)
		}
	}
	return inst, nil
}

// reset gives the next call the same clock and random bytes as every call.
func (inst *instance) reset() {
	inst.wall = 0
	if inst.used {
		inst.rng = rand.NewChaCha8(randSeed)
		inst.used = false
	}
	inst.output.reset()
}

type randReader struct{ inst *instance }

func (r randReader) Read(b []byte) (int, error) {
	r.inst.used = true
	return r.inst.rng.Read(b)
}

// write copies b into guest memory allocated by the guest.
func (inst *instance) write(ctx context.Context, b []byte) (uint32, bool) {
	res, err := inst.alloc.Call(ctx, uint64(len(b)))
	if err != nil {
		return 0, false
	}
	ptr := uint32(res[0])
	if !inst.mem.Write(ptr, b) {
		return 0, false
	}
	return ptr, true
}

var errAllocOOB = errors.New("clawmesh_alloc returned memory out of bounds")

func (inst *instance) run(ctx context.Context, in []byte) ([]byte, error) {
	res, err := inst.alloc.Call(ctx, uint64(len(in)))
	if err != nil {
		return nil, err
	}
	ptr := uint32(res[0])
	if !inst.mem.Write(ptr, in) {
		return nil, errAllocOOB
	}
	res, err = inst.fn.Call(ctx, uint64(ptr), uint64(len(in)))
	if err != nil {
		return nil, err
	}
	rp, rl := uint32(res[0]>>32), uint32(res[0])
	if rl > maxOutput {
		return nil, fmt.Errorf("result of %d bytes exceeds %d", rl, maxOutput)
	}
	out, ok := inst.mem.Read(rp, rl)
	if !ok {
		return nil, fmt.Errorf("result [%d, +%d) out of bounds", rp, rl)
	}
	return bytes.Clone(out), nil
}

func (inst *instance) stderrTail() string { return inst.output.tail() }

// logWriter forwards a plugin's stdout and stderr to the log, line by line,
// and remembers the last line for reasons. It keeps the call's log budget:
// maxLog bytes of stdout, stderr and clawmesh.log together.
type logWriter struct {
	mu      sync.Mutex
	log     *slog.Logger
	plugin  string
	n       int
	partial []byte
	first   string // the first "panic:" or "fatal error:" line
	last    string
}

func (w *logWriter) reset() {
	w.mu.Lock()
	w.n, w.partial, w.first, w.last = 0, nil, "", ""
	w.mu.Unlock()
}

func (w *logWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(b)
	b = b[:w.takeLocked(len(b))]
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.emit(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	return n, nil
}

// take reserves up to n bytes of the call's log budget and returns how
// many it got.
func (w *logWriter) take(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.takeLocked(n)
}

func (w *logWriter) takeLocked(n int) int {
	n = min(n, max(maxLog-w.n, 0))
	w.n += n
	return n
}

func (w *logWriter) emit(line []byte) {
	s := strings.TrimSpace(strings.ToValidUTF8(string(line), "\uFFFD"))
	if s == "" {
		return
	}
	w.last = s
	if w.first == "" && (strings.HasPrefix(s, "panic:") || strings.HasPrefix(s, "fatal error:")) {
		w.first = s
	}
	w.log.Info("plugin output", "plugin", w.plugin, "line", s)
}

func (w *logWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.emit(w.partial)
		w.partial = nil
	}
	s := w.last
	if w.first != "" {
		s = w.first
	}
	if len(s) > 200 {
		s = s[:200]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
