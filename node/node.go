// Package node is a device's clawmesh node. It composes the gateway the
// agent talks to, the DataPool that records every call, the reward runner
// that scores closed steps in the background (its plugins compiled in the
// background too, while the gateway already serves, into a compilation
// cache in the user's cache directory shared by the nodes of the machine,
// and let go after Config.PluginIdle unused), the outbox that seals
// scored steps into scrubbed batches as the sharing policy allows
// (node/share), the admin endpoints that let `clawmesh pool ...` read a pool
// the running node holds, the owner's dashboard at /clawmesh/
// (node/dashboard) and the Prometheus metrics at /metrics. Given no
// upstream, a command can find a local model server with Discover; given
// Config.Serve, the node runs its model server itself (node/modelserver),
// stands in front of it, and stops it when it closes. Given
// Config.Personal, it keeps a personal adapter trained on its own steps
// only (node/personal) and serves it stacked on the mesh's version.
//
// A Node owns its subsystems and closes them in reverse order of opening.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/private"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/gateway"
	"github.com/clawmesh/clawmesh/node/gateway/wire"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/node/session"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

// Defaults.
const (
	DefaultListen        = "127.0.0.1:8400"
	DefaultScoreInterval = 2 * time.Second
	// DefaultMaxScoreBacklog is Config.MaxScoreBacklog's default: about a
	// minute of a heavy burst at the scorer's rate.
	DefaultMaxScoreBacklog = 50000
	// DefaultMaxSessions is Config.MaxSessions's default.
	DefaultMaxSessions   = 10000
	DefaultRetention     = 10 * time.Minute
	DefaultShareInterval = 30 * time.Second
	// DefaultPluginIdle is Config.PluginIdle's default.
	DefaultPluginIdle = 30 * time.Second
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("node: bad config")

// AddrFile is the file in the data directory where a running node writes
// its listen address, so that `clawmesh pool ...` can reach it while the
// node holds the pool.
const AddrFile = "node.addr"

// Config configures a Node. The zero value of each field means its default.
type Config struct {
	// DataDir holds the pool (DataDir/pool) and the plugin compilation cache
	// (DataDir/cache). Required.
	DataDir string
	// Listen is the gateway's address; default 127.0.0.1:8400. A port of 0
	// picks a free one (see Node.Addr).
	Listen string
	// Upstream is the LLM server's base URL including /v1. Required,
	// unless Serve is set.
	Upstream string
	// Serve, if set, is the model server the node runs itself
	// (node/modelserver): the node starts it in New, its upstream is that
	// server (Upstream must be empty, UpstreamKind empty or the server's),
	// adapter versions go into service through it, and Close stops it.
	// Serve.Dir defaults to DataDir (logs in DataDir/logs); its Logger and
	// Route are the node's.
	Serve *modelserver.Config
	// UpstreamKind names the upstream's flavour, which decides what the
	// gateway may ask it for: "openai" (default: logprobs on chat),
	// "vllm" or "sglang" (logprobs and token ids), "clawmesh" (the
	// embedded engine: logprobs and token ids), "ollama", "llamacpp",
	// "mlx" (mlx_lm.server) or "none" (nothing extra).
	UpstreamKind string
	// Token, if set, is required from clients as a bearer token.
	Token string
	// UpstreamToken, if set, replaces the Authorization sent upstream.
	UpstreamToken string
	// AllowedHosts are the host names, beyond loopback names and IP
	// addresses, that clients may reach the gateway by when it has no Token
	// (see gateway.Config.AllowedHosts).
	AllowedHosts []string
	// MaxAge and MaxBytes are the pool's retention policy (0: unlimited),
	// applied at start and every RetentionEvery (default
	// DefaultRetention).
	RetentionEvery time.Duration
	MaxAge         time.Duration
	MaxBytes       int64
	// Plugins are the reward plugins; nil means the built-ins. They are
	// compiled in the background (see PluginsReady). An enabled plugin
	// whose file is missing or not WebAssembly makes New fail, naming it
	// (reward.ErrUnusable); one found unusable as it compiles (missing
	// exports, a start that fails) makes Serve return that error.
	Plugins []reward.PluginConfig
	// PluginDeadline bounds one plugin call, PluginMemoryLimit (bytes) each
	// plugin instance's memory, JudgeTimeout the judge calls of one plugin
	// call; zero means reward's defaults (100 ms, 64 MiB, 30 s).
	PluginDeadline    time.Duration
	PluginMemoryLimit uint64
	JudgeTimeout      time.Duration
	// PluginCache is the directory of the reward plugins' compilation
	// cache; "" means clawmesh/wazero in the user's cache directory
	// (os.UserCacheDir), or cache/wazero in the data directory when there
	// is none. Nodes may share one: what is compiled is kept under a key
	// of the module and the runtime, and written whole. Once the plugins
	// are loaded from a cache elsewhere, a cache/wazero left in the data
	// directory by an earlier version is removed.
	PluginCache string
	// PluginIdle is how long a reward plugin stays loaded (its compiled
	// code and instances, most of an idle node's memory) after its last
	// call; the next call loads it again from the compilation cache (tens
	// of milliseconds per built-in, off the call path: scoring runs in the
	// background). 0 means DefaultPluginIdle; negative keeps the plugins
	// loaded.
	PluginIdle time.Duration
	// MinFree is the free-space guard: below this many bytes free on the
	// data directory's filesystem the node stops recording (and retention
	// may drop shipped steps and tombstones to make room) until there is
	// MinFree and a quarter again. 0 means the smaller of 1 GiB and 5% of
	// the filesystem; negative turns the guard off.
	MinFree int64
	// PoolFS is the filesystem the pool is on (nil: the disk); tests
	// inject disk faults through it.
	PoolFS vfs.FS
	// NoScoring turns the background scorer off.
	NoScoring bool
	// MaxScoreBacklog bounds the scorer's lag: with more closed steps than
	// this waiting, it skips the oldest (counted as shed, logged) and
	// scores them once it has caught up. Default DefaultMaxScoreBacklog.
	MaxScoreBacklog int
	// MaxSessions bounds the conversations the gateway's session tracker
	// holds in memory (the least recently used one is closed and
	// forgotten); with the pool's fixed caches it bounds the node's
	// memory under load. Default DefaultMaxSessions.
	MaxSessions int
	// LogCalls logs one line per proxied call at Info.
	LogCalls bool
	// MaxBody bounds a call's request body (default
	// gateway.DefaultMaxBody, 32 MiB); a larger one is refused with 413.
	MaxBody int64
	// ScoreInterval is how often closed steps are looked for; default 2s.
	ScoreInterval time.Duration
	// IdleTimeout closes a chain after this long without a call; default
	// the session tracker's (30m).
	IdleTimeout time.Duration
	// DrainTimeout is how long, once the node is told to stop, in-flight
	// calls and streams may go on before they are cut; default the
	// gateway's (60s).
	DrainTimeout time.Duration
	// JudgeModel is the model name sent upstream for the reward plugins'
	// judge calls; "" means the model the judged step asked for.
	JudgeModel string
	// Share is the sharing policy: which scored steps leave the device,
	// scrubbed, in outbox batches. A policy with no mode gets
	// share.DefaultMode: scored for a node whose data directory is in a
	// mesh, none for one that is not.
	Share share.Policy
	// Personal is the [personal] policy: a personal adapter trained on
	// this device's steps only, stacked on the mesh's versions (nil: off).
	Personal *PersonalConfig
	// Mesh makes a node whose data directory is in a mesh a mesh peer
	// (nil: the node stays off the network even then).
	Mesh *MeshConfig
	// ShareInterval is how often scored steps are sealed into batches;
	// default 30s.
	ShareInterval time.Duration
	// Adapter reports the adapter version serving now ("" if none).
	Adapter func() string
	Logger  *slog.Logger
	Now     func() time.Time
}

// Caps maps an upstream kind to what the gateway may ask of it.
func Caps(kind string) (wire.Caps, error) {
	switch strings.ToLower(kind) {
	case "", "openai":
		return wire.Caps{Logprobs: true}, nil
	case "vllm", "sglang", "clawmesh":
		return wire.Caps{Logprobs: true, TokenIDs: true}, nil
	case "ollama", "llamacpp", "llama.cpp", "mlx", "none":
		return wire.Caps{}, nil
	}
	return wire.Caps{}, fmt.Errorf("%w: unknown upstream kind %q (want openai, vllm, sglang, clawmesh, ollama, llamacpp, mlx or none)", ErrConfig, kind)
}

// Validate checks c and fills nothing in.
func (c *Config) Validate() error {
	if c.DataDir == "" {
		return fmt.Errorf("%w: no data directory", ErrConfig)
	}
	if c.Serve != nil {
		if err := c.validateServe(); err != nil {
			return err
		}
	} else {
		if c.Upstream == "" {
			return fmt.Errorf("%w: no upstream (e.g. http://127.0.0.1:11434/v1)", ErrConfig)
		}
		if !strings.HasPrefix(c.Upstream, "http://") && !strings.HasPrefix(c.Upstream, "https://") {
			return fmt.Errorf("%w: upstream %q must be an http:// or https:// URL", ErrConfig, c.Upstream)
		}
		if _, err := Caps(c.UpstreamKind); err != nil {
			return err
		}
	}
	if c.ShareInterval < 0 {
		return fmt.Errorf("%w: share interval %v", ErrConfig, c.ShareInterval)
	}
	if c.MaxScoreBacklog < 0 || c.MaxSessions < 0 {
		return fmt.Errorf("%w: negative bound (score backlog %d, sessions %d)", ErrConfig, c.MaxScoreBacklog, c.MaxSessions)
	}
	p := c.Share
	if p.Mode == "" {
		p.Mode = share.DefaultMode(false)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return nil
}

// Node is a running device node.
type Node struct {
	cfg Config
	// adminToken is what the admin API demands over TCP; sessions are the
	// browser sessions opened with login URLs.
	adminToken string
	sessions   *adminapi.Sessions
	log        *slog.Logger
	now        func() time.Time
	pool       *pool.Pool
	plugins    *plugins // nil when scoring is off
	gw         *gateway.Gateway
	outbox     *share.Outbox
	peer       *peer.Peer
	joined     bool
	// weights and follower bring the trainers' adapter versions to the
	// upstream (nil outside a mesh); route is the follower once it runs.
	weights  *weights.Service
	follower *adapters.Follower
	route    atomic.Pointer[adapters.Follower]
	// server is the model server the node runs (nil: none).
	server *modelserver.Server
	// personal keeps the personal adapter (nil: none); lastCall is when
	// the agent's last call ended (unix ns), for its idle windows.
	personal *personal.Manager
	lastCall atomic.Int64

	meshAdmin   sync.Once
	meshHandler http.Handler

	// scoreMu makes one scoring pass at a time, so that the background
	// loop and a direct call never score (and call a judge for) the same
	// step twice.
	scoreMu sync.Mutex
	// handoff holds the steps the gateway closed, for the scorer (see
	// handed); queued names them, so that a pass over the pool leaves
	// them to it rather than score (and call a judge for) them twice.
	handoff  chan *core.Step
	queuedMu sync.Mutex
	queued   map[core.StepID]bool
	// The scorer's counters (see ScorerStats) and, guarded by scoreMu,
	// its cursor.
	scored, shed atomic.Uint64
	backlog      atomic.Int64
	scoreAfter   core.StepID // skip the closed steps up to this one (shed)
	shedHigh     core.StepID // the newest step ever shed: those up to it are counted
	counted      time.Time   // when the backlog was last counted
	shedLogged   time.Time

	metrics *metrics

	mu   sync.Mutex
	addr net.Addr
}

// New opens the node's pool and reward runner and builds its gateway. The
// caller runs it with Run and closes it with Close.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if err := Preflight(ctx, cfg); err != nil {
		return nil, err
	}
	if err := notTrainers(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.ScoreInterval == 0 {
		cfg.ScoreInterval = DefaultScoreInterval
	}
	if cfg.ShareInterval == 0 {
		cfg.ShareInterval = DefaultShareInterval
	}
	if cfg.MaxScoreBacklog == 0 {
		cfg.MaxScoreBacklog = DefaultMaxScoreBacklog
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	switch {
	case cfg.PluginIdle == 0:
		cfg.PluginIdle = DefaultPluginIdle
	case cfg.PluginIdle < 0:
		cfg.PluginIdle = 0 // reward: kept loaded
	}
	in, err := joined(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if cfg.Share.Mode == "" {
		cfg.Share.Mode = share.DefaultMode(in)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, log: log.With("component", "node"), now: cfg.Now, joined: in}
	n.metrics = newMetrics(n)
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: data dir: %w", err)
	}
	// The recorded conversations, keys and tokens are the owner's alone.
	if note, err := private.CheckDataDir(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	} else if note != "" {
		log.Warn("data directory was open to other accounts", "fixed", note)
	}
	// A pool that cannot be opened (damaged, a failing disk) does not take
	// the agent down: the node serves, recording paused, and says what to
	// do.
	poolDir := filepath.Join(cfg.DataDir, datadir.NodeMark)
	p, err := pool.OpenServing(poolDir, pool.Options{
		Logger: log, Now: cfg.Now, MaxAge: cfg.MaxAge, MaxBytes: cfg.MaxBytes, MinFree: minFree(cfg.DataDir, cfg.MinFree),
		FS: cfg.PoolFS,
	})
	if err != nil {
		return nil, err
	}
	if h := p.Health(); h.Damaged {
		log.Error("the pool is damaged: the node serves calls but does not record them",
			"pool", poolDir, "cause", h.Paused,
			"fix", "run `clawmesh pool repair --data "+cfg.DataDir+"`: it moves the damaged pool aside, salvages every step it can read into a fresh one, and this node then records again")
	}
	n.pool = p
	if !cfg.NoScoring {
		plugins := cfg.Plugins
		if plugins == nil {
			plugins = reward.Builtins()
		}
		if err := n.startPlugins(plugins); err != nil {
			n.Close(ctx)
			return nil, err
		}
	}
	key, err := share.LoadKey(cfg.DataDir)
	if err != nil {
		n.Close(ctx)
		return nil, err
	}
	so := share.Options{Pool: p, Key: key, Policy: cfg.Share, Now: cfg.Now, Logger: log}
	if n.plugins != nil {
		// The scores that leave are made again on the scrubbed steps, so
		// that a trainer can replay them (trainer/verify/RATIONALE.md).
		so.Rescore = lazyRescorer{n}
	}
	n.outbox, err = share.New(so)
	if err != nil {
		n.Close(ctx)
		return nil, err
	}
	if err := n.startServer(ctx); err != nil {
		n.Close(ctx)
		return nil, err
	}
	cfg = n.cfg
	caps, _ := Caps(cfg.UpstreamKind)
	n.adminToken, err = adminapi.LoadOrCreateToken(cfg.DataDir)
	if err != nil {
		n.Close(ctx)
		return nil, err
	}
	n.sessions = adminapi.NewSessions(n.adminToken, cfg.Now)
	var closed func(*core.Step) // the scorer takes the steps closed
	if n.plugins != nil {
		n.handoff = make(chan *core.Step, handoffMax)
		n.queued = make(map[core.StepID]bool, handoffMax)
		closed = n.handed
	}
	gw, err := gateway.New(gateway.Config{
		Upstream:        cfg.Upstream,
		Caps:            caps,
		Token:           cfg.Token,
		UpstreamToken:   cfg.UpstreamToken,
		AllowedHosts:    cfg.AllowedHosts,
		Store:           p,
		Sessions:        session.Options{IdleTimeout: cfg.IdleTimeout, MaxSessions: cfg.MaxSessions},
		ShutdownTimeout: cfg.DrainTimeout,
		Route:           n.gatewayRoute,
		Now:             cfg.Now,
		Logger:          log,
		Admin:           n.adminHandler(),
		AdminAuth:       n.sessions.Authorized,
		AdminDenied:     n.sessions.Denied,
		LogCalls:        cfg.LogCalls,
		MaxBodyBytes:    cfg.MaxBody,
		Pages:           n.dashboard(),
		Metrics:         n.metrics.handler(),
		OnCall: func(api core.APIKind, d time.Duration) {
			n.metrics.call(api, d)
			n.called()
		},
		Closed: closed,
	})
	if err != nil {
		n.Close(ctx)
		return nil, err
	}
	n.gw = gw
	if err := n.resume(ctx); err != nil {
		n.Close(ctx)
		return nil, err
	}
	if err := n.startMesh(ctx); err != nil {
		n.Close(ctx)
		return nil, err
	}
	if n.personal, err = n.startPersonal(cfg.Personal, key); err != nil {
		n.Close(ctx)
		return nil, err
	}
	if n.personal != nil {
		n.follower.SetPersonal(n.personal)
	}
	return n, nil
}

// resume hands the steps left open on disk to the gateway: the previous
// run (stopped, or killed) recorded them, and their chains may go on now.
// Those idle past the timeout close, as they would have in a running node;
// open steps that cannot be continued (side turns, replies with no choice,
// steps imported open) close without a next state.
func (n *Node) resume(ctx context.Context) error {
	open, err := n.pool.List(ctx, pool.Filter{State: core.StateOpen})
	if errors.Is(err, pool.ErrPaused) {
		return nil // nothing to resume from a store that cannot be read
	}
	if err != nil {
		return fmt.Errorf("node: listing open steps: %w", err)
	}
	if len(open) == 0 {
		return nil
	}
	sort.Slice(open, func(i, j int) bool { return open[i].ID < open[j].ID })
	var resumable []*core.Step
	closed := 0
	for _, st := range open {
		if st.Source == "gateway" && st.Turn != core.TurnSide && len(st.Response.Choices) > 0 {
			resumable = append(resumable, st)
			continue
		}
		err := n.pool.Update(ctx, st.ID, func(s *core.Step) error {
			if s.State == core.StateOpen {
				s.State = core.StateClosed
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node: closing step %s left open: %w", st.ID, err)
		}
		closed++
	}
	resumed := n.gw.Resume(ctx, resumable)
	n.log.Info("steps left open by the previous run", "resumed", resumed, "closed", closed)
	return nil
}

// Pool returns the node's DataPool.
func (n *Node) Pool() *pool.Pool { return n.pool }

// Addr is the gateway's listen address once Run has bound it, else nil.
func (n *Node) Addr() net.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addr
}

// Run listens on cfg.Listen and serves until ctx is done; in-flight
// requests and streams are allowed to finish before it returns.
func (n *Node) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", n.cfg.Listen)
	if err != nil {
		return fmt.Errorf("node: listen: %w", err)
	}
	return n.Serve(ctx, ln)
}

// Serve is Run on a listener the caller made.
func (n *Node) Serve(ctx context.Context, ln net.Listener) error {
	n.mu.Lock()
	n.addr = ln.Addr()
	n.mu.Unlock()
	addrPath := filepath.Join(n.cfg.DataDir, AddrFile)
	if err := adminapi.WriteAddr(n.cfg.DataDir, AddrFile, ln.Addr().String()); err != nil {
		n.log.Warn("cannot write address file", "err", err)
	}
	defer os.Remove(addrPath)
	n.log.Info("gateway listening", "addr", ln.Addr().String(), "upstream", n.cfg.Upstream)
	if n.outbox != nil {
		n.log.Info("sharing: " + n.outbox.Policy().Summary())
	}

	// A plugin set that cannot be loaded, found in the background, stops
	// the gateway (cause).
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	// The owner's way in: the admin API on a socket only they can open.
	sock, err := adminapi.ServeSocket(bg, n.cfg.DataDir, n.adminHandler())
	if err != nil {
		n.log.Warn("no admin socket: commands reach the node over TCP with DATA/admin.token", "err", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if w := ProbeUpstream(bg, n.cfg.Upstream, n.cfg.UpstreamToken); w != "" && bg.Err() == nil {
			n.log.Warn(w)
		}
	}()
	if n.plugins != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.runner(bg); err != nil {
				if bg.Err() == nil && !errors.Is(err, errStopped) {
					fail(err)
				}
				return
			}
			n.scoreLoop(bg)
		}()
	}
	if n.cfg.MaxAge > 0 || n.cfg.MaxBytes > 0 || n.cfg.MinFree >= 0 {
		wg.Add(1)
		go func() { defer wg.Done(); n.retentionLoop(bg) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); n.shareLoop(bg) }()
	if n.peer != nil {
		wg.Add(1)
		go func() { defer wg.Done(); n.runMesh(bg) }()
	}
	if n.weights != nil {
		wg.Add(1)
		go func() { defer wg.Done(); n.runWeights(bg) }()
	}
	if n.personal != nil {
		wg.Add(1)
		go func() { defer wg.Done(); n.personal.Run(bg) }()
	}
	err = n.gw.Run(ctx, ln)
	stop()
	wg.Wait()
	if sock != nil {
		<-sock
	}
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// Close releases the mesh peer, the model server the node runs, the
// reward runner and the pool, in that order.
func (n *Node) Close(ctx context.Context) error {
	var errs []error
	if n.weights != nil {
		errs = append(errs, n.weights.Close())
	}
	if n.peer != nil {
		errs = append(errs, n.peer.Close())
	}
	if n.server != nil {
		errs = append(errs, n.server.Close())
	}
	errs = append(errs, n.closePlugins(ctx))
	if n.pool != nil {
		errs = append(errs, n.pool.Close())
	}
	return errors.Join(errs...)
}

// ReloadPlugins swaps the reward plugins without a restart: steps being
// scored finish with the old set, later ones use the new. nil means the
// built-ins. If the new set is invalid or an enabled plugin in it cannot be
// loaded (reward.ErrUnusable, naming it), the set in use stays.
func (n *Node) ReloadPlugins(ctx context.Context, plugins []reward.PluginConfig) error {
	r, err := n.runner(ctx)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("node: scoring is off")
	}
	if plugins == nil {
		plugins = reward.Builtins()
	}
	return r.Reload(ctx, plugins)
}

// scoreLoop scores closed steps until ctx is done: those the gateway hands
// over as it closes them (see handed), as they come, without reading them
// back from the pool; and a pass over the pool's closed steps every
// ScoreInterval, passes back to back while a backlog remains (steps closed
// before the plugins were ready, or while the hand-off queue was full, or
// by feedback, and the backlog past MaxScoreBacklog: shedBacklog).
func (n *Node) scoreLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.ScoreInterval)
	defer t.Stop()
	logErr := func(err error) {
		if err != nil && ctx.Err() == nil && !errors.Is(err, pool.ErrPaused) {
			n.log.Warn("scoring", "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-n.handoff:
			// Closed by the gateway just now: scored as they come.
			_, err := n.scoreHanded(ctx, s)
			logErr(err)
			continue
		case <-t.C:
		}
		for range 1 << 20 { // passes back to back while a backlog remains
			// The steps handed over meanwhile first: they are not read
			// back, and a pass over the pool would meet them again.
			for range handoffMax/scoreBatch + 1 {
				if k, err := n.scoreHanded(ctx, nil); err != nil || k < scoreBatch {
					logErr(err)
					break
				}
			}
			done, err := n.ScoreClosed(ctx, scoreBatch)
			if err != nil && ctx.Err() == nil && !errors.Is(err, pool.ErrPaused) {
				n.log.Warn("scoring", "err", err)
			}
			if err != nil || done < scoreBatch || ctx.Err() != nil {
				break
			}
		}
	}
}

