package modelserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/node/swap"
)

// Sentinel errors.
var (
	// ErrConfig: the Config is not usable (an unknown kind, no model, a
	// program that cannot be found).
	ErrConfig = errors.New("modelserver: bad config")
	// ErrFailed: the model server did not start, or kept crashing; the
	// message quotes the end of its log.
	ErrFailed = errors.New("modelserver: the model server failed")
	// ErrStopped: the model server was stopped.
	ErrStopped = errors.New("modelserver: stopped")
)

// The kinds of model server a node can run.
const (
	KindLlamaServer = "llama-server" // llama.cpp's llama-server: adapters as GGUF, only at start
	KindMLX         = "mlx"          // mlx-lm's mlx_lm.server: an adapter directory per request
	KindClawmesh    = "clawmesh"     // `clawmesh serve`: swaps one adapter at a time itself
)

// Kinds are the kinds of model server a node can run.
func Kinds() []string { return []string{KindLlamaServer, KindMLX, KindClawmesh} }

// Config configures the model server a node runs. Kind, Model and Dir are
// required; the zero value of every other field means its default.
type Config struct {
	// Kind is the server: KindLlamaServer, KindMLX or KindClawmesh.
	Kind string
	// Model is what it serves: a GGUF file for llama-server, a model
	// directory (or Hugging Face repo) for mlx, a Hugging Face model
	// directory for clawmesh.
	Model string
	// Bin is the server's program. Default: llama-server or mlx_lm.server
	// found on PATH; for clawmesh, this executable (os.Executable).
	Bin string
	// Args are more arguments for the server, after those the node gives
	// (the model, the address, the adapter).
	Args []string
	// Dir holds the servers' logs (Dir/logs/KIND.log, one file per
	// version for llama-server) and llama-server's GGUF adapters
	// (Dir/gguf/vN.gguf).
	Dir string
	// ExportLoRA writes the PEFT adapter in dir as a llama.cpp LoRA GGUF
	// file at out (llama-server only). Default: model/gguf's ExportLoRA,
	// F32, for the architecture of the Model file.
	ExportLoRA func(dir, out string) error
	// Route, if set, is what the gateway routes calls to now. llama-server
	// serves each version from a process of its own; one that the route
	// has left is stopped once the calls in flight on it have finished.
	// Without Route, a server leaves service only by Driver.Unload.
	Route func() swap.Target
	// Timing: every zero field means its default.
	Timing Timing
	Logger *slog.Logger
}

// Timing are the supervisor's delays and bounds.
type Timing struct {
	// StartTimeout bounds how long a started server may take to answer
	// its health check (loading the model) before it counts as failed
	// (default 10m).
	StartTimeout time.Duration
	// Poll is how often the health check is asked (default 1s).
	Poll time.Duration
	// HealthTimeout bounds one health check (default 5s).
	HealthTimeout time.Duration
	// HangAfter: a server that stops answering its health check for this
	// long is killed and restarted (default 2m).
	HangAfter time.Duration
	// Backoff is the wait before the first restart, doubled for each
	// failure in a row up to MaxBackoff (defaults 1s, 1m).
	Backoff, MaxBackoff time.Duration
	// MaxRestarts bounds the restarts in a row of a server that never
	// answers between them; then it is left stopped, and says why
	// (default 5).
	MaxRestarts int
	// StopGrace is how long a server may take to exit after SIGTERM
	// before it is killed (default 10s).
	StopGrace time.Duration
	// Settle is how long a server that left service must have had no call
	// in flight, begin or end, before it is stopped (default 2s). Drain
	// bounds the wait for its calls (default 10m).
	Settle, Drain time.Duration
}

func (t Timing) withDefaults() Timing {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.StartTimeout, 10*time.Minute)
	def(&t.Poll, time.Second)
	def(&t.HealthTimeout, 5*time.Second)
	def(&t.HangAfter, 2*time.Minute)
	def(&t.Backoff, time.Second)
	def(&t.MaxBackoff, time.Minute)
	def(&t.StopGrace, 10*time.Second)
	def(&t.Settle, 2*time.Second)
	def(&t.Drain, 10*time.Minute)
	if t.MaxRestarts <= 0 {
		t.MaxRestarts = 5
	}
	return t
}

