// Package verify checks the scores a batch carries by replaying them. Reward
// plugins are deterministic and content-addressed, so a trainer can run a
// score's plugin again, by the hash of its module, on the step as the batch
// carries it, and refuse the batch when the verdict differs.
//
// A Checker owns a cache of plugin modules (CacheDir/<hash>.wasm, written
// atomically, checked against their hash when read) and fetches a module it
// lacks from the peer the batch came from (mesh's plugin protocol, through
// Config.Fetch). Check checks every step's combined reward against its
// scores, then replays every score of a sample of the scored steps, chosen
// from the batch's content with a secret seed so that a device cannot know
// which of its steps will be replayed. A replay runs the plugin as
// reward.Runner.Replay does, with no config and judge calls refused, in a
// fresh instance unless Config.ReuseInstances; a score whose plugin asks
// the judge cannot be replayed and is counted, not checked.
//
// It relies on the device having scored the steps as they left it, after
// scrubbing (node/share's Rescorer, reward.Runner.Rescore); RATIONALE.md
// says why.
package verify

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/reward"
)

// Defaults.
const (
	DefaultSample     = 8
	DefaultTolerance  = 1e-9
	DefaultDeadline   = 2 * time.Second
	DefaultMaxPlugins = 16
)

// Why a batch is refused: Result.Err wraps exactly one of these.
var (
	// ErrScore: a replayed score gives another verdict than the one
	// recorded (another value, an abstention for a value or the other way
	// round, another hint).
	ErrScore = errors.New("verify: score does not replay")
	// ErrCombined: a step's combined reward is not what its scores make.
	ErrCombined = errors.New("verify: combined reward does not match its scores")
	// ErrUnavailable: the plugin module is neither in the cache nor to be
	// had from the peer the batch came from.
	ErrUnavailable = errors.New("verify: plugin unavailable")
	// ErrUnusable: the module is not a usable plugin, or it gave no
	// verdict on the step (a trap, an exit, the deadline): an honest
	// device ships no score its plugin could not make.
	ErrUnusable = errors.New("verify: plugin unusable")
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("verify: bad config")

// FetchFunc fetches a plugin module by the hex sha256 of its bytes from a
// peer, refusing one over maxBytes: (*mesh.Mesh).FetchPlugin.
type FetchFunc func(ctx context.Context, from mesh.PeerID, hash string, maxBytes int64) ([]byte, error)

// Config configures a Checker. The zero value of each optional field means
// its default.
type Config struct {
	// CacheDir holds the plugin modules (<hash>.wasm). Required.
	CacheDir string
	// CompileDir holds wazero's compilation cache, so that a module is
	// compiled once, not at every start (a node's cache may be shared);
	// default CacheDir/compiled.
	CompileDir string
	// Fetch fetches a module the cache lacks; nil uses the cache only.
	Fetch FetchFunc
	// Sample is how many scored steps of a batch have their scores
	// replayed (all of them in a smaller batch); default DefaultSample.
	Sample int
	// Seed picks the sample together with the batch's content. It should
	// be secret to the trainer: a device that knows it knows which steps
	// are replayed. Zero draws one from Rand (default crypto/rand).
	Seed uint64
	Rand io.Reader
	// Tolerance is how far a replayed value may be from the recorded one;
	// default DefaultTolerance.
	Tolerance float64
	// Deadline bounds one plugin call; default DefaultDeadline, well over
	// a device's (100 ms): a replay that runs out of time refuses the
	// batch.
	Deadline time.Duration
	// MemoryLimit caps a plugin instance's memory; default reward's.
	MemoryLimit uint64
	// MaxModule bounds a fetched module; default mesh.MaxPlugin.
	MaxModule int64
	// MaxPlugins bounds the plugins kept compiled between checks; default
	// DefaultMaxPlugins.
	MaxPlugins int
	// ReuseInstances reuses a plugin's instances from call to call:
	// faster, but state a plugin keeps in its memory then carries from one
	// replay to the next. By default every replay gets a fresh instance.
	ReuseInstances bool
	Logger         *slog.Logger
}

// Validate checks c.
func (c *Config) Validate() error {
	switch {
	case c.CacheDir == "":
		return fmt.Errorf("%w: no cache directory", ErrConfig)
	case c.Sample < 0 || c.MaxPlugins < 0 || c.MaxModule < 0:
		return fmt.Errorf("%w: negative sample, max plugins or max module", ErrConfig)
	case c.Tolerance < 0 || c.Tolerance != c.Tolerance:
		return fmt.Errorf("%w: tolerance %v", ErrConfig, c.Tolerance)
	case c.Deadline < 0:
		return fmt.Errorf("%w: deadline %v", ErrConfig, c.Deadline)
	}
	return nil
}

// Checker replays batches' scores. Checks are serialized: it is safe for
// concurrent use, one check at a time.
type Checker struct {
	cfg  Config
	log  *slog.Logger
	seed [8]byte

	mu      sync.Mutex
	closed  bool
	plugins map[pluginKey]*loaded
	tick    int64 // orders uses, for eviction
}

type pluginKey struct{ hash, name string }

type loaded struct {
	r    *reward.Runner
	used int64
}

// New makes a Checker.
func New(cfg Config) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Sample == 0 {
		cfg.Sample = DefaultSample
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.MaxModule == 0 || cfg.MaxModule > mesh.MaxPlugin {
		cfg.MaxModule = mesh.MaxPlugin
	}
	if cfg.MaxPlugins == 0 {
		cfg.MaxPlugins = DefaultMaxPlugins
	}
	if cfg.CompileDir == "" {
		cfg.CompileDir = filepath.Join(cfg.CacheDir, "compiled")
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Checker{cfg: cfg, log: cfg.Logger.With("component", "verify"), plugins: map[pluginKey]*loaded{}}
	binary.LittleEndian.PutUint64(c.seed[:], cfg.Seed)
	if cfg.Seed == 0 {
		if _, err := io.ReadFull(cfg.Rand, c.seed[:]); err != nil {
			return nil, fmt.Errorf("verify: seed: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	return c, nil
}

// Close releases the compiled plugins.
func (c *Checker) Close(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for k, l := range c.plugins {
		errs = append(errs, l.r.Close(ctx))
		delete(c.plugins, k)
	}
	return errors.Join(errs...)
}

// Result is what Check made of a batch.
type Result struct {
	// Verified says every check passed. Otherwise Err says why the batch
	// is refused (wrapping one of ErrScore, ErrCombined, ErrUnavailable,
	// ErrUnusable) and Reason is its text, which names the step and the
	// plugin; Step, Plugin and Hash name them too.
	Verified bool
	Err      error
	Reason   string
	Step     core.StepID
	Plugin   string
	Hash     string
	// Sampled are the steps whose scores were replayed, in batch order.
	Sampled []core.StepID
	// Replayed counts the scores replayed and found the same; Judged
	// those whose plugin asked the LLM judge, which no peer but the
	// device can replay: they were not checked.
	Replayed, Judged int
	// Fetched counts the modules fetched from the peer for this check.
	Fetched int
}

func (r *Result) refuse(step *core.Step, sc *core.Score, err error) Result {
	r.Verified, r.Err, r.Reason = false, err, err.Error()
	if step != nil {
		r.Step = step.ID
	}
	if sc != nil {
		r.Plugin, r.Hash = sc.Plugin, sc.Hash
	}
	return *r
}

// Check checks b, which came from peer from (where a module the cache
// lacks is fetched): every step's combined reward against its scores,
// and every score of a sample of its scored steps by replaying it. It
// returns an error only when it could not finish (ctx done, the cache
// unwritable, the checker closed); a batch that fails a check is a Result
// that is not Verified.
func (c *Checker) Check(ctx context.Context, b *batch.Batch, from mesh.PeerID) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Result{}, errors.New("verify: checker closed")
	}
	res := Result{Verified: true}
	var scored []int
	for i, s := range b.Steps {
		if s.Reward == nil {
			continue
		}
		scored = append(scored, i)
		if err := c.combined(s.Reward); err != nil {
			return res.refuse(s, nil, fmt.Errorf("%w: step %s: %v", ErrCombined, s.ID, err)), nil
		}
	}
	for _, i := range c.sample(b.Header.BodySHA256, scored) {
		s := b.Steps[i]
		res.Sampled = append(res.Sampled, s.ID)
		for j := range s.Reward.Scores {
			sc := &s.Reward.Scores[j]
			refusal, err := c.replay(ctx, s, sc, from, &res)
			if err != nil {
				return Result{}, err
			}
			if refusal != nil {
				return res.refuse(s, sc, refusal), nil
			}
		}
	}
	return res, nil
}

// combined checks that a reward's value and hint are what its scores make.
func (c *Checker) combined(rw *core.Reward) error {
	want := reward.Combine(rw.Scores, rw.At)
	if !reward.SameVerdict(core.Score{Value: rw.Value, Hint: rw.Hint}, core.Score{Value: want.Value, Hint: want.Hint}, c.cfg.Tolerance) {
		return fmt.Errorf("recorded %s, its scores make %s", verdict(rw.Value, rw.Hint), verdict(want.Value, want.Hint))
	}
	return nil
}

// sample picks up to Config.Sample of the indices in scored, by a
// generator seeded with the checker's seed and the batch's body hash; it
// returns them in batch order.
func (c *Checker) sample(body string, scored []int) []int {
	if len(scored) <= c.cfg.Sample {
		return scored
	}
	seed := sha256.Sum256(append(c.seed[:], body...))
	rng := mathrand.New(mathrand.NewChaCha8(seed))
	idx := slices.Clone(scored)
	for i := 0; i < c.cfg.Sample; i++ {
		j := i + rng.IntN(len(idx)-i)
		idx[i], idx[j] = idx[j], idx[i]
	}
	idx = idx[:c.cfg.Sample]
	slices.Sort(idx)
	return idx
}

// replay replays one score. It returns the refusal it makes, if any, and
// an error when the check cannot go on.
func (c *Checker) replay(ctx context.Context, s *core.Step, sc *core.Score, from mesh.PeerID, res *Result) (refusal, err error) {
	if sc.Hash == "" {
		return fmt.Errorf("%w: step %s, plugin %q: the score names no module", ErrUnavailable, s.ID, sc.Plugin), nil
	}
	r, refusal, err := c.runner(ctx, sc.Hash, sc.Plugin, from, res)
	if err != nil || refusal != nil {
		return refusal, err
	}
	got := r.Replay(ctx, sc.Plugin, s, reward.ReplayOptions{NoConfig: true})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	switch {
	case got.Score.Hash != sc.Hash:
		return nil, fmt.Errorf("verify: the module cached for %s hashes to %s", sc.Hash, got.Score.Hash)
	case got.Judged:
		res.Judged++
		return nil, nil
	case got.Failed:
		return fmt.Errorf("%w: step %s, plugin %q (%s): no verdict on replay: %s", ErrUnusable, s.ID, sc.Plugin, short(sc.Hash), got.Score.Reason), nil
	case !reward.SameVerdict(*sc, got.Score, c.cfg.Tolerance):
		return fmt.Errorf("%w: step %s, plugin %q (%s): recorded %s, replay gives %s", ErrScore, s.ID, sc.Plugin, short(sc.Hash),
			verdict(sc.Value, sc.Hint), verdict(got.Score.Value, got.Score.Hint)), nil
	}
	res.Replayed++
	return nil, nil
}

// runner returns the runner that replays plugin name of module hash,
// loading the module from the cache or fetching it.
func (c *Checker) runner(ctx context.Context, hash, name string, from mesh.PeerID, res *Result) (_ *reward.Runner, refusal, err error) {
	k := pluginKey{hash, name}
	c.tick++
	if l, ok := c.plugins[k]; ok {
		l.used = c.tick
		return l.r, nil, nil
	}
	path, refusal, err := c.module(ctx, hash, name, from, res)
	if err != nil || refusal != nil {
		return nil, refusal, err
	}
	r, err := reward.New(ctx, reward.Options{
		Plugins:        []reward.PluginConfig{{Name: name, Path: path, Enabled: true, Judge: true}},
		CacheDir:       c.cfg.CompileDir,
		Deadline:       c.cfg.Deadline,
		MemoryLimit:    c.cfg.MemoryLimit,
		FailureLimit:   -1,
		Strict:         true,
		FreshInstances: !c.cfg.ReuseInstances,
		Logger:         c.cfg.Logger,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if errors.Is(err, reward.ErrUnusable) {
			return nil, fmt.Errorf("%w: plugin %q (%s): %v", ErrUnusable, name, short(hash), err), nil
		}
		return nil, nil, fmt.Errorf("verify: %w", err)
	}
	if len(c.plugins) >= c.cfg.MaxPlugins {
		c.evict(ctx)
	}
	c.plugins[k] = &loaded{r: r, used: c.tick}
	return r, nil, nil
}

// evict closes the plugin used least lately.
func (c *Checker) evict(ctx context.Context) {
	var old pluginKey
	var at int64 = -1
	for k, l := range c.plugins {
		if at < 0 || l.used < at {
			old, at = k, l.used
		}
	}
	if at >= 0 {
		c.plugins[old].r.Close(ctx)
		delete(c.plugins, old)
	}
}

// module returns the path of module hash in the cache, fetching it from
// the peer first if the cache lacks it (or holds other bytes under its
// name).
func (c *Checker) module(ctx context.Context, hash, name string, from mesh.PeerID, res *Result) (path string, refusal, err error) {
	if !validHash(hash) {
		return "", fmt.Errorf("%w: plugin %q: %q is not a module hash", ErrUnavailable, name, hash), nil
	}
	path = filepath.Join(c.cfg.CacheDir, hash+".wasm")
	if b, err := os.ReadFile(path); err == nil {
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) == hash {
			return path, nil, nil
		}
		c.log.Warn("a cached plugin module does not match its hash; fetching it again", "hash", hash)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", nil, fmt.Errorf("verify: plugin cache: %w", err)
	}
	if c.cfg.Fetch == nil {
		return "", fmt.Errorf("%w: plugin %q (%s): not in the cache, and no fetching", ErrUnavailable, name, short(hash)), nil
	}
	b, err := c.cfg.Fetch(ctx, from, hash, c.cfg.MaxModule)
	if err != nil {
		if ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		return "", fmt.Errorf("%w: plugin %q (%s) from %s: %v", ErrUnavailable, name, short(hash), from, err), nil
	}
	res.Fetched++
	// The fetch checks the hash; so does the cache, whatever the fetch.
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hash {
		return "", fmt.Errorf("%w: plugin %q (%s) from %s: the bytes hash to %x", ErrUnavailable, name, short(hash), from, sum), nil
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return "", nil, fmt.Errorf("verify: plugin cache: %w", err)
	}
	c.log.Info("plugin module fetched", "hash", hash, "plugin", name, "from", from, "bytes", len(b))
	return path, nil, nil
}

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range []byte(h) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

func verdict(v *float64, hint string) string {
	s := "abstain"
	if v != nil {
		s = fmt.Sprintf("%g", *v)
	}
	if hint != "" {
		s += fmt.Sprintf(" hint %q", hint)
	}
	return s
}
