package weights

import (
	"errors"
	"time"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts a Service's weight transfers for Prometheus: the bytes it
// fetched and served, how long fetches took, and the manifests it accepted
// or refused (by reason). A nil *Metrics counts nothing.
type Metrics struct {
	fetched  prometheus.Counter
	served   prometheus.Counter
	fetches  *prometheus.HistogramVec
	accepted prometheus.Counter
	refused  *prometheus.CounterVec
}

// NewMetrics makes a Service's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		fetched: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_weights_fetched_bytes_total",
			Help: "Bytes of adapter bundles fetched from other peers and verified."}),
		served: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_weights_served_bytes_total",
			Help: "Bytes of adapter bundles served to other peers."}),
		fetches: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "clawmesh_weights_fetch_seconds",
			Help:    "How long fetching one adapter bundle took, by outcome (ok or failed).",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}, []string{"outcome"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "clawmesh_weights_versions_accepted_total",
			Help: "Adapter versions accepted (signed by a trainer of this mesh, certified by a quorum of its voters, newer than the last), each counted once however often offered."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "clawmesh_weights_versions_refused_total",
			Help: "Adapter version manifests refused, by reason (stale, signature, uncertified: without the votes of a quorum of the voter set in force, manifest)."}, []string{"reason"}),
	}
	reg.MustRegister(m.fetched, m.served, m.fetches, m.accepted, m.refused)
	// Every series from the start, at 0, so that a query finds them.
	for _, r := range []string{"stale", "signature", "uncertified", "manifest"} {
		m.refused.WithLabelValues(r)
	}
	for _, o := range []string{"ok", "failed"} {
		m.fetches.WithLabelValues(o)
	}
	return m
}

// accept counts a manifest checked: accepted once, when it is new (a
// version offered again by another peer, or by the same one, is not
// counted again), or refused, by reason.
func (m *Metrics) accept(err error, isNew bool) {
	switch {
	case m == nil:
	case err == nil:
		if isNew {
			m.accepted.Inc()
		}
	case errors.Is(err, chunks.ErrStale):
		m.refused.WithLabelValues("stale").Inc()
	case errors.Is(err, chunks.ErrSignature):
		m.refused.WithLabelValues("signature").Inc()
	case errors.Is(err, chunks.ErrUncertified):
		m.refused.WithLabelValues("uncertified").Inc()
	default:
		m.refused.WithLabelValues("manifest").Inc()
	}
}

func (m *Metrics) fetch(size uint64, d time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.fetches.WithLabelValues("failed").Observe(d.Seconds())
		return
	}
	m.fetched.Add(float64(size))
	m.fetches.WithLabelValues("ok").Observe(d.Seconds())
}

func (m *Metrics) serve(n int) {
	if m != nil {
		m.served.Add(float64(n))
	}
}