// Validate checks c and finds the server's program.
func (c *Config) Validate() error {
	if !slices.Contains(Kinds(), c.Kind) {
		return fmt.Errorf("%w: unknown model server %q (want %s)", ErrConfig, c.Kind, strings.Join(Kinds(), ", "))
	}
	if c.Model == "" {
		return fmt.Errorf("%w: no model for the %s server to serve", ErrConfig, c.Kind)
	}
	if c.Dir == "" {
		return fmt.Errorf("%w: no directory for the model server's logs", ErrConfig)
	}
	if c.Kind != KindMLX {
		// mlx_lm.server also takes a Hugging Face repo name.
		if _, err := os.Stat(c.Model); err != nil {
			return fmt.Errorf("%w: model %s: %v", ErrConfig, c.Model, errors.Unwrap(err))
		}
	}
	_, err := c.program()
	return err
}

// program is the server's program, found.
func (c *Config) program() (string, error) {
	bin := c.Bin
	if bin == "" {
		switch c.Kind {
		case KindClawmesh:
			exe, err := os.Executable()
			if err != nil {
				return "", fmt.Errorf("%w: cannot find this program to run `clawmesh serve`: %v", ErrConfig, err)
			}
			return exe, nil
		case KindMLX:
			bin = "mlx_lm.server"
		default:
			bin = "llama-server"
		}
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		hint := ""
		switch c.Kind {
		case KindMLX:
			hint = " (install mlx-lm: pip install mlx-lm)"
		case KindLlamaServer:
			hint = " (install llama.cpp: brew install llama.cpp)"
		}
		return "", fmt.Errorf("%w: no %s program: %v%s; or name it with --serve-bin", ErrConfig, c.Kind, errors.Unwrap(err), hint)
	}
	return filepath.Abs(p)
}

// Server is the model server a node runs: one process for clawmesh and
// mlx, one per version serving or leaving service for llama-server.
type Server struct {
	cfg Config
	bin string
	log *slog.Logger

	mu       sync.Mutex
	backends []*backend // the first is the one started with the server
	first    *backend
	adapter  [2]string // clawmesh: the version and directory loaded, for a restart

	// files is held while a GGUF adapter is exported and its process
	// added to the backends, and while one is removed.
	files sync.Mutex

	stop chan struct{}
	done chan struct{}
}

// backend is one server process and what it serves.
type backend struct {
	version string // swap.BaseVersion or vN
	lora    string // llama-server: the GGUF adapter file
	proc    *proc
	warm    swap.Driver // talks to this process through its proxy
	routed  bool        // the route has pointed at it
	retired bool        // leaving service: stopped once drained
	since   time.Time   // when it left service
}

func (b *backend) upstream() string { return b.proc.proxy.url() + "/v1" }

func (b *backend) target() swap.Target {
	return swap.Target{Version: b.version, Upstream: b.upstream()}
}

// Start starts the model server and waits until it answers (at most
// Timing.StartTimeout, or ctx); the Server then keeps it running until
// Close.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin, _ := cfg.program()
	if cfg.Kind == KindLlamaServer && cfg.ExportLoRA == nil {
		model := cfg.Model
		cfg.ExportLoRA = func(dir, out string) error {
			in, err := gguf.Inspect(model)
			if err != nil {
				return fmt.Errorf("the model %s: %w", model, err)
			}
			return gguf.ExportLoRA(dir, out, gguf.LoRAOptions{Arch: in.Arch})
		}
	}
	cfg.Timing = cfg.Timing.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, bin: bin, log: cfg.Logger.With("component", "modelserver", "kind", cfg.Kind),
		stop: make(chan struct{}), done: make(chan struct{})}
	b, err := s.spawn(swap.BaseVersion, "")
	if err != nil {
		return nil, err
	}
	s.first = b
	b.routed = true
	if err := b.proc.ready(ctx); err != nil {
		b.proc.close()
		return nil, err
	}
	go s.janitor()
	return s, nil
}

// Upstream is the URL (with /v1) of the server the node starts with: the
// gateway's upstream.
func (s *Server) Upstream() string { return s.first.upstream() }

// UpstreamKind is the node's upstream kind for this server (what the
// gateway may ask of it).
func (s *Server) UpstreamKind() string {
	switch s.cfg.Kind {
	case KindLlamaServer:
		return "llamacpp"
	case KindMLX:
		return "mlx"
	}
	return "clawmesh"
}

// Status lists the server processes running.
func (s *Server) Status() []Status {
	s.mu.Lock()
	bs := slices.Clone(s.backends)
	s.mu.Unlock()
	out := make([]Status, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.proc.status())
	}
	return out
}

// PIDs are the process ids of the server processes running now.
func (s *Server) PIDs() []int {
	var out []int
	for _, st := range s.Status() {
		if st.PID > 0 && st.State != StateStopped {
			out = append(out, st.PID)
		}
	}
	return out
}