// scoreBatch is how many closed steps one scoring pass takes: they are
// scored in parallel and marked scored without waiting for the disk, by
// scoreWriters at once.
const (
	scoreBatch   = 256
	scoreWriters = 16
)

// ScorerStats are the background scorer's counters since start.
type ScorerStats struct {
	// Scored counts the steps scored and marked scored.
	Scored uint64 `json:"scored"`
	// Backlog is how many closed steps wait to be scored, when last
	// counted (at each pass).
	Backlog int `json:"backlog"`
	// Shed counts the closed steps the scorer skipped because the backlog
	// was over MaxScoreBacklog, each once: they stay closed and are scored
	// once it has caught up.
	Shed uint64 `json:"shed"`
	// MaxBacklog is the bound on the backlog (Config.MaxScoreBacklog).
	MaxBacklog int `json:"max_backlog"`
	// Ready: the reward plugins are compiled and the scorer runs (false
	// while they compile, at a node's first start, and with scoring off).
	Ready bool `json:"ready"`
}

// Scorer returns the scorer's counters.
func (n *Node) Scorer() ScorerStats {
	st := ScorerStats{Scored: n.scored.Load(), Backlog: int(n.backlog.Load()), Shed: n.shed.Load(), MaxBacklog: n.cfg.MaxScoreBacklog}
	if n.plugins != nil {
		select {
		case <-n.plugins.ready:
			st.Ready = n.plugins.err == nil
		default:
		}
	}
	return st
}

