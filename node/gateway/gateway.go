// Package gateway owns the node's recording LLM proxy: the OpenAI- and
// Anthropic-compatible HTTP endpoint an agent points its base URL at. Every
// call is forwarded to the configured upstream, streamed back chunk by chunk
// with no buffering, and recorded as a core.Step in a Store; calls are tied
// into sessions and chains by node/session, whose closures (next states) the
// gateway writes back to the Store. A Responses call that names a
// previous_response_id is recorded with the conversation that response ended
// (remembered for the most recent responses), not only the input it sends.
//
// Wire formats (SSE framing, the three APIs' JSON) live in the sse and wire
// sub-packages; this package adds HTTP, identity, safety and recording.
//
// Recording never breaks the agent: if the Store fails, the client's response
// still completes, the error is logged and counted (Stats.RecordFailures,
// Stats.Unrecorded). A Store that says recording is paused (Pauser) is not
// called at all, and a store call the reply waits for is given
// Config.StoreTimeout, after which the reply goes out unrecorded: a wedged
// store never holds a reply. The cause is logged once, then at most once a
// minute, and served at /clawmesh/v1/health.
// When the Store works, a step is on disk before the client's response
// completes: the terminal event of a stream ([DONE], message_stop,
// response.completed) and the whole body of a non-streaming reply are held
// back until the step is stored (Store.Put, or Applier.Apply together with
// the next state it gives the step it continues: one synced write). Steps
// closed for other reasons (idle, evicted) are written off the reply path,
// without waiting for the disk where the Store can (UnsyncedApplier). Each
// step a closure closed is then handed, as written, to Config.Closed (the
// node's scorer).
package gateway

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/wire"
	"github.com/clawmesh/clawmesh/node/session"
	"github.com/clawmesh/clawmesh/pool"
)

// Store is where steps are recorded. *pool.Pool satisfies it. Put must be
// durable when it returns. Update must report an unknown id with an error
// wrapping pool.ErrNotFound for the feedback endpoint to answer 404.
type Store interface {
	Put(ctx context.Context, s *core.Step) error
	Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error
}

// Applier is a Store that writes puts and changes in one durable commit, all
// or nothing (*pool.Pool does). With one, a call that continues a chain
// costs one synced write (its step and its parent's next state together)
// instead of two in series, and closures written in the background share
// one.
type Applier interface {
	Apply(ctx context.Context, puts []*core.Step, changes []pool.Change) error
}

// Pauser is a Store that can say that recording is paused (*pool.Pool
// does: its store failed and is being reopened, or the disk is nearly
// full). While it is, calls are proxied and not recorded.
type Pauser interface {
	Health() pool.Health
}

// Errors returned by New.
var (
	ErrConfig = errors.New("gateway: invalid config")
)

