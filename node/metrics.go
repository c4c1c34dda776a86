package node

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/gateway"
)

// metrics are a node's Prometheus metrics, served at /metrics on the
// gateway's listener. Each node has its own registry. What the gateway
// and the mesh already count is read when scraped; what happens on the
// call path is an atomic update (client_golang's counters and histograms)
// and nothing more.
//
// /metrics is served to whoever may call the API (the gateway's token, if
// it has one), not only to the owner as the admin API is: the series are
// counts and durations, never what was said, and a scraper should not
// hold the key to the owner's recorded conversations.
type metrics struct {
	reg *prometheus.Registry

	calls *prometheus.HistogramVec
	// byAPI holds calls' observers resolved once, read-only after: the
	// call path does no label lookup.
	byAPI          map[core.APIKind]prometheus.Observer
	scored         prometheus.Counter
	abstained      prometheus.Counter
	rewards        prometheus.Histogram
	pluginFailures *prometheus.CounterVec
	pulls          prometheus.Counter
	pulledBytes    prometheus.Counter
	shipped        prometheus.Counter
	weights        *weights.Metrics
}

func newMetrics(n *Node) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		reg: reg,
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "clawmesh_gateway_call_seconds",
			Help:    "How long a recorded call took in the gateway, from its request to the end of its reply (a stream's whole length), by API.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)}, []string{"api"}),
		scored: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_steps_scored_total",
			Help: "Steps the reward plugins scored."}),
		abstained: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_steps_abstained_total",
			Help: "Scored steps on which every plugin abstained (no reward)."}),
		rewards: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "clawmesh_step_reward",
			Help:    "The combined reward of scored steps, in [-1, 1].",
			Buckets: []float64{-0.75, -0.25, 0, 0.25, 0.75, 1}}),
		pluginFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "clawmesh_plugin_failures_total",
			Help: "Scoring calls that failed (a trap, an exit, the deadline, a plugin set aside), by plugin."}, []string{"plugin"}),
		pulls: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_gossip_batch_pulls_total",
			Help: "Outbox batches trainers pulled from this node after its gossip announcements."}),
		pulledBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_gossip_batch_pulled_bytes_total",
			Help: "Bytes of outbox batches trainers pulled from this node."}),
		shipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_batches_shipped_total",
			Help: "Outbox batches a trainer acknowledged (they left the device)."}),
	}
	reg.MustRegister(m.calls, m.scored, m.abstained, m.rewards, m.pluginFailures, m.pulls, m.pulledBytes, m.shipped,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gw := func(f func(gateway.Stats) uint64) func() float64 {
		return func() float64 {
			if n.gw == nil {
				return 0
			}
			return float64(f(n.gw.Stats()))
		}
	}
	for _, c := range []struct {
		name, help string
		f          func(gateway.Stats) uint64
	}{
		{"clawmesh_gateway_requests_total", "Requests the gateway served, all routes.", func(s gateway.Stats) uint64 { return s.Requests }},
		{"clawmesh_steps_recorded_total", "Steps the gateway recorded in the pool.", func(s gateway.Stats) uint64 { return s.Recorded }},
		{"clawmesh_gateway_record_failures_total", "Step writes to the pool that failed.", func(s gateway.Stats) uint64 { return s.RecordFailures }},
		{"clawmesh_gateway_upstream_failures_total", "Calls whose upstream was unreachable, timed out or cut.", func(s gateway.Stats) uint64 { return s.UpstreamFailures }},
		{"clawmesh_gateway_unrecorded_total", "Calls served but not recorded (recording paused, the pool failed or was slow).", func(s gateway.Stats) uint64 { return s.Unrecorded }},
		{"clawmesh_gateway_client_disconnects_total", "Recorded calls the client abandoned.", func(s gateway.Stats) uint64 { return s.ClientDisconnected }},
		{"clawmesh_gateway_closures_dropped_total", "Closures (next states, ends of steps) not written because the background writer's queue was full.", func(s gateway.Stats) uint64 { return s.ClosuresDropped }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help}, gw(c.f)))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_gateway_closures_waiting",
		Help: "Closures (next states, ends of steps) waiting for the gateway's background writer."},
		gw(func(s gateway.Stats) uint64 { return uint64(s.ClosuresWaiting) })))
	peers := func(f func() int) func() float64 {
		return func() float64 {
			if n.peer == nil {
				return 0
			}
			return float64(f())
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_mesh_peers_connected", Help: "Peers this node's mesh host is connected to."},
			peers(func() int { return len(n.peer.Host.Connected()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_mesh_peers_admitted", Help: "Peers admitted to the mesh (certified, not revoked) that this node knows."},
			peers(func() int { return len(n.peer.Mesh.Peers()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_adapter_serving_version",
			Help: "The adapter version requests go to now (0: the base model)."}, func() float64 { s, _ := n.versions(); return float64(s) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_adapter_latest_version",
			Help: "The newest adapter version the trainers announced (0: none)."}, func() float64 { _, l := n.versions(); return float64(l) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_adapter_staleness_versions",
			Help: "How many versions the one serving is behind the newest announced (steps recorded now are this stale when they reach a trainer, at least)."},
			func() float64 {
				s, l := n.versions()
				return float64(max(l, s) - s)
			}),
	)
	m.byAPI = map[core.APIKind]prometheus.Observer{}
	for _, api := range []core.APIKind{core.APIChat, core.APIResponses, core.APIMessages} {
		m.byAPI[api] = m.calls.WithLabelValues(string(api))
	}
	outbox := func(unshipped bool) func() float64 {
		return func() float64 {
			bs, err := n.pool.Batches(context.Background())
			if err != nil {
				return 0
			}
			k := 0
			for _, b := range bs {
				if !unshipped || b.Shipped.IsZero() {
					k++
				}
			}
			return float64(k)
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_outbox_batches",
			Help: "Batches in the outbox: scored steps sealed, scrubbed, for leaving the device."}, outbox(false)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "clawmesh_outbox_batches_unshipped",
			Help: "Outbox batches no trainer has acknowledged yet."}, outbox(true)),
	)
	m.weights = weights.NewMetrics(reg)
	return m
}

// versions are the adapter version serving and the newest announced, as
// numbers (0: the base model, or none).
func (n *Node) versions() (serving, latest uint64) {
	f := n.route.Load()
	if f == nil {
		return 0, 0
	}
	if v, err := adapters.ParseVersion(f.Route().Version); err == nil {
		serving = v
	}
	if n.weights != nil {
		if m := n.weights.Latest(); m != nil {
			if v, err := adapters.ParseVersion(m.Name()); err == nil {
				latest = v
			}
		}
	}
	return serving, latest
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func (m *metrics) call(api core.APIKind, d time.Duration) {
	if o := m.byAPI[api]; o != nil {
		o.Observe(d.Seconds())
	}
}

func (m *metrics) reward(r *core.Reward) {
	m.scored.Inc()
	if r.Value == nil {
		m.abstained.Inc()
		return
	}
	m.rewards.Observe(*r.Value)
}

// Metrics serves the node's Prometheus metrics (the gateway serves them
// at /metrics).
func (n *Node) Metrics() http.Handler { return n.metrics.handler() }

func (m *metrics) pulled(size int) {
	if m != nil {
		m.pulls.Inc()
		m.pulledBytes.Add(float64(size))
	}
}

func (m *metrics) shippedOne() {
	if m != nil {
		m.shipped.Inc()
	}
}

// rewardAttr is a reward for a log line: its value, or "abstained".
func rewardAttr(v *float64) any {
	if v == nil {
		return "abstained"
	}
	return *v
}