// ScoreClosed scores up to limit closed steps, oldest first, and marks them
// scored. The steps are scored in parallel (one worker a core; the reward
// runner is safe for concurrent use) and written without waiting for the
// disk (see pool.ApplyUnsynced). It returns how many it took.
func (n *Node) ScoreClosed(ctx context.Context, limit int) (int, error) {
	rn, err := n.runner(ctx)
	if err != nil || rn == nil {
		return 0, err
	}
	return n.scoreClosed(ctx, rn, limit)
}

// scoreClosed is ScoreClosed with the runner in hand.
func (n *Node) scoreClosed(ctx context.Context, rn *reward.Runner, limit int) (int, error) {
	n.scoreMu.Lock()
	defer n.scoreMu.Unlock()
	if err := n.shedBacklog(ctx); err != nil {
		return 0, err
	}
	steps, err := n.pool.List(ctx, pool.Filter{State: core.StateClosed, After: n.scoreAfter, Limit: limit})
	if err == nil && len(steps) == 0 && n.scoreAfter != "" {
		// Caught up: the steps skipped under load come next.
		n.scoreAfter = ""
		steps, err = n.pool.List(ctx, pool.Filter{State: core.StateClosed, Limit: limit})
	}
	if errors.Is(err, pool.ErrNotFound) && n.scoreAfter != "" {
		n.scoreAfter = "" // the cursor's step is gone
		steps, err = n.pool.List(ctx, pool.Filter{State: core.StateClosed, Limit: limit})
	}
	if err != nil {
		return 0, err
	}
	taken := len(steps)
	if n.handoff != nil {
		n.queuedMu.Lock()
		steps = slices.DeleteFunc(steps, func(s *core.Step) bool { return n.queued[s.ID] })
		n.queuedMu.Unlock()
	}
	if _, err := n.scoreSteps(ctx, rn, steps); err != nil {
		return 0, err
	}
	return taken, nil
}

