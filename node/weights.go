package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/gateway"
	"github.com/clawmesh/clawmesh/node/swap"
)

// Directories in a node's data directory for the adapter versions that
// come back from the trainers: the fetched bundles (with their signed
// manifests, re-served to other devices) and the installed versions.
const (
	WeightsDir  = "weights"
	AdaptersDir = "adapters"
)

// ErrNoWeights is asked of a node that follows no adapter versions (not in
// a mesh, or with weights off).
var ErrNoWeights = errors.New("node: this node follows no adapter versions (it is not in a mesh, or --weights is off)")

// startWeights starts the weights service on the mesh peer and the
// follower that keeps the upstream on the wanted version.
func (n *Node) startWeights() error {
	mc := n.cfg.Mesh
	if n.peer == nil || mc.Weights == "off" {
		return nil
	}
	key, _, err := peer.Identity(n.cfg.DataDir)
	if err != nil {
		return err
	}
	listen := mc.Weights
	if listen == "" {
		listen = ":0"
	}
	var notify func()
	svc, err := weights.New(weights.Config{Dir: filepath.Join(n.cfg.DataDir, WeightsDir), Key: key, Mesh: n.peer.Mesh, Host: n.peer.Host,
		Listen: listen, AnnounceEvery: mc.WeightsAnnounce, Logger: n.log, Metrics: n.metrics.weights,
		OnManifest: func(*chunks.Manifest) {
			if notify != nil {
				notify()
			}
		}})
	if err != nil {
		return fmt.Errorf("node: weights: %w", err)
	}
	var drv swap.Driver
	if n.server != nil {
		drv, err = n.server.Driver()
		if err == nil {
			// The node knows the model it serves: a version trained on
			// another base is refused, not loaded (node/adapters).
			drv = swap.WithBaseFile(drv, n.cfg.Serve.Model)
		}
	} else {
		drv, err = swap.New(n.cfg.UpstreamKind, swap.Config{Upstream: n.cfg.Upstream, Token: n.cfg.UpstreamToken, Logger: n.log})
	}
	if err != nil {
		n.log.Warn("adapter versions will be fetched and installed but not served", "why", err)
		drv = nil
	}
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(n.cfg.DataDir, AdaptersDir), Weights: svc, Driver: drv, Retry: mc.WeightsRetry, Logger: n.log})
	if err != nil {
		svc.Close()
		return err
	}
	notify = f.Notify
	n.weights, n.follower = svc, f
	n.route.Store(f)
	return nil
}

// gatewayRoute is the gateway's route: the follower's target once there
// is one. A response header naming the adapter (clawmesh serve's) still
// has the last word on what a step records.
func (n *Node) gatewayRoute() gateway.Route {
	adapter := ""
	if n.cfg.Adapter != nil {
		adapter = n.cfg.Adapter()
	}
	if f := n.route.Load(); f != nil {
		if t := f.Route(); t.Version != adapters.Base {
			return gateway.Route{Model: t.Model, Adapter: t.Version, Upstream: t.Upstream, Fields: t.Fields}
		} else if t.Model != "" || t.Upstream != "" || t.Fields != "" {
			return gateway.Route{Model: t.Model, Adapter: adapter, Upstream: t.Upstream, Fields: t.Fields}
		}
	}
	return gateway.Route{Adapter: adapter}
}

// runWeights runs the weights service and the follower until ctx is done.
func (n *Node) runWeights(ctx context.Context) {
	done := make(chan struct{})
	go func() { n.weights.Run(ctx); close(done) }()
	n.follower.Run(ctx)
	<-done
}

// Weights is the node's weights service (nil when it follows none).
func (n *Node) Weights() *weights.Service { return n.weights }

// Follower is the node's adapter follower (nil when it follows none).
func (n *Node) Follower() *adapters.Follower { return n.follower }

