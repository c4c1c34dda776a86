// Package reward owns the reward runner: it hosts reward plugins (WebAssembly
// modules that follow the ABI in wasm-rewards/ABI.md) under wazero, scores
// closed steps with them, and combines their verdicts into a core.Reward.
// ScoreTask runs one plugin on a trainer's rollout of a task with the
// task's answer in its input (a verifier, or a tool simulator).
//
// Plugins run with no filesystem, no network and no environment; the clock
// and randomness they see through WASI are deterministic; every call has a
// deadline and every instance a memory cap. Plugins are instrumented before
// they are compiled (reward/internal/meter) so that the deadline also stops
// code that never calls out. A plugin that traps, overruns,
// returns junk or lacks the ABI's exports abstains with a logged reason and
// affects nothing else. The plugin set can be swapped at run time (Reload);
// calls in flight finish on the set they started with. With
// Options.ReleaseAfter, a plugin unused that long lets its compiled code and
// instances go and is loaded again, from the compilation cache, by its next
// call.
//
// Replay runs a plugin as a peer that checks a recorded score can (judge
// calls refused, optionally without the plugin's config); Rescore scores a
// step again so that every score a device ships is one such a peer can
// replay from the step alone; Module gives a loaded plugin's module by its
// hash, for the mesh to serve.
//
// The package also carries the plugin author's tooling behind `clawmesh
// reward`: Scaffold writes a new plugin, Build compiles one, ReadSteps reads
// steps to test it on. See RATIONALE.md for the choices made here.
package reward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// Errors.
var (
	ErrClosed        = errors.New("reward: runner closed")
	ErrConfig        = errors.New("reward: invalid config")
	ErrUnknownPlugin = errors.New("reward: unknown plugin")
	// ErrUnusable reports, with Options.Strict, an enabled plugin that
	// cannot be loaded; the error names the plugin and says why.
	ErrUnusable = errors.New("reward: plugin cannot be loaded")
)

// Defaults.
const (
	DefaultDeadline     = 100 * time.Millisecond
	DefaultJudgeTimeout = 30 * time.Second
	DefaultStartTimeout = 5 * time.Second
	DefaultMemoryLimit  = 64 << 20
	DefaultFailureLimit = 5
)

// How long a plugin set aside after repeated failures waits before it is
// tried again: backoffBase after the first run of failures, twice as long
// after every failed retry, at most backoffMax.
const (
	backoffBase = 10 * time.Second
	backoffMax  = 10 * time.Minute
)

// Limits on what crosses the ABI.
const (
	maxInput  = 16 << 20 // bytes of input, either layout; larger steps abstain
	maxOutput = 1 << 20  // bytes of result, either layout
	maxHint   = 8 << 10
	maxReason = 1 << 10
	maxLabels = 32
	maxLabel  = 128
	maxLog    = 64 << 10 // bytes of log and stdout/stderr per call
)

// PluginConfig configures one plugin.
type PluginConfig struct {
	// Name identifies the plugin in scores and logs. Default: the built-in's
	// name, or the file name of Path without ".wasm". Names are unique.
	Name string
	// Path is the .wasm file. Exactly one of Path and Builtin is set.
	Path string
	// Weight of the plugin's score in the combined reward; 0 means 1.
	// Must be finite and not negative.
	Weight float64
	// Enabled plugins run; others are skipped.
	Enabled bool
	// Judge permits the plugin to import clawmesh.judge (ask the node's
	// LLM). A plugin that imports it without permission abstains.
	Judge bool
	// Builtin names a built-in plugin (see Builtins) to use instead of Path.
	Builtin string
	// Config is passed to the plugin as input.meta.config.
	Config map[string]string
}

func (c PluginConfig) weight() float64 {
	if c.Weight == 0 {
		return 1
	}
	return c.Weight
}