// scoreSteps scores steps, closed, in parallel, and marks them scored
// (those still closed). It returns how many it took. The caller holds
// scoreMu.
func (n *Node) scoreSteps(ctx context.Context, rn *reward.Runner, steps []*core.Step) (int, error) {
	rewards := make([]core.Reward, len(steps))
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range min(runtime.GOMAXPROCS(0), len(steps)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(steps) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				rewards[i] = rn.Score(withStepModel(ctx, steps[i]), steps[i])
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	changes := make([]pool.Change, len(steps))
	applied := make([]bool, len(steps)) // the step was still closed
	for i, s := range steps {
		changes[i] = pool.Change{ID: s.ID, Fn: markScored(rewards[i], &applied[i])}
	}
	// Unsynced, a step at a time, several at once: a verdict lost in a
	// crash is made again (the step is still closed on disk); the
	// gateway's writes, which are synced and may hold many steps' write
	// locks through an fsync, hold up one of these at a time, not the pass.
	var werr error
	var errOnce sync.Once
	next.Store(0)
	for range min(scoreWriters, len(changes)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(changes); i = int(next.Add(1) - 1) {
				err := n.pool.ApplyUnsynced(ctx, changes[i:i+1])
				if err != nil && !errors.Is(err, pool.ErrNotFound) {
					errOnce.Do(func() { werr = err })
					return
				}
				if err == nil && applied[i] {
					s := steps[i]
					n.metrics.reward(&rewards[i])
					n.log.Debug("step scored", "step", s.ID, "session", s.SessionID, "adapter", s.Adapter, "reward", rewardAttr(rewards[i].Value))
				}
			}
		}()
	}
	wg.Wait()
	if werr != nil {
		return 0, werr
	}
	for _, a := range applied {
		if a {
			n.scored.Add(1)
		}
	}
	return len(steps), nil
}

