package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	meshpersonal "github.com/clawmesh/clawmesh/mesh/personal"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/node/scrub"
	"github.com/clawmesh/clawmesh/node/share"
)

// PersonalDir holds the personal adapter's versions, in the data
// directory.
const PersonalDir = "personal"

// PersonalConfig is the [personal] policy: a personal adapter trained on
// this device's steps only, served stacked on the mesh's versions.
type PersonalConfig struct {
	// Mode is local (trained here, while the agent is idle), mesh (by a
	// trainer the user trusts) or off.
	Mode personal.Mode
	// Trainer trains it: a worker process under local, the trusted
	// trainer under mesh. Required unless Mode is off.
	Trainer personal.Trainer
	// Trainers are the peer ids of the trainers the user trusts with
	// their steps, under mesh (the node reaches them over the mesh when
	// Trainer is nil).
	Trainers []string
	// Idle, MinSteps, MaxSteps, HoldBack and Poll: see personal.Config.
	Idle     time.Duration
	MinSteps int
	MaxSteps int
	HoldBack float64
	Poll     time.Duration
}

// ErrNoPersonal is asked of a node with no personal adapter manager.
var ErrNoPersonal = errors.New("node: no personal adapter here: it needs [personal] mode = local or mesh, and the node in a mesh with weights on (it stacks on the mesh's versions)")

// startPersonal makes the personal adapter's manager; the follower stacks
// its versions. It needs the follower: outside a mesh there is nothing to
// stack on, and a personal adapter alone is not served.
func (n *Node) startPersonal(cfg *PersonalConfig, key []byte) (*personal.Manager, error) {
	if cfg == nil || cfg.Mode == personal.ModeOff || cfg.Mode == "" {
		return nil, nil
	}
	if n.follower == nil {
		n.log.Warn("[personal] is set but the node follows no adapter versions (not in a mesh, or weights off): no personal adapter")
		return nil, nil
	}
	pc := personal.Config{Dir: filepath.Join(n.cfg.DataDir, PersonalDir), Mode: cfg.Mode, Trainer: cfg.Trainer, Pool: n.pool,
		Shared: n.sharedServing, Changed: n.follower.Notify, LastCall: n.lastCallTime,
		Idle: cfg.Idle, MinSteps: cfg.MinSteps, MaxSteps: cfg.MaxSteps, HoldBack: cfg.HoldBack, Poll: cfg.Poll, Now: n.now, Logger: n.log}
	if cfg.Mode == personal.ModeMesh {
		// What goes to the trusted trainer is scrubbed, as a batch is.
		pc.Prepare = func(steps []*core.Step) ([]*core.Step, error) { return n.scrubPersonal(steps, key) }
		if pc.Trainer == nil {
			if len(cfg.Trainers) == 0 {
				return nil, errors.New("node: [personal] mode mesh needs the trainers you trust ([personal] trainers)")
			}
			ts := make([]mesh.PeerID, len(cfg.Trainers))
			for i, t := range cfg.Trainers {
				ts[i] = mesh.PeerID(t)
			}
			pc.Trainer = meshpersonal.Client{Host: n.peer.Host, Mesh: n.peer.Mesh, Trainers: ts, Logger: n.log}
		}
	}
	return personal.New(pc)
}

// sharedServing is the shared version the follower serves (or wants) and
// its installed directory ("", "" for the base model).
func (n *Node) sharedServing() (string, string) {
	st := n.follower.Status()
	v := st.Serving
	if v == "" || v == "base" {
		return "", ""
	}
	dir := n.follower.VersionDir(v)
	if !isDir(dir) {
		return "", ""
	}
	return v, dir
}

// scrubPersonal scrubs steps as the sharing policy scrubs a batch.
func (n *Node) scrubPersonal(steps []*core.Step, key []byte) ([]*core.Step, error) {
	var p share.Policy
	if n.outbox != nil {
		p = n.outbox.Policy()
	}
	sc, err := scrub.New(scrub.Options{Names: p.Names})
	if err != nil {
		return nil, err
	}
	pass := sc.NewPass()
	tables := map[core.SessionID]*scrub.Table{}
	out := make([]*core.Step, 0, len(steps))
	for _, s := range steps {
		t := tables[s.SessionID]
		if t == nil {
			t = &scrub.Table{}
			tables[s.SessionID] = t
		}
		c, err := pass.Step(t, s, &scrub.StepOptions{Key: key, Tools: p.Tools})
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// called records an agent's call: the personal adapter trains only while
// the agent is idle, and a job under way yields.
func (n *Node) called() {
	n.lastCall.Store(n.now().UnixNano())
	if n.personal != nil {
		n.personal.Preempt()
	}
}

func (n *Node) lastCallTime() time.Time {
	ns := n.lastCall.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Personal is the node's personal adapter manager (nil when none).
func (n *Node) Personal() *personal.Manager { return n.personal }

// handlePersonal serves the personal adapter's admin API:
//
//	GET  /clawmesh/v1/personal        personal.Status
//	POST /clawmesh/v1/personal/reset  forget it: the shared version alone serves
//	POST /clawmesh/v1/personal/off    stop training and serving it (kept)
//	POST /clawmesh/v1/personal/on     back on
func (n *Node) handlePersonal(mux *http.ServeMux) {
	mux.HandleFunc("GET /clawmesh/v1/personal", func(w http.ResponseWriter, r *http.Request) {
		if n.personal == nil {
			writeErr(w, http.StatusNotFound, ErrNoPersonal)
			return
		}
		writeJSON(w, n.personal.Status(), nil)
	})
	for _, op := range []string{"reset", "off", "on"} {
		mux.HandleFunc("POST /clawmesh/v1/personal/"+op, func(w http.ResponseWriter, r *http.Request) {
			if n.personal == nil {
				writeErr(w, http.StatusNotFound, ErrNoPersonal)
				return
			}
			var err error
			switch op {
			case "reset":
				err = n.personal.Reset()
			case "off":
				err = n.personal.SetEnabled(false)
			case "on":
				err = n.personal.SetEnabled(true)
			}
			if err != nil {
				writeErr(w, http.StatusInternalServerError, err)
				return
			}
			writeJSON(w, n.personal.Status(), nil)
		})
	}
}

// personalCall makes one call of the personal admin API.
func (c *Client) personalCall(ctx context.Context, method, path string) (personal.Status, error) {
	var body any
	if method == http.MethodPost {
		body = struct{}{}
	}
	return adminCall[personal.Status](ctx, c, method, "/clawmesh/v1/personal"+path, body)
}

// Personal returns the personal adapter's state.
func (c *Client) Personal(ctx context.Context) (personal.Status, error) {
	return c.personalCall(ctx, http.MethodGet, "")
}

// PersonalDo runs "reset", "off" or "on" on the personal adapter.
func (c *Client) PersonalDo(ctx context.Context, op string) (personal.Status, error) {
	switch op {
	case "reset", "off", "on":
	default:
		return personal.Status{}, fmt.Errorf("node: personal %q: want reset, off or on", op)
	}
	return c.personalCall(ctx, http.MethodPost, "/"+op)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