// Config configures a Gateway. The zero value of every field but Upstream
// and Store means its default.
type Config struct {
	// Upstream is the upstream base URL including /v1, e.g.
	// http://127.0.0.1:11434/v1 (required).
	Upstream string
	// Caps says what the upstream can give (logprobs, token ids); the
	// gateway asks for them and strips them from what the client did not
	// ask for.
	Caps wire.Caps
	// Token, if set, must be presented by clients as
	// "Authorization: Bearer <Token>" or "x-api-key: <Token>"; the header
	// that carried it is not forwarded upstream. If empty, the client's own
	// Authorization is forwarded upstream unchanged.
	Token string
	// UpstreamToken, if set, replaces the Authorization sent upstream
	// ("Bearer <UpstreamToken>").
	UpstreamToken string
	// AllowedHosts are host names, beyond loopback names and IP addresses,
	// that clients may reach the gateway by (the Host header) when it has no
	// Token; other names are refused with 403 so that a DNS-rebound web page
	// cannot use it. With a Token every name is accepted.
	AllowedHosts []string
	// MaxBodyBytes bounds the bodies of API calls and feedback (default 32
	// MiB); larger → 413. The admin API (pool import) streams and is not bound.
	MaxBodyBytes int64
	// ReadHeaderTimeout bounds reading request headers (default 10s).
	ReadHeaderTimeout time.Duration
	// StreamIdleTimeout cuts an upstream reply silent this long (default
	// 5m). Replies that keep flowing are never cut: there is no overall
	// deadline.
	StreamIdleTimeout time.Duration
	// ReplyTimeout bounds a non-streaming call (default 30m): its upstream
	// is silent until the whole reply is ready, which for a long generation
	// on a slow local model takes longer than StreamIdleTimeout.
	ReplyTimeout time.Duration
	// ShutdownTimeout is how long in-flight requests may run once Run's
	// context is done (default 60s); after it they are cut.
	ShutdownTimeout time.Duration
	// StoreTimeout bounds each store call a reply waits for (default 10s);
	// past it the reply is released and the call counted unrecorded.
	StoreTimeout time.Duration
	// Store records steps (required).
	Store Store
	// Closed, if set, is given each step the gateway closed by writing its
	// closure (its next state), as written, once the write has returned:
	// the node's scorer then scores it without reading it back. It must
	// not block, and must not change the step.
	Closed func(*core.Step)
	// Sessions configures the session tracker.
	Sessions session.Options
	// Adapter returns the adapter version serving now, recorded per step
	// (nil: none).
	Adapter func() string
	// Route, if set, is read once per recorded call and supersedes
	// Adapter: the call goes to Route.Model (the name an adapter version
	// was loaded under; "" keeps the client's model) and its step records
	// Route.Adapter. A call in flight keeps the route it started with.
	Route func() Route
	// Now is the clock (default time.Now).
	Now func() time.Time
	// NewID makes step ids (default: time-sortable ids, 48-bit
	// milliseconds then 80 random bits, base32).
	NewID func() core.StepID
	// Logger receives the gateway's logs (nil: discarded).
	Logger *slog.Logger
	// Transport carries upstream requests (default: a keep-alive transport
	// with many idle connections per host and no compression negotiation).
	Transport http.RoundTripper
	// LogCalls logs one line per proxied call (API, model, session, status,
	// stream or not, duration, step id) at Info.
	LogCalls bool
	// Admin, if set, serves /clawmesh/v1/* paths other than feedback.
	Admin http.Handler
	// AdminAuth, if set, is the only judge of who may use Admin's paths
	// (the owner's token or browser session, not the gateway's Token),
	// except adminapi.LoginPath, which Admin serves to anyone: it checks
	// its own single-use code. Without it those paths take the gateway's
	// Token like every other path.
	AdminAuth func(*http.Request) bool
	// AdminDenied, if set, may answer a request AdminAuth refused (a
	// browser's, with a page that says how to log in) and reports whether
	// it did; otherwise the gateway answers with a JSON error.
	AdminDenied func(http.ResponseWriter, *http.Request) bool
	// TickInterval is how often Run lets idle chains time out (default 30s).
	TickInterval time.Duration
	// Pages, if set, serves the owner's pages outside the API: /clawmesh/
	// and the paths under it other than /clawmesh/v1/ (the node's
	// dashboard). They are admin paths: AdminAuth judges who may see them.
	Pages http.Handler
	// Metrics, if set, serves GET /metrics (Prometheus text), to whoever
	// may call the API: the gateway's Token if it has one.
	Metrics http.Handler
	// OnCall, if set, is told of each recorded call once its reply is done:
	// the API and how long the call took in the gateway. It runs on the
	// call's goroutine and must be cheap (an atomic histogram update).
	OnCall func(api core.APIKind, d time.Duration)
	// HopID is the id this gateway adds to HopHeader of every call it
	// forwards, and refuses a call that already carries (a loop of
	// gateways: see loop.go). Default: random, one per gateway.
	HopID string
}