// handed takes a step the gateway has just closed, for the scorer, which
// then need not read it back from the pool; with handoffMax waiting it is
// left to the scorer's passes over the pool.
func (n *Node) handed(s *core.Step) {
	n.queuedMu.Lock()
	defer n.queuedMu.Unlock()
	select {
	case n.handoff <- s:
		n.queued[s.ID] = true
	default:
	}
}

// handoffMax bounds the closed steps handed to the scorer and waiting for
// it: a step holds what the pool's caches do not (a long system prompt
// the caches have let go), so the queue is part of the node's memory
// bound.
const handoffMax = 1024

// scoreHanded scores the steps waiting in the hand-off queue, first (if
// not nil), up to scoreBatch, and reports how many it took.
func (n *Node) scoreHanded(ctx context.Context, first *core.Step) (int, error) {
	steps := make([]*core.Step, 0, scoreBatch)
	if first != nil {
		steps = append(steps, first)
	}
	for len(steps) < scoreBatch {
		select {
		case s := <-n.handoff:
			steps = append(steps, s)
			continue
		default:
		}
		break
	}
	if len(steps) == 0 {
		return 0, nil
	}
	// Scored or not, they are no longer queued: one not scored here is
	// still closed in the pool, for the next pass.
	defer func() {
		n.queuedMu.Lock()
		for _, s := range steps {
			delete(n.queued, s.ID)
		}
		n.queuedMu.Unlock()
	}()
	rn, err := n.runner(ctx)
	if err != nil || rn == nil {
		return 0, err
	}
	n.scoreMu.Lock()
	defer n.scoreMu.Unlock()
	return n.scoreSteps(ctx, rn, steps)
}

