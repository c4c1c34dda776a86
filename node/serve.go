package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/swap"
)

// serveConfig is Config.Serve with the node's defaults filled in.
func (c *Config) serveConfig() modelserver.Config {
	sc := *c.Serve
	if sc.Dir == "" {
		sc.Dir = c.DataDir
	}
	return sc
}

// validateServe checks a node that runs its model server: the server's
// config, and no other upstream.
func (c *Config) validateServe() error {
	if c.Upstream != "" {
		return fmt.Errorf("%w: an upstream (%s) and a model server to run (%s): the node's upstream is the server it runs; give one or the other", ErrConfig, c.Upstream, c.Serve.Kind)
	}
	sc := c.serveConfig()
	if err := sc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	want := map[string]string{modelserver.KindLlamaServer: "llamacpp", modelserver.KindMLX: "mlx", modelserver.KindClawmesh: "clawmesh"}[sc.Kind]
	if k := c.UpstreamKind; k != "" && k != want && !(want == "llamacpp" && k == "llama.cpp") {
		return fmt.Errorf("%w: upstream kind %q, but the model server the node runs is %s (kind %s)", ErrConfig, k, sc.Kind, want)
	}
	return nil
}

// startServer starts the model server the node runs, if any, and makes it
// the node's upstream.
func (n *Node) startServer(ctx context.Context) error {
	if n.cfg.Serve == nil {
		return nil
	}
	sc := n.cfg.serveConfig()
	sc.Logger = n.log
	sc.Route = n.currentRoute
	srv, err := modelserver.Start(ctx, sc)
	if err != nil {
		if errors.Is(err, modelserver.ErrConfig) {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		return fmt.Errorf("node: %w", err)
	}
	n.server = srv
	n.cfg.Upstream, n.cfg.UpstreamKind = srv.Upstream(), srv.UpstreamKind()
	n.log.Info("model server running", "kind", sc.Kind, "model", sc.Model, "upstream", n.cfg.Upstream, "logs", sc.Dir)
	return nil
}

// currentRoute is where the gateway routes calls now.
func (n *Node) currentRoute() swap.Target {
	if f := n.route.Load(); f != nil {
		return f.Route()
	}
	return swap.Target{}
}

// ModelServer is the model server the node runs (nil when it runs none).
func (n *Node) ModelServer() *modelserver.Server { return n.server }