const (
	DefaultStoreTimeout = 10 * time.Second
	DefaultMaxBody      = 32 << 20
	maxEventBytes       = 64 << 20
	maxUpstreamBody     = 1 << 30
	defaultTickInterval = 30 * time.Second
)

func (c *Config) validate() error {
	if c.Upstream == "" {
		return fmt.Errorf("%w: Upstream is required", ErrConfig)
	}
	u, err := url.Parse(c.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: Upstream %q is not an http(s) URL", ErrConfig, c.Upstream)
	}
	if c.Store == nil {
		return fmt.Errorf("%w: Store is required", ErrConfig)
	}
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": c.ReadHeaderTimeout, "StreamIdleTimeout": c.StreamIdleTimeout, "ReplyTimeout": c.ReplyTimeout,
		"ShutdownTimeout": c.ShutdownTimeout, "TickInterval": c.TickInterval, "StoreTimeout": c.StoreTimeout} {
		if d < 0 {
			return fmt.Errorf("%w: %s is negative", ErrConfig, name)
		}
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: MaxBodyBytes is negative", ErrConfig)
	}
	if strings.ContainsAny(c.HopID, ", \t\r\n") {
		return fmt.Errorf("%w: HopID %q has a comma or a space", ErrConfig, c.HopID)
	}
	return nil
}

// Route is where a recorded call goes: the model name to send upstream
// ("" keeps the client's) and the adapter version that serves it.
type Route struct {
	Model, Adapter string
	// Upstream, if set, replaces Config.Upstream for the call (a base URL
	// with /v1): a node that runs two model servers while it swaps one for
	// the other routes each call wholly to one of them.
	Upstream string
	// Fields, if set, is a JSON object whose members are set in the body
	// sent upstream (mlx_lm.server's "adapters": the adapter directory the
	// call is served with).
	Fields string
}

// base returns the upstream base URL a call on r goes to.
func (g *Gateway) base(r Route) string {
	if r.Upstream != "" {
		return strings.TrimRight(r.Upstream, "/")
	}
	return g.upstream
}

// Stats are the gateway's counters since New.
type Stats struct {
	Requests           uint64 // requests served (all routes)
	Recorded           uint64 // steps put to the Store
	RecordFailures     uint64 // Store.Put or closure updates that failed
	UpstreamFailures   uint64 // upstream unreachable, timed out or cut
	ClientDisconnected uint64 // recorded calls the client abandoned
	// Unrecorded counts calls served but not recorded: recording was
	// paused, the store failed, or it did not answer within StoreTimeout.
	Unrecorded uint64
	// ClosuresWaiting is how many closures (a step's next state, or its
	// end without one: idle, evicted) wait for the background writer.
	ClosuresWaiting int
	// ClosuresDropped counts closures not written because that queue was
	// full (laterMax, under a sustained overload): their steps stay open
	// until the node next starts, which closes them.
	ClosuresDropped uint64
	// Loops counts the calls refused with 508 Loop Detected: they had
	// come back to this gateway (loop.go).
	Loops uint64
}

// Gateway is the recording proxy. It is an http.Handler; Run serves it.
type Gateway struct {
	cfg      Config
	upstream string // without trailing slash
	log      *slog.Logger
	client   *http.Client

	mu    sync.Mutex // guards tr and convs
	tr    *session.Tracker
	convs conversations

	wg sync.WaitGroup // handlers and the closure writer in flight

	// later holds closures waiting for the background writer; writing is
	// true while it runs.
	laterMu      sync.Mutex
	later        []session.Closure
	writing      bool
	laterDropped atomic.Uint64
	laterWarned  time.Time // when a drop was last logged

	requests, recorded, recordFailures, upstreamFailures, disconnected, unrecorded atomic.Uint64
	// loops counts the calls refused as having come round a loop of
	// gateways; loopWarned is when that was last logged.
	loops      atomic.Uint64
	loopWarned atomic.Int64

	// pauseLog throttles the log of unrecorded calls; see noteUnrecorded.
	pauseLog struct {
		sync.Mutex
		cause    string
		last     time.Time
		since    uint64 // unrecorded calls since last
		inPause  bool
		resumeAt time.Time
	}
}