// markScored is the change that marks a closed step scored with r, and
// sets *applied; a step no longer closed is left as it is.
func markScored(r core.Reward, applied *bool) func(*core.Step) error {
	return func(st *core.Step) error {
		if st.State != core.StateClosed {
			return nil
		}
		st.Reward = &r
		st.State = core.StateScored
		*applied = true
		return nil
	}
}

// shedBacklog counts the closed steps waiting (at most once a second);
// over MaxScoreBacklog, the scorer skips the oldest of them beyond the
// bound and goes on with the newest MaxScoreBacklog, so that its lag stays
// bounded. The skipped steps stay closed and are scored once the scorer
// has caught up (see ScoreClosed); skipping is counted (Shed) and logged,
// at most once a minute. The caller holds scoreMu.
func (n *Node) shedBacklog(ctx context.Context) error {
	now := n.now()
	if !n.counted.IsZero() && now.Sub(n.counted) < time.Second {
		return nil
	}
	n.counted = now
	c, skip, err := n.pool.Backlog(ctx, core.StateClosed, n.scoreAfter, n.cfg.MaxScoreBacklog)
	if errors.Is(err, pool.ErrNotFound) { // the cursor's step is gone
		n.scoreAfter = ""
		c, skip, err = n.pool.Backlog(ctx, core.StateClosed, "", n.cfg.MaxScoreBacklog)
	}
	if err != nil {
		return err
	}
	n.backlog.Store(int64(min(c, n.cfg.MaxScoreBacklog)))
	if skip == "" {
		return nil
	}
	// Shed counts steps, each once: once caught up, the scorer goes back
	// to the steps it skipped, and may skip some of them again; only those
	// newer than any shed before are new.
	shed := c - n.cfg.MaxScoreBacklog
	if n.shedHigh != "" && n.shedHigh != n.scoreAfter {
		newer, _, err := n.pool.Backlog(ctx, core.StateClosed, n.shedHigh, n.cfg.MaxScoreBacklog)
		if err != nil && !errors.Is(err, pool.ErrNotFound) {
			return err
		}
		if err == nil {
			shed = max(0, newer-n.cfg.MaxScoreBacklog)
		}
	}
	n.shed.Add(uint64(shed))
	if shed > 0 {
		n.shedHigh = skip
	}
	n.scoreAfter = skip
	if now.Sub(n.shedLogged) >= time.Minute {
		n.shedLogged = now
		n.log.Warn("the scorer is behind: the oldest closed steps wait until it has caught up",
			"waiting", c, "skipped", shed, "shed_total", n.shed.Load(), "max_score_backlog", n.cfg.MaxScoreBacklog)
	}
	return nil
}