// Options configures a Runner. The zero value is usable: no plugins.
type Options struct {
	// Plugins is the initial plugin set.
	Plugins []PluginConfig
	// CacheDir holds wazero's compilation cache on disk so that start-up
	// does not recompile unchanged plugins. "" keeps the cache in memory.
	CacheDir string
	// Deadline bounds one plugin call. Default DefaultDeadline.
	Deadline time.Duration
	// JudgeTimeout bounds the judge calls of one plugin call, all together;
	// a judge plugin's call may take Deadline + JudgeTimeout. Default
	// DefaultJudgeTimeout.
	JudgeTimeout time.Duration
	// StartTimeout bounds instantiating a plugin (its runtime's
	// initialisation). Default DefaultStartTimeout.
	StartTimeout time.Duration
	// MemoryLimit caps each instance's linear memory, in bytes (rounded down
	// to 64 KiB pages). Default DefaultMemoryLimit.
	MemoryLimit uint64
	// FailureLimit is how many consecutive failed calls (a trap, an exit,
	// the deadline, an instance that would not start) set a plugin aside:
	// it then abstains at once, without running or starting an instance,
	// for 10 s, twice as long after every retry that fails again (at most
	// 10 min); a call that succeeds ends it, and so does a Reload. This
	// bounds what a broken plugin costs, a slow start-up included. 0 means
	// DefaultFailureLimit; negative never sets a plugin aside.
	FailureLimit int
	// Strict makes New and Reload fail (ErrUnusable) when an enabled
	// plugin cannot be loaded (a missing file, not WebAssembly, missing
	// exports, a start-up that fails) instead of keeping it to abstain on
	// every step; Reload then keeps the current set.
	Strict bool
	// ReleaseAfter, if positive, lets a plugin unused this long release
	// its instances and, with CacheDir set, its compiled code (the largest
	// part of an idle runner's memory); its next call compiles it again
	// from the cache on disk and starts an instance (tens of milliseconds
	// for a built-in). 0 keeps every plugin loaded while the runner lives.
	ReleaseAfter time.Duration
	// OnRelease, if set, is called after plugins were released, with how
	// many (a node returns the freed memory to the system then).
	OnRelease func(n int)
	// FreshInstances makes every call run in a new instance, so that no
	// state a plugin keeps in memory can survive from one call to the next.
	// Slower; by default instances are reused until they fail.
	FreshInstances bool
	// Judge asks the node's LLM; nil makes every judge call fail.
	Judge func(ctx context.Context, prompt string) (string, error)
	// Now stamps rewards and times calls. Default time.Now.
	Now func() time.Time
	// Logger receives plugin logs and failures. Default: discard.
	Logger *slog.Logger
	// OnFailure, if set, is told of each scoring call that failed rather
	// than gave the plugin's verdict (a trap, an exit, the deadline, a
	// plugin set aside or unusable): the abstention it became says why.
	// It must be cheap and safe for concurrent use (a metrics counter).
	OnFailure func(plugin string)

	// loopChecks replaces metering with wazero's own deadline check at
	// every loop head (WithCloseOnContextDone): the baseline the benchmarks
	// compare metering with.
	loopChecks bool
}