// New validates cfg, fills in defaults and returns a Gateway.
func New(cfg Config) (*Gateway, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBody
	}
	if cfg.ReadHeaderTimeout == 0 {
		cfg.ReadHeaderTimeout = 10 * time.Second
	}
	if cfg.StreamIdleTimeout == 0 {
		cfg.StreamIdleTimeout = 5 * time.Minute
	}
	if cfg.ReplyTimeout == 0 {
		cfg.ReplyTimeout = 30 * time.Minute
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 60 * time.Second
	}
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = defaultTickInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NewID == nil {
		now := cfg.Now
		cfg.NewID = func() core.StepID { return NewStepID(now()) }
	}
	if cfg.Adapter == nil {
		cfg.Adapter = func() string { return "" }
	}
	if cfg.Route == nil {
		adapter := cfg.Adapter
		cfg.Route = func() Route { return Route{Adapter: adapter()} }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		cfg.Transport = DefaultTransport()
	}
	if cfg.HopID == "" {
		cfg.HopID = newHopID()
	}
	tr, err := session.New(cfg.Sessions)
	if err != nil {
		return nil, fmt.Errorf("%w: sessions: %w", ErrConfig, err)
	}
	return &Gateway{
		cfg:      cfg,
		upstream: strings.TrimRight(cfg.Upstream, "/"),
		log:      cfg.Logger.With("component", "gateway"),
		client:   &http.Client{Transport: cfg.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		tr:       tr,
	}, nil
}

// DefaultTransport is the upstream transport used when Config.Transport is
// nil: keep-alives, many idle connections per host, no proxy from the
// environment and no transparent compression (the gateway must see the
// upstream's bytes as they are).
func DefaultTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   true,
	}
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	return Stats{
		Requests:           g.requests.Load(),
		Recorded:           g.recorded.Load(),
		RecordFailures:     g.recordFailures.Load(),
		UpstreamFailures:   g.upstreamFailures.Load(),
		ClientDisconnected: g.disconnected.Load(),
		Unrecorded:         g.unrecorded.Load(),
		ClosuresWaiting:    g.laterLen(),
		ClosuresDropped:    g.laterDropped.Load(),
		Loops:              g.loops.Load(),
	}
}

func (g *Gateway) laterLen() int {
	g.laterMu.Lock()
	defer g.laterMu.Unlock()
	return len(g.later)
}

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewStepID returns a time-sortable unique id: 48 bits of Unix milliseconds
// then 80 bits from crypto/rand, in lower-case Crockford base32 (26
// characters). Ids made in a later millisecond sort after earlier ones.
func NewStepID(now time.Time) core.StepID {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	rand.Read(b[6:])
	return core.StepID(idEncoding.EncodeToString(b[:]))
}

// Run serves on ln until ctx is done. Then it stops accepting, lets
// in-flight requests and streams finish (up to ShutdownTimeout, then cuts
// them) and returns. Chains still open stay open in the Store: the next run
// Resumes them.
func (g *Gateway) Run(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	tick := time.NewTicker(g.cfg.TickInterval)
	defer tick.Stop()
	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			g.Tick(context.WithoutCancel(ctx))
		case err := <-errc:
			serveErr = err
			break loop
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		g.log.Warn("shutdown timed out; cutting in-flight requests", "err", err)
		srv.Close()
	}
	g.wg.Wait()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// Resume makes steps that an earlier run recorded and left open (the
