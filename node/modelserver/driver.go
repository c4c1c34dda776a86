package modelserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/clawmesh/clawmesh/node/swap"
)

// Driver returns the swap.Driver that puts versions into service on this
// server, for node/adapters.Follower:
//
//   - clawmesh: swap's clawmesh driver, which loads each version into the
//     running process; a process started again (after a crash) starts
//     with the version it last loaded.
//   - mlx: swap's mlx driver (each call names its adapter directory).
//   - llama-server: blue/green. A version is exported as a GGUF adapter
//     and served by a second process started with --lora; once it
//     answers, its Target (Upstream: that process) is returned, and the
//     process the route left is stopped when its calls have finished.
func (s *Server) Driver() (swap.Driver, error) {
	switch s.cfg.Kind {
	case KindLlamaServer:
		return &blueGreen{s}, nil
	case KindMLX:
		d, err := swap.New("mlx", swap.Config{Upstream: s.first.upstream(), Logger: s.cfg.Logger})
		if err != nil {
			return nil, err
		}
		return &managed{s: s, d: d}, nil
	}
	d, err := swap.New("clawmesh", swap.Config{Upstream: s.first.upstream(), Logger: s.cfg.Logger})
	if err != nil {
		return nil, err
	}
	return &managed{s: s, d: d, restartWith: true}, nil
}

// managed is a driver of the one process the node runs: it waits for the
// process to answer before each call, and remembers the version loaded so
// that a process started again serves it too.
type managed struct {
	s           *Server
	d           swap.Driver
	restartWith bool // start the process again with the version loaded
}

func (m *managed) Kind() string { return m.d.Kind() }

func (m *managed) Load(ctx context.Context, version, dir string) (swap.Target, error) {
	if err := m.s.first.proc.ready(ctx); err != nil {
		return swap.Target{}, fmt.Errorf("%w: %v", swap.ErrUpstream, err)
	}
	t, err := m.d.Load(ctx, version, dir)
	if err == nil && m.restartWith {
		abs, _ := filepath.Abs(dir)
		m.s.mu.Lock()
		m.s.adapter = [2]string{version, abs}
		m.s.mu.Unlock()
	}
	return t, err
}

func (m *managed) Base(ctx context.Context) (swap.Target, error) {
	if err := m.s.first.proc.ready(ctx); err != nil {
		return swap.Target{}, fmt.Errorf("%w: %v", swap.ErrUpstream, err)
	}
	return m.d.Base(ctx)
}

func (m *managed) Warm(ctx context.Context, t swap.Target) error {
	if err := m.s.first.proc.ready(ctx); err != nil {
		return fmt.Errorf("%w: %v", swap.ErrUpstream, err)
	}
	return m.d.Warm(ctx, t)
}

func (m *managed) Unload(ctx context.Context, t swap.Target) error { return m.d.Unload(ctx, t) }

// blueGreen serves each llama-server version from a process of its own.
type blueGreen struct{ s *Server }

// versionRE is what a version name may look like: it names files.
var versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func (g *blueGreen) Kind() string { return "llamacpp" }

// find returns the backend serving version that is not leaving service.
func (g *blueGreen) find(version string) *backend {
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.backends) - 1; i >= 0; i-- {
		b := s.backends[i]
		if b.version != version || b.retired {
			continue
		}
		if st := b.proc.status().State; st == StateFailed || st == StateStopped {
			continue
		}
		// Pending again: the route may come back to it.
		b.routed, b.since = false, time.Time{}
		return b
	}
	return nil
}

// start starts a process serving version from the adapter file lora ("":
// the base model; export writes it, when set), and waits until it
// answers.
func (g *blueGreen) start(ctx context.Context, version, lora string, export func() error) (swap.Target, error) {
	if b := g.find(version); b != nil {
		if err := b.proc.ready(ctx); err == nil {
			return b.target(), nil
		}
	}
	g.s.files.Lock()
	if export != nil {
		if err := export(); err != nil {
			g.s.files.Unlock()
			return swap.Target{}, err
		}
	}
	b, err := g.s.spawn(version, lora)
	g.s.files.Unlock()
	if err != nil {
		return swap.Target{}, fmt.Errorf("%w: %v", swap.ErrUpstream, err)
	}
	if err := b.proc.ready(ctx); err != nil {
		g.retire(b)
		if errors.Is(err, ErrFailed) {
			return swap.Target{}, fmt.Errorf("%w: llama-server with --lora %s: %v", swap.ErrRefused, lora, err)
		}
		return swap.Target{}, err
	}
	g.s.log.Info("version serving from its own process", "version", version, "upstream", b.upstream(), "pid", b.proc.status().PID)
	return b.target(), nil
}

// Load implements swap.Driver: the adapter exported as GGUF (kept in
// Dir/gguf, for a restart), a process started with it.
func (g *blueGreen) Load(ctx context.Context, version, dir string) (swap.Target, error) {
	if !versionRE.MatchString(version) || version == swap.BaseVersion {
		return swap.Target{}, fmt.Errorf("%w: version name %q", swap.ErrConfig, version)
	}
	out := filepath.Join(g.s.cfg.Dir, "gguf", version+".gguf")
	export := func() error {
		if _, err := os.Stat(out); err == nil {
			return nil // exported before, for a process still running
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
			return fmt.Errorf("%w: %v", swap.ErrConfig, err)
		}
		tmp := out + ".tmp"
		start := time.Now()
		if err := g.s.cfg.ExportLoRA(dir, tmp); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("%w: exporting %s to GGUF: %v", swap.ErrAdapter, version, err)
		}
		if err := os.Rename(tmp, out); err != nil {
			return fmt.Errorf("%w: %v", swap.ErrConfig, err)
		}
		g.s.log.Info("version exported as GGUF", "version", version, "file", out, "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	return g.start(ctx, version, out, export)
}

// Base implements swap.Driver: a process with no adapter.
func (g *blueGreen) Base(ctx context.Context) (swap.Target, error) {
	return g.start(ctx, swap.BaseVersion, "", nil)
}

// Warm implements swap.Driver: a one-token chat completion to t's own
// process. A process that does not answer it is stopped.
func (g *blueGreen) Warm(ctx context.Context, t swap.Target) error {
	b := g.byUpstream(t.Upstream)
	if b == nil {
		return fmt.Errorf("%w: version %s: no server at %s", swap.ErrWarm, t.Version, t.Upstream)
	}
	if err := b.warm.Warm(ctx, t); err != nil {
		if !b.routed {
			g.retire(b)
		}
		return err
	}
	return nil
}

// Unload implements swap.Driver: t's process leaves service, stopped once
// the calls in flight on it have finished.
func (g *blueGreen) Unload(_ context.Context, t swap.Target) error {
	if b := g.byUpstream(t.Upstream); b != nil {
		g.retire(b)
	}
	return nil
}

func (g *blueGreen) byUpstream(u string) *backend {
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if u == "" && s.first != nil {
		u = s.first.upstream()
	}
	for _, b := range s.backends {
		if b.upstream() == u {
			return b
		}
	}
	return nil
}

func (g *blueGreen) retire(b *backend) {
	g.s.mu.Lock()
	b.retired = true
	g.s.mu.Unlock()
}