// Close stops every server process and waits for them.
func (s *Server) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
		<-s.done
	}
	s.mu.Lock()
	bs := s.backends
	s.backends = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Add(1)
		go func() { defer wg.Done(); b.proc.close() }()
	}
	wg.Wait()
	return nil
}

// logPath is the log file of the server serving version.
func (s *Server) logPath(version string) string {
	name := s.cfg.Kind
	if s.cfg.Kind == KindLlamaServer {
		name += "-" + version
	}
	return filepath.Join(s.cfg.Dir, "logs", name+".log")
}

// spawn starts a process serving version (with the llama-server adapter
// file lora) and adds it to the backends.
func (s *Server) spawn(version, lora string) (*backend, error) {
	b := &backend{version: version, lora: lora}
	pc := procConfig{name: s.cfg.Kind + " " + version, bin: s.bin, log: s.logPath(version), logger: s.log, t: s.cfg.Timing}
	switch s.cfg.Kind {
	case KindClawmesh:
		// model/serve: `clawmesh serve --model DIR --listen ADDR`, and
		// --adapter DIR --adapter-version vN for the version it served
		// when it is started again.
		pc.health = "/v1/models"
		pc.args = func(port int) []string {
			a := []string{"serve", "--model", s.cfg.Model, "--listen", "127.0.0.1:" + strconv.Itoa(port)}
			s.mu.Lock()
			v, dir := s.adapter[0], s.adapter[1]
			s.mu.Unlock()
			if v != "" {
				a = append(a, "--adapter", dir, "--adapter-version", v)
			}
			return append(a, s.cfg.Args...)
		}
	case KindMLX:
		// mlx_lm/server.py: --model, --host, --port; GET /v1/models.
		pc.health = "/v1/models"
		pc.args = func(port int) []string {
			return append([]string{"--model", s.cfg.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}, s.cfg.Args...)
		}
	default:
		// llama.cpp tools/server/README.md: -m, --lora FNAME, --host,
		// --port; GET /health answers 200 once the model is loaded (503
		// while it loads).
		pc.health = "/health"
		pc.args = func(port int) []string {
			a := []string{"-m", s.cfg.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}
			if lora != "" {
				a = append(a, "--lora", lora)
			}
			return append(a, s.cfg.Args...)
		}
	}
	p, err := startProc(pc)
	if err != nil {
		return nil, err
	}
	b.proc = p
	b.warm, err = swap.New("llamacpp", swap.Config{Upstream: b.upstream(), Logger: s.log})
	if err != nil {
		p.close()
		return nil, err
	}
	s.mu.Lock()
	s.backends = append(s.backends, b)
	s.mu.Unlock()
	return b, nil
}

// janitor stops the llama-server processes that left service once their
// calls have finished.
func (s *Server) janitor() {
	defer close(s.done)
	t := time.NewTicker(max(s.cfg.Timing.Settle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for _, b := range s.leaving() {
			s.log.Info("model server left service: stopping it", "version", b.version, "upstream", b.upstream())
			b.proc.close()
			s.forget(b)
		}
	}
}

// leaving takes out of the backends those that have left service and
// are drained (or have drained for longer than Timing.Drain).
func (s *Server) leaving() []*backend {
	routed := s.cfg.Route != nil
	var cur string
	if routed {
		cur = s.cfg.Route().Upstream
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur == "" && routed {
		// A route that names no upstream goes to the gateway's own: the
		// server started first.
		cur = s.first.upstream()
	}
	now := time.Now()
	var out []*backend
	keep := s.backends[:0]
	for _, b := range s.backends {
		switch {
		case routed && b.upstream() == cur:
			b.routed, b.retired, b.since = true, false, time.Time{}
		case (routed && b.routed) || b.retired:
			if b.since.IsZero() {
				b.since = now
			}
			late := now.Sub(b.since) > s.cfg.Timing.Drain
			if n := b.proc.proxy.inFlight(); late && n > 0 {
				s.log.Warn("model server left service with calls still in flight: stopping it", "version", b.version, "in_flight", n, "drain", s.cfg.Timing.Drain)
			}
			if b.proc.proxy.drained(s.cfg.Timing.Settle, late) {
				out = append(out, b)
				continue
			}
		}
		keep = append(keep, b)
	}
	clear(s.backends[len(keep):])
	s.backends = keep
	return out
}

// forget removes the GGUF adapter of a stopped llama-server unless a
// running one uses it: an old version served again is exported again.
func (s *Server) forget(b *backend) {
	if b.lora == "" {
		return
	}
	s.files.Lock()
	defer s.files.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.backends {
		if o.lora == b.lora {
			return
		}
	}
	if err := os.Remove(b.lora); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing a version's GGUF adapter", "file", b.lora, "err", err)
	}
}