// node stopped or crashed before their chains went on) continuable again:
// a call that continues one supplies its next state as if the gateway had
// never stopped. steps must be open main steps, oldest first; others are
// skipped. Those whose idle timeout has passed close now, without a next
// state. Call it before Run. It reports how many steps it restored.
func (g *Gateway) Resume(ctx context.Context, steps []*core.Step) int {
	var cl []session.Closure
	n := 0
	g.mu.Lock()
	for _, st := range steps {
		if st.State != core.StateOpen || st.Turn == core.TurnSide || len(st.Response.Choices) == 0 {
			continue
		}
		actions := make([]core.Message, len(st.Response.Choices))
		for i, c := range st.Response.Choices {
			actions[i] = c.Message
		}
		cl = append(cl, g.tr.Restore(session.Restored{
			StepID: st.ID, Session: st.SessionID, Chain: st.ChainID, Parent: st.ParentID, Turn: st.Turn,
			TraceID: st.TraceID, Messages: st.Request.Messages, Actions: actions,
			Completed: st.Timings.Start.Add(st.Timings.Total),
		})...)
		n++
	}
	cl = append(cl, g.tr.Tick(g.cfg.Now())...)
	g.mu.Unlock()
	g.applyClosures(ctx, cl)
	return n
}

// Tick lets idle chains time out now and writes their closures. Run calls it
// every TickInterval.
func (g *Gateway) Tick(ctx context.Context) {
	g.mu.Lock()
	cl := g.tr.Tick(g.cfg.Now())
	g.mu.Unlock()
	g.applyClosures(ctx, cl)
}

// applyClosures writes closures to the Store: the next state, and State
// closed if the step is still open. With an Applier they go in one commit;
// if that fails (a step is missing), one by one, so that the others land.
func (g *Gateway) applyClosures(ctx context.Context, cl []session.Closure) {
	if len(cl) == 0 {
		return
	}
	if cause := g.pausedCause(); cause != "" {
		g.log.Debug("recording paused: closures not written", "n", len(cl), "cause", cause)
		return
	}
	if a, ok := g.cfg.Store.(Applier); ok && len(cl) > 1 {
		changes, closed := g.closureChanges(cl)
		if g.storeCall(ctx, func(ctx context.Context) error { return a.Apply(ctx, nil, changes) }) == nil {
			g.handOver(closed)
			return
		}
	}
	for _, c := range cl {
		var closed *core.Step
		err := g.storeCall(ctx, func(ctx context.Context) error {
			return g.cfg.Store.Update(ctx, c.StepID, closeWith(c.NextState, &closed))
		})
		if errors.Is(err, pool.ErrPaused) {
			return
		}
		if err != nil {
			g.recordFailures.Add(1)
			g.log.Error("recording a closure failed", "step", c.StepID, "err", err)
			continue
		}
		g.handOver([]*core.Step{closed})
	}
}

// handOver gives Config.Closed the steps a write that has returned closed
// (nil entries: steps the write found closed already).
func (g *Gateway) handOver(closed []*core.Step) {
	if g.cfg.Closed == nil {
		return
	}
	for _, s := range closed {
		if s != nil {
			g.cfg.Closed(s)
		}
	}
}

// UnsyncedApplier is an Applier that can also write changes without
// waiting for the disk (*pool.Pool does): they are durable with the next
// synced write. The closures written in the background (idle, evicted,
// superseded steps) use it: a node that dies first finds those steps open
// and closes them again as it resumes, and they must not hold their
// steps' write locks (which the calls' synced writes and the scorer need)
// through an fsync.
type UnsyncedApplier interface {
	ApplyUnsynced(ctx context.Context, changes []pool.Change) error
}