// WeightsSource is the node's weights service as a source (zero when
// none).
func (n *Node) WeightsSource() weights.Source {
	if n.weights == nil {
		return weights.Source{}
	}
	return n.weights.Self()
}

// weightsRequest is the body of the weights admin POSTs.
type weightsRequest struct {
	Version string `json:"version"`
}

// handleWeights serves the weights admin API:
//
//	GET  /clawmesh/v1/weights        adapters.Status
//	POST /clawmesh/v1/weights/use    {"version": "vN"|"base"|"latest"}
//	POST /clawmesh/v1/weights/get    {"version": "vN"}: fetch and install now
func (n *Node) handleWeights(mux *http.ServeMux) {
	mux.HandleFunc("GET /clawmesh/v1/weights", func(w http.ResponseWriter, r *http.Request) {
		if n.follower == nil {
			writeErr(w, http.StatusNotFound, ErrNoWeights)
			return
		}
		writeJSON(w, n.follower.Status(), nil)
	})
	read := func(w http.ResponseWriter, r *http.Request) (string, bool) {
		if n.follower == nil {
			writeErr(w, http.StatusNotFound, ErrNoWeights)
			return "", false
		}
		var q weightsRequest
		b, err := io.ReadAll(io.LimitReader(r.Body, 4096))
		if err == nil {
			err = json.Unmarshal(b, &q)
		}
		if err != nil {
			writeErr(w, http.StatusBadRequest, fmt.Errorf(`want {"version": "vN"}: %w`, err))
			return "", false
		}
		return q.Version, true
	}
	mux.HandleFunc("POST /clawmesh/v1/weights/use", func(w http.ResponseWriter, r *http.Request) {
		v, ok := read(w, r)
		if !ok {
			return
		}
		if err := n.follower.Pin(v); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, n.follower.Status(), nil)
	})
	mux.HandleFunc("POST /clawmesh/v1/weights/get", func(w http.ResponseWriter, r *http.Request) {
		v, ok := read(w, r)
		if !ok {
			return
		}
		if _, err := adapters.ParseVersion(v); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Hour)
		defer cancel()
		if err := n.follower.Fetch(ctx, v); err != nil {
			writeErr(w, http.StatusBadGateway, err)
			return
		}
		writeJSON(w, n.follower.Status(), nil)
	})
}

// weightsCall makes one call of the weights admin API.
func (c *Client) weightsCall(ctx context.Context, method, path, version string) (adapters.Status, error) {
	var body any
	if method == http.MethodPost {
		body = weightsRequest{Version: version}
	}
	return adminCall[adapters.Status](ctx, c, method, "/clawmesh/v1/weights"+path, body)
}

// adminCall makes one call of the admin API with body (nil: none) as
// JSON, and decodes the answer into a T.
func adminCall[T any](ctx context.Context, c *Client, method, path string, body any) (T, error) {
	var out T
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return out, err
		}
		r = strings.NewReader(string(b))
	}
	resp, err := adminapi.Do(ctx, c.HTTP, method, strings.TrimSuffix(c.Base, "/")+path, c.Token, r)
	var se *adminapi.StatusError
	if errors.As(err, &se) {
		return out, fmt.Errorf("%w: %s", ErrRemote, se.Message)
	}
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&out)
	return out, err
}

// Weights returns the versions the node knows and which one serves.
func (c *Client) Weights(ctx context.Context) (adapters.Status, error) {
	return c.weightsCall(ctx, http.MethodGet, "", "")
}

// UseWeights pins a version ("vN", "base"; "latest" follows the newest).
func (c *Client) UseWeights(ctx context.Context, version string) (adapters.Status, error) {
	return c.weightsCall(ctx, http.MethodPost, "/use", version)
}

// GetWeights fetches and installs a version now; it returns once done.
func (c *Client) GetWeights(ctx context.Context, version string) (adapters.Status, error) {
	return c.weightsCall(ctx, http.MethodPost, "/get", version)
}