// Outbox returns the node's outbox.
func (n *Node) Outbox() *share.Outbox { return n.outbox }

// ReloadShare replaces the sharing policy for the batches sealed from now
// on; a policy with no mode gets the default. An invalid policy is refused
// and the one in force stays.
func (n *Node) ReloadShare(p share.Policy) error {
	if p.Mode == "" {
		p.Mode = share.DefaultMode(n.joined)
	}
	return n.outbox.SetPolicy(p)
}

// shareLoop seals scored steps into outbox batches, as the policy in force
// allows, until ctx is done.
func (n *Node) shareLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.ShareInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := n.outbox.SealAll(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, pool.ErrPaused) {
			n.log.Warn("sealing outbox batches", "err", err)
		}
	}
}

// retentionLoop applies the retention policy at start and every
// RetentionEvery, and, while the free-space guard holds writes back, at
// once and then every lowSpaceRetry, so that room is made (shipped steps
// and tombstones dropped) without waiting for the next period.
func (n *Node) retentionLoop(ctx context.Context) {
	every := n.cfg.RetentionEvery
	if every <= 0 {
		every = DefaultRetention
	}
	t := time.NewTicker(every)
	defer t.Stop()
	space := time.NewTicker(min(every, lowSpaceCheck))
	defer space.Stop()
	run := func() {
		if d, err := n.pool.ApplyRetention(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, pool.ErrPaused) {
			n.log.Warn("retention", "err", err)
		} else if d > 0 {
			n.log.Info("retention dropped steps", "n", d)
		}
	}
	lowRun := time.Time{} // when retention last ran for the guard
	for first := true; ; first = false {
		low := n.pool.LowSpace()
		switch {
		case low && (lowRun.IsZero() || n.now().Sub(lowRun) >= lowSpaceRetry):
			lowRun = n.now()
			run()
		case !low:
			lowRun = time.Time{}
			if first && (n.cfg.MaxAge > 0 || n.cfg.MaxBytes > 0) {
				run()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-space.C:
		case <-t.C:
			if !n.pool.LowSpace() && (n.cfg.MaxAge > 0 || n.cfg.MaxBytes > 0) {
				run()
			}
		}
	}
}

// lowSpaceCheck is how often the retention loop looks at the free-space
// guard; lowSpaceRetry how often it applies retention while the guard
// holds writes back (each run under the guard compacts the store).
const (
	lowSpaceCheck = 5 * time.Second
	lowSpaceRetry = time.Minute
)

// minFree is the free-space guard's low-water mark for a data directory:
// set (positive), off (negative), or the smaller of 1 GiB and 5% of its
// filesystem.
func minFree(dir string, set int64) int64 {
	if set != 0 {
		return max(set, 0)
	}
	du, err := vfs.Default.GetDiskUsage(dir)
	if err != nil {
		return 0
	}
	return min(1<<30, int64(du.TotalBytes/20))
}

// AdminToken is the credential the node's admin API demands (the data
// directory's admin.token), for programs that embed a node.
func (n *Node) AdminToken() string { return n.adminToken }

// ReadAddr returns the address a running node wrote into dataDir.
func ReadAddr(dataDir string) (string, error) { return adminapi.ReadAddr(dataDir, AddrFile) }

var _ http.Handler = (*gateway.Gateway)(nil)