// applyLater writes closures in the background: unsynced where the Store
// can, else as applyClosures does.
func (g *Gateway) applyLater(ctx context.Context, cl []session.Closure) {
	u, ok := g.cfg.Store.(UnsyncedApplier)
	if !ok || g.pausedCause() != "" {
		g.applyClosures(ctx, cl)
		return
	}
	// A step at a time, a few at once, as the scorer writes its verdicts:
	// one commit of many steps takes all their write locks, each behind
	// the calls' synced writes that hold it, and under load that convoy
	// starves the writer (its queue then grows) and stalls those calls.
	var (
		next   atomic.Int64
		paused atomic.Bool
		wg     sync.WaitGroup
	)
	for range min(laterWriters, len(cl)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(cl) && !paused.Load(); i = int(next.Add(1) - 1) {
				c := cl[i]
				var closed *core.Step
				err := g.storeCall(ctx, func(ctx context.Context) error {
					return u.ApplyUnsynced(ctx, []pool.Change{{ID: c.StepID, Fn: closeWith(c.NextState, &closed)}})
				})
				switch {
				case err == nil:
					g.handOver([]*core.Step{closed})
				case errors.Is(err, pool.ErrPaused):
					paused.Store(true)
				default:
					g.recordFailures.Add(1)
					g.log.Error("recording a closure failed", "step", c.StepID, "err", err)
				}
			}
		}()
	}
	wg.Wait()
}

// laterWriters is how many background closures are written at once.
const laterWriters = 4

// errStoreTimeout: a store call did not return within StoreTimeout.
var errStoreTimeout = errors.New("gateway: the store did not answer in time")

// storeCall runs fn, a call of the Store, and waits for it at most
// StoreTimeout: a store that is wedged (a disk that stopped answering) then
// keeps fn's goroutine, not the caller.
func (g *Gateway) storeCall(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.StoreTimeout)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- fn(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done: // it finished as time ran out
			return err
		default:
		}
		return fmt.Errorf("%w (%v)", errStoreTimeout, g.cfg.StoreTimeout)
	}
}

// pausedCause says why recording is paused, if the Store says it is.
func (g *Gateway) pausedCause() string {
	p, ok := g.cfg.Store.(Pauser)
	if !ok {
		return ""
	}
	h := p.Health()
	if h.Recording {
		return ""
	}
	if h.Paused == "" {
		return "paused"
	}
	return h.Paused
}

// noteUnrecorded counts a call served but not recorded, for cause. The
// cause is logged when recording pauses (or the cause changes), then at
// most once a minute with the number of calls left unrecorded meanwhile.
func (g *Gateway) noteUnrecorded(step *core.Step, cause string) {
	g.unrecorded.Add(1)
	pl := &g.pauseLog
	now := g.cfg.Now()
	pl.Lock()
	defer pl.Unlock()
	switch {
	case !pl.inPause || pl.cause != cause:
		pl.inPause, pl.cause, pl.last, pl.since = true, cause, now, 0
		g.log.Error("recording paused: calls are served but not recorded", "cause", cause, "step", step.ID)
	case now.Sub(pl.last) >= time.Minute:
		g.log.Warn("recording still paused", "cause", cause, "unrecorded", pl.since+1, "over", now.Sub(pl.last).Round(time.Second))
		pl.last, pl.since = now, 0
	default:
		pl.since++
	}
}

// noteRecorded counts a recorded call, and logs that recording resumed if
// it was paused.
func (g *Gateway) noteRecorded() {
	g.recorded.Add(1)
	pl := &g.pauseLog
	pl.Lock()
	if pl.inPause {
		pl.inPause = false
		g.log.Info("recording resumed", "unrecorded_total", g.unrecorded.Load())
	}
	pl.Unlock()
}

// Health is what /clawmesh/v1/health answers.
type Health struct {
	// Status is "ok", or "recording_paused" while calls are served but
	// not recorded.
	Status string `json:"status"`
	// Recording is false while recording is paused; Paused then says why
	// ("recording paused: <cause>").
	Recording bool      `json:"recording"`
	Paused    string    `json:"paused,omitempty"`
	Since     time.Time `json:"since,omitzero"`
	// Unrecorded counts the calls served but not recorded since start.
	Unrecorded uint64 `json:"unrecorded"`
	Requests   uint64 `json:"requests"`
	// ClosuresWaiting and ClosuresDropped are Stats' (the background
	// writer's queue, and what it had no room for).
	ClosuresWaiting int    `json:"closures_waiting"`
	ClosuresDropped uint64 `json:"closures_dropped"`
}

