package node

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/dashboard"
	"github.com/clawmesh/clawmesh/pool"
)

// DashboardWindow is how far back the dashboard's rewards chart looks.
const DashboardWindow = 24 * time.Hour

// maxDashboardSteps bounds the steps the dashboard reads for its chart.
const maxDashboardSteps = 20000

// dashboard is the owner's page at /clawmesh/ (node/dashboard).
func (n *Node) dashboard() http.Handler { return dashboard.Handler(n.dashboardData) }

// dashboardData gathers the page's figures from what the admin API
// answers from: the pool, the outbox, the mesh peer and the follower.
func (n *Node) dashboardData(ctx context.Context) (*dashboard.Data, error) {
	now := n.now()
	d := &dashboard.Data{Now: now, Since: now.Add(-DashboardWindow), FirstServed: map[string]time.Time{}, ServedSteps: map[string]int{}}
	fail := func(what string, err error) { d.Errors = append(d.Errors, what+": "+err.Error()) }
	st, err := n.pool.Stats(ctx)
	if err != nil {
		h := n.pool.Health()
		st = pool.Stats{Health: &h}
		fail("the pool's figures", err)
	}
	d.Stats = st
	steps, err := n.pool.List(ctx, pool.Filter{Since: d.Since, Limit: maxDashboardSteps})
	if err != nil {
		fail("the steps", err)
	}
	for _, s := range steps {
		a := s.Adapter
		if a == "" {
			a = "base"
		}
		d.ServedSteps[a]++
		if t, ok := d.FirstServed[a]; !ok || s.Timings.Start.Before(t) {
			if !s.Timings.Start.IsZero() {
				d.FirstServed[a] = s.Timings.Start
			}
		}
		if s.Reward == nil || s.Reward.Value == nil {
			continue
		}
		at := s.Reward.At
		if at.IsZero() {
			at = s.Timings.Start
		}
		d.Rewards = append(d.Rewards, dashboard.Reward{At: at, Value: *s.Reward.Value, Adapter: s.Adapter})
	}
	slices.SortFunc(d.Rewards, func(a, b dashboard.Reward) int { return a.At.Compare(b.At) })
	if bs, err := n.pool.Batches(ctx); err != nil {
		fail("the batches", err)
	} else {
		slices.SortFunc(bs, func(a, b *pool.Batch) int { return b.Created.Compare(a.Created) })
		d.Batches = bs
	}
	if pv, err := n.outbox.Preview(ctx, 1); err != nil {
		fail("the next batch", err)
	} else if pv != nil {
		d.PreviewSteps = pv.Header.Steps
	}
	if n.peer != nil {
		s := peer.StatusOf(n.peer)
		d.Mesh = &s
		d.Peers = []peer.PeerInfo{}
		for _, pe := range n.peer.Mesh.Peers() {
			d.Peers = append(d.Peers, peer.PeerInfo{PeerID: string(pe.ID), Role: pe.Cert.Role().String(), MayInvite: pe.Cert.MayInvite(), Since: pe.Since.UTC()})
		}
	}
	if n.personal != nil {
		ps := n.personal.Status()
		d.Personal = &ps
	}
	if n.follower != nil {
		ws := n.follower.Status()
		d.Weights = &ws
		ms := n.weights.Dir().Held()
		if m := n.weights.Latest(); m != nil {
			ms = append(ms, m)
		}
		seen := map[uint64]bool{}
		for _, m := range ms {
			if seen[m.Version] {
				continue
			}
			seen[m.Version] = true
			parent := "base"
			if m.Parent > 0 {
				parent = "v" + strconv.FormatUint(m.Parent, 10)
			}
			d.Lineage = append(d.Lineage, dashboard.Version{Number: m.Version, Name: m.Name(), Parent: parent, Term: m.Term, Index: m.Index, Created: m.Created, Bytes: m.Size, Evals: adapters.EvalsOf(m)})
		}
		slices.SortFunc(d.Lineage, func(a, b dashboard.Version) int { return cmp.Compare(b.Number, a.Number) })
	}
	return d, nil
}