func (o *Options) validate() error {
	if o.Deadline < 0 || o.JudgeTimeout < 0 || o.StartTimeout < 0 || o.ReleaseAfter < 0 {
		return fmt.Errorf("%w: negative duration", ErrConfig)
	}
	if o.Deadline == 0 {
		o.Deadline = DefaultDeadline
	}
	if o.JudgeTimeout == 0 {
		o.JudgeTimeout = DefaultJudgeTimeout
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.MemoryLimit == 0 {
		o.MemoryLimit = DefaultMemoryLimit
	}
	if o.FailureLimit == 0 {
		o.FailureLimit = DefaultFailureLimit
	}
	if o.MemoryLimit < 1<<16 || o.MemoryLimit > 4<<30 {
		return fmt.Errorf("%w: memory limit %d outside [64 KiB, 4 GiB]", ErrConfig, o.MemoryLimit)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Builtins returns the built-in plugins' default configuration: all enabled
// with weight 1, except the LLM judge, which is disabled and needs judge
// permission.
func Builtins() []PluginConfig {
	var out []PluginConfig
	for _, n := range builtin.Names() {
		c := PluginConfig{Name: n, Builtin: n, Weight: 1, Enabled: true}
		if n == "judge" {
			c.Enabled, c.Judge = false, true
		}
		out = append(out, c)
	}
	return out
}

// Runner scores steps with a set of plugins. It is safe for concurrent use.
type Runner struct {
	opts Options
	log  *slog.Logger
	host *host

	mu     sync.Mutex
	cur    *set
	closed bool
	// mods are the modules of the sets loaded so far, by hash, so that a
	// module can be served (Module) after a Reload has replaced it.
	mods map[string]PluginConfig

	stopRelease chan struct{} // closed by Close; nil without ReleaseAfter
	releaseDone chan struct{}
}

// New starts a runner with opts.Plugins. A plugin that cannot be loaded
// (unreadable, not WebAssembly, missing exports) does not fail New unless
// opts.Strict: it abstains on every step with the reason. New fails on an
// invalid config.
func New(ctx context.Context, opts Options) (*Runner, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	h, err := newHost(opts)
	if err != nil {
		return nil, err
	}
	r := &Runner{opts: opts, log: opts.Logger.With("component", "reward"), host: h}
	s, err := r.load(ctx, opts.Plugins)
	if err != nil {
		h.close(ctx)
		return nil, err
	}
	r.cur = s
	if opts.ReleaseAfter > 0 {
		r.stopRelease, r.releaseDone = make(chan struct{}), make(chan struct{})
		go r.releaseLoop(opts.ReleaseAfter)
	}
	return r, nil
}

// releaseLoop looks for plugins to release twice per ReleaseAfter, until
// Close.
func (r *Runner) releaseLoop(after time.Duration) {
	defer close(r.releaseDone)
	t := time.NewTicker(after / 2)
	defer t.Stop()
	for {
		select {
		case <-r.stopRelease:
			return
		case <-t.C:
			r.releaseIdle(context.Background())
		}
	}
}

// releaseIdle releases the current set's plugins that no call used for
// ReleaseAfter, and says how many it released.
func (r *Runner) releaseIdle(ctx context.Context) int {
	s, err := r.acquire()
	if err != nil {
		return 0
	}
	defer s.release()
	cutoff := r.opts.Now().Add(-r.opts.ReleaseAfter)
	n := 0
	for _, p := range s.order {
		if p.release(ctx, cutoff) {
			n++
		}
	}
	if n > 0 {
		r.log.Debug("released idle plugins", "plugins", n)
		if r.opts.OnRelease != nil {
			r.opts.OnRelease(n)
		}
	}
	return n
}

// Reload swaps in a new plugin set atomically. Calls in flight finish on the
// old set, which is closed when they are done. On error (an invalid config,
// or with Options.Strict a plugin that cannot be loaded) the old set stays.
func (r *Runner) Reload(ctx context.Context, plugins []PluginConfig) error {
	s, err := r.load(ctx, plugins)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		s.close(ctx)
		return ErrClosed
	}
	old := r.cur
	r.cur = s
	r.mu.Unlock()
	old.retire(ctx)
	return nil
}

// Close releases the plugins. Calls in flight finish first.
func (r *Runner) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	s := r.cur
	r.mu.Unlock()
	if r.stopRelease != nil {
		close(r.stopRelease)
		<-r.releaseDone
	}
	s.retire(ctx)
	return r.host.close(ctx)
}

func (r *Runner) acquire() (*set, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	s := r.cur
	s.mu.Lock() // lock order: Runner.mu, then set.mu
	s.refs++
	s.mu.Unlock()
	return s, nil
}

// Plugins returns the configuration of the current set, in order.
func (r *Runner) Plugins() []PluginConfig {
	s, err := r.acquire()
	if err != nil {
		return nil
	}
	defer s.release()
	out := make([]PluginConfig, len(s.order))
	for i, p := range s.order {
		out[i] = p.cfg
	}
	return out
}

// Score runs every enabled plugin on the step and combines their verdicts:
// the value is the weighted sum of the scores of the plugins that did not
// abstain, clamped to [-1, 1] (nil if all abstained); the hint is the first
// non-empty hint in order of decreasing weight. A closed runner returns a
// Reward with no scores.
func (r *Runner) Score(ctx context.Context, step *core.Step) core.Reward {
	s, err := r.acquire()
	if err != nil {
		return core.Reward{Scores: []core.Score{}, At: r.opts.Now()}
	}
	defer s.release()
	in := newInput(step)
	scores := make([]core.Score, 0, len(s.plugins))
	for _, p := range s.plugins {
		sc, _ := r.scoreWith(ctx, p, in)
		scores = append(scores, sc)
	}
	return Combine(scores, r.opts.Now())
}

// ScorePlugin runs one plugin of the current set on the step, whether it is
// enabled or not, and says how long it took.
func (r *Runner) ScorePlugin(ctx context.Context, name string, step *core.Step) (core.Score, time.Duration) {
	return r.scoreNamed(ctx, name, newInput(step))
}

// ScoreTask runs one plugin of the current set, a verifier, on a rollout
// of a task: its input carries the task (input.task), which is how the
// verifier knows the answer. It says how long the call took.
func (r *Runner) ScoreTask(ctx context.Context, name string, step *core.Step, task Task) (core.Score, time.Duration) {
	in := newInput(step)
	in.task = &task
	return r.scoreNamed(ctx, name, in)
}

// scoreNamed runs the current set's plugin name on in.
func (r *Runner) scoreNamed(ctx context.Context, name string, in *input) (core.Score, time.Duration) {
	s, err := r.acquire()
	if err != nil {
		return core.Score{Plugin: name, Reason: ErrClosed.Error()}, 0
	}
	defer s.release()
	p := s.all[name]
	if p == nil {
		return core.Score{Plugin: name, Reason: fmt.Sprintf("%v %q", ErrUnknownPlugin, name)}, 0
	}
	return r.scoreWith(ctx, p, in)
}

func (r *Runner) scoreWith(ctx context.Context, p *plugin, in *input) (core.Score, time.Duration) {
	start := r.opts.Now()
	sc := p.score(ctx, in)
	return sc, r.opts.Now().Sub(start)
}

// Combine folds plugin scores into a reward stamped at.
func Combine(scores []core.Score, at time.Time) core.Reward {
	rw := core.Reward{Scores: scores, At: at}
	var sum float64
	var any bool
	for _, s := range scores {
		if s.Value == nil || math.IsNaN(*s.Value) {
			continue
		}
		sum += s.Weight * *s.Value
		any = true
	}
	if any {
		v := math.Max(-1, math.Min(1, sum))
		rw.Value = &v
	}
	order := make([]int, len(scores))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return scores[order[a]].Weight > scores[order[b]].Weight })
	for _, i := range order {
		if scores[i].Hint != "" {
			rw.Hint = scores[i].Hint
			break
		}
	}
	return rw
}