// Health reports whether calls are being recorded.
func (g *Gateway) Health() Health {
	h := Health{Status: "ok", Recording: true, Unrecorded: g.unrecorded.Load(), Requests: g.requests.Load(),
		ClosuresWaiting: g.laterLen(), ClosuresDropped: g.laterDropped.Load()}
	if p, ok := g.cfg.Store.(Pauser); ok {
		if ph := p.Health(); !ph.Recording {
			h.Status, h.Recording, h.Paused, h.Since = "recording_paused", false, "recording paused: "+ph.Paused, ph.Since
		}
	}
	return h
}

// closeWith is the change a closure makes to its stored step; it sets
// *closed to the step it closed (left nil for a step no longer open).
func closeWith(ns *core.NextState, closed **core.Step) func(*core.Step) error {
	return func(s *core.Step) error {
		*closed = nil
		if s.State != core.StateOpen {
			return nil
		}
		s.NextState = ns
		s.State = core.StateClosed
		*closed = s
		return nil
	}
}

// closureChanges are the changes that write cl, and where each sets the
// step it closed (see closeWith), to hand over once they are written.
func (g *Gateway) closureChanges(cl []session.Closure) ([]pool.Change, []*core.Step) {
	out := make([]pool.Change, len(cl))
	closed := make([]*core.Step, len(cl))
	for i, c := range cl {
		out[i] = pool.Change{ID: c.StepID, Fn: closeWith(c.NextState, &closed[i])}
	}
	return out, closed
}

// closeLater queues closures for the background writer, starting it if it
// is not running. What queues while it writes goes in its next commit. Run
// waits for it before returning.
func (g *Gateway) closeLater(cl []session.Closure) {
	if len(cl) == 0 {
		return
	}
	g.laterMu.Lock()
	if room := laterMax - len(g.later); len(cl) > room {
		dropped := len(cl) - max(room, 0)
		cl = cl[:len(cl)-dropped]
		g.laterDropped.Add(uint64(dropped))
		if now := time.Now(); now.Sub(g.laterWarned) >= time.Minute {
			g.laterWarned = now
			g.log.Warn("the store is behind: closures dropped, their steps stay open until the node next starts",
				"waiting", len(g.later), "dropped_total", g.laterDropped.Load())
		}
	}
	g.later = append(g.later, cl...)
	start := !g.writing && len(g.later) > 0
	if start {
		g.writing = true
	}
	g.laterMu.Unlock()
	if start {
		g.wg.Add(1)
		go g.writeLater()
	}
}

// laterMax bounds the closures waiting for the background writer (about
// 100 bytes each, more with a next state): past it, under an overload the
// store cannot keep up with, new ones are dropped and counted
// (Stats.ClosuresDropped) rather than held in memory without bound.
var laterMax = 100_000

// laterChunk bounds the closures one background write takes. What queued
// while the writer was behind goes in commits of this size, each well
// within StoreTimeout: one commit of everything that queued during an
// overload (tens of thousands) could outlast it, be abandoned, and leave
// those steps open.
var laterChunk = 512

func (g *Gateway) writeLater() {
	defer g.wg.Done()
	for {
		g.laterMu.Lock()
		n := min(len(g.later), laterChunk)
		if n == 0 {
			g.later = nil
			g.writing = false
			g.laterMu.Unlock()
			return
		}
		cl := slices.Clone(g.later[:n])
		clear(g.later[:n]) // the next states go with this write
		g.later = g.later[n:]
		g.laterMu.Unlock()
		g.applyLater(context.Background(), cl)
	}
}
