package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/reward"
)

// The reward plugins are compiled in the background: the gateway serves
// from the start (a first start on an empty compilation cache takes
// seconds), and what it records meanwhile is scored once they are ready.

// plugins is the reward runner being made, then made.
type plugins struct {
	ready chan struct{} // closed once r or err is set
	r     *reward.Runner
	err   error
	stop  context.CancelFunc
}

// errStopped is the load's outcome when the node closed before it ended.
var errStopped = errors.New("node: closed while the reward plugins were compiling")

// startPlugins checks what can be checked at once (a config the runner
// would refuse, a plugin file that cannot be read or is not WebAssembly),
// then compiles the plugins in the background.
func (n *Node) startPlugins(list []reward.PluginConfig) error {
	if err := reward.Check(list, true); err != nil {
		return fmt.Errorf("node: reward plugins: %w", err)
	}
	cache := n.cfg.PluginCache
	if cache == "" {
		cache = pluginCache(n.cfg.DataDir)
	}
	entries, _ := os.ReadDir(cache)
	first := len(entries) == 0
	ctx, stop := context.WithCancel(context.Background())
	p := &plugins{ready: make(chan struct{}), stop: stop}
	n.plugins = p
	enabled := 0
	for _, c := range list {
		if c.Enabled {
			enabled++
		}
	}
	go func() {
		defer close(p.ready)
		start := n.now()
		if first {
			n.log.Info("compiling the reward plugins (first start only); the gateway serves meanwhile, and its calls are scored once they are ready", "plugins", enabled)
		}
		r, err := reward.New(ctx, reward.Options{
			Plugins:      list,
			CacheDir:     cache,
			Deadline:     n.cfg.PluginDeadline,
			MemoryLimit:  n.cfg.PluginMemoryLimit,
			JudgeTimeout: n.cfg.JudgeTimeout,
			Strict:       true,
			Judge:        n.judge,
			Now:          n.cfg.Now,
			Logger:       n.cfg.Logger,
			OnFailure:    func(p string) { n.metrics.pluginFailures.WithLabelValues(p).Inc() },
			ReleaseAfter: n.cfg.PluginIdle,
			// What the plugins released is most of an idle node's
			// memory: give it back to the system now rather than over
			// minutes.
			OnRelease: func(int) { debug.FreeOSMemory() },
		})
		switch {
		case ctx.Err() != nil:
			// Stopped while compiling (SIGTERM at start-up): no failure.
			if r != nil {
				r.Close(context.Background())
			}
			p.err = errStopped
		case err != nil:
			p.err = fmt.Errorf("reward plugins: %w", err)
		default:
			p.r = r
			// The compilation cache used to live in the data directory:
			// once the one in the cache directory is in use, the old one
			// is only disk space.
			if old := filepath.Join(n.cfg.DataDir, "cache", "wazero"); filepath.Clean(cache) != old {
				if _, err := os.Stat(old); err == nil {
					if err := os.RemoveAll(old); err != nil {
						n.log.Warn("removing the old compilation cache", "dir", old, "err", err)
					} else {
						os.Remove(filepath.Dir(old)) // cache/, if nothing else is there
						n.log.Info("removed the old compilation cache from the data directory", "dir", old, "now", cache)
					}
				}
			}
			for _, pc := range r.Plugins() {
				n.metrics.pluginFailures.WithLabelValues(pc.Name) // a series at 0 from the start
			}
			n.log.Info("reward plugins ready", "plugins", enabled, "took", n.now().Sub(start).Round(1e6))
			// What was closed before (recorded meanwhile, or left by the
			// previous run) is scored now, before the plugins count as
			// ready.
			total := 0
			for ctx.Err() == nil {
				k, err := n.scoreClosed(ctx, r, 256)
				total += k
				if err != nil {
					if ctx.Err() == nil {
						n.log.Warn("scoring", "err", err)
					}
					break
				}
				if k < 256 {
					break
				}
			}
			if total > 0 {
				n.log.Info("scored the steps closed while the plugins compiled", "steps", total)
			}
		}
	}()
	return nil
}

// pluginCache is where the reward plugins' compilation cache lives by
// default: clawmesh/wazero in the user's cache directory, shared by the
// nodes of the machine (a cache is not data: the system may clear it, and
// backups skip it), or cache/wazero in the data directory when there is no
// cache directory or it cannot be made.
func pluginCache(dataDir string) string {
	if d, err := os.UserCacheDir(); err == nil {
		dir := filepath.Join(d, "clawmesh", "wazero")
		if err := os.MkdirAll(dir, 0o700); err == nil {
			return dir
		}
	}
	return filepath.Join(dataDir, "cache", "wazero")
}

// runner waits until the plugins are ready (and the steps closed before
// scored) and returns them: nil, nil when
// scoring is off; an error when they could not be loaded, the node closed
// first, or ctx ended first.
func (n *Node) runner(ctx context.Context) (*reward.Runner, error) {
	if n.plugins == nil {
		return nil, nil
	}
	select {
	case <-n.plugins.ready:
		return n.plugins.r, n.plugins.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// closePlugins stops a compilation in progress and closes the runner.
func (n *Node) closePlugins(ctx context.Context) error {
	if n.plugins == nil {
		return nil
	}
	n.plugins.stop()
	select {
	case <-n.plugins.ready:
	default:
		// A plugin's compilation cannot be cut short: say why stopping
		// waits (a second or two; longer on a loaded machine).
		n.log.Info("stopping once the reward plugin being compiled is done")
		<-n.plugins.ready
	}
	if n.plugins.r != nil {
		return n.plugins.r.Close(ctx)
	}
	return nil
}

// PluginsReady waits until the reward plugins are compiled and loaded, and
// the steps closed until then scored, and says whether the plugins could be
// loaded (nil when scoring is off).
func (n *Node) PluginsReady(ctx context.Context) error {
	_, err := n.runner(ctx)
	return err
}

// lazyRescorer rescored steps with the plugins once they are ready; until
// then, sealing a batch waits.
type lazyRescorer struct{ n *Node }

func (l lazyRescorer) Rescore(ctx context.Context, s *core.Step) core.Reward {
	r, err := l.n.runner(ctx)
	if err != nil || r == nil {
		return core.Reward{}
	}
	return r.Rescore(ctx, s)
}