// set is one generation of plugins.
type set struct {
	plugins []*plugin          // enabled, in config order
	order   []*plugin          // every configured plugin, in config order
	all     map[string]*plugin // every configured plugin by name

	mu      sync.Mutex
	refs    int
	retired bool
	closeFn func()
}

func (s *set) release() {
	s.mu.Lock()
	s.refs--
	done := s.retired && s.refs == 0
	s.mu.Unlock()
	if done {
		s.closeFn()
	}
}

// retire closes the set once no call uses it.
func (s *set) retire(ctx context.Context) {
	s.mu.Lock()
	s.retired = true
	s.closeFn = sync.OnceFunc(func() { s.close(context.WithoutCancel(ctx)) })
	done := s.refs == 0
	s.mu.Unlock()
	if done {
		s.closeFn()
	}
}

func (s *set) close(ctx context.Context) {
	for _, p := range s.all {
		p.close(ctx)
	}
}

func (r *Runner) load(ctx context.Context, cfgs []PluginConfig) (*set, error) {
	s := &set{all: map[string]*plugin{}}
	named := make([]PluginConfig, len(cfgs))
	for i, c := range cfgs {
		c, err := normalize(c)
		if err != nil {
			return nil, err
		}
		if _, dup := s.all[c.Name]; dup {
			return nil, fmt.Errorf("%w: plugin name %q used twice", ErrConfig, c.Name)
		}
		s.all[c.Name] = nil
		named[i] = c
	}
	pool := runtime.GOMAXPROCS(0)
	var unusable []error
	for _, c := range named {
		p := r.host.load(ctx, c, pool)
		switch {
		case p.broken == "":
		case r.opts.Strict && c.Enabled:
			unusable = append(unusable, fmt.Errorf("%w: %q: %s", ErrUnusable, c.Name, p.broken))
		case ctx.Err() != nil:
			// Stopped while loading: the plugin is not at fault.
		default:
			r.log.Warn("plugin unusable; it will abstain", "plugin", c.Name, "reason", p.broken)
		}
		s.all[c.Name] = p
		s.order = append(s.order, p)
		if c.Enabled {
			s.plugins = append(s.plugins, p)
		}
	}
	if len(unusable) > 0 {
		s.close(ctx)
		return nil, errors.Join(unusable...)
	}
	r.remember(s)
	return s, nil
}
