package trainer

import (
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/clawmesh/clawmesh/mesh/weights"
)

// metrics are a trainer's Prometheus metrics, served at GET /metrics on
// its admin listener (with the admin token, as the rest of it). The
// group's figures (raft, rounds, versions, the ledger) are read from
// Status when scraped; the weight transfers are counted by the weights
// service as they happen; the bounds on each peer's work (announcements
// dropped, pulls, strikes, disconnections, the memory pulls and the
// trainers' streams take) are read from their counters.
type metrics struct {
	reg     *prometheus.Registry
	weights *weights.Metrics
}

func newMetrics(t *Trainer) *metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(statusCollector{t}, boundsCollector{t}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &metrics{reg: reg, weights: weights.NewMetrics(reg)}
}

// metricsOf returns the trainer's metrics, making them on first use.
func (t *Trainer) metricsOf() *metrics {
	t.metricsOnce.Do(func() { t.metrics = newMetrics(t) })
	return t.metrics
}

// Metrics serves the trainer's Prometheus metrics.
func (t *Trainer) Metrics() http.Handler {
	m := t.metricsOf()
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

var (
	descLeader   = prometheus.NewDesc("clawmesh_trainer_leader", "1 if this trainer leads the group, else 0.", nil, nil)
	descTerm     = prometheus.NewDesc("clawmesh_trainer_raft_term", "The raft term this trainer is in.", nil, nil)
	descApplied  = prometheus.NewDesc("clawmesh_trainer_raft_applied_index", "The last raft log index applied to the group's state.", nil, nil)
	descVoters   = prometheus.NewDesc("clawmesh_trainer_group_voters", "Voting members of the trainers' group.", nil, nil)
	descRounds   = prometheus.NewDesc("clawmesh_trainer_rounds_total", "Training rounds the group started.", nil, nil)
	descRound    = prometheus.NewDesc("clawmesh_trainer_round_open", "The number of the round in progress (0: none).", nil, nil)
	descShares   = prometheus.NewDesc("clawmesh_trainer_round_batches", "Batches assigned to the round in progress.", nil, nil)
	descVersion  = prometheus.NewDesc("clawmesh_trainer_adapter_version", "The newest adapter version committed (0: the base model).", nil, nil)
	descVersions = prometheus.NewDesc("clawmesh_trainer_versions", "Adapter versions committed, version 0 included.", nil, nil)
	descBatches  = prometheus.NewDesc("clawmesh_trainer_batches", "Batches in the group's ledger, by status (pending, assigned, trained, refused).", []string{"status"}, nil)
	descRefused  = prometheus.NewDesc("clawmesh_trainer_batches_refused_total", "Batches refused, by reason (stale: made by a version too many versions old; revoked; verify; ...).", []string{"reason"}, nil)
	descStaleMax = prometheus.NewDesc("clawmesh_trainer_max_lag_versions", "How many versions old a batch's policy may be before it is refused as stale.", nil, nil)
	descPrompts  = prometheus.NewDesc("clawmesh_trainer_task_prompts", "A task set's prompts in the ledger (one per prompt and epoch), by status (pending, assigned, trained).", []string{"set", "status"}, nil)
	descPassAt1  = prometheus.NewDesc("clawmesh_trainer_task_pass_at_1", "The newest evaluated version's pass@1 on a task set's held-out split.", []string{"set"}, nil)
	descTaskRwd  = prometheus.NewDesc("clawmesh_trainer_task_mean_reward", "The newest evaluated version's mean verifier reward on a task set's held-out split.", []string{"set"}, nil)
	descEvalVer  = prometheus.NewDesc("clawmesh_trainer_task_evaluated_version", "The newest version evaluated on a task set's held-out split.", []string{"set"}, nil)
)

// statusCollector reads a trainer's Status once per scrape.
type statusCollector struct{ t *Trainer }

func (c statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeader, descTerm, descApplied, descVoters, descRounds, descRound, descShares, descVersion, descVersions, descBatches, descRefused, descStaleMax,
		descPrompts, descPassAt1, descTaskRwd, descEvalVer} {
		ch <- d
	}
}

func (c statusCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.t.Status()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	leader := 0.0
	if st.State == "leader" {
		leader = 1
	}
	g(descLeader, leader)
	g(descTerm, float64(st.Term))
	g(descApplied, float64(st.Applied))
	g(descVoters, float64(len(st.Voters)))
	ch <- prometheus.MustNewConstMetric(descRounds, prometheus.CounterValue, float64(st.Rounds))
	round, shares := 0.0, 0
	if st.Round != nil {
		round = float64(st.Round.Number)
		for _, n := range st.Round.Shares {
			shares += n
		}
	}
	g(descRound, round)
	g(descShares, float64(shares))
	version := 0.0
	if st.Version != nil {
		version = float64(st.Version.Version.Version)
	}
	g(descVersion, version)
	g(descVersions, float64(st.Versions))
	g(descBatches, float64(st.Batches.Pending), "pending")
	g(descBatches, float64(st.Batches.Assigned), "assigned")
	g(descBatches, float64(st.Batches.Trained), "trained")
	g(descBatches, float64(st.Batches.Refused), "refused")
	reasons := []string{"stale"}
	for r := range st.Refusals {
		if r != "stale" {
			reasons = append(reasons, r)
		}
	}
	sort.Strings(reasons[1:])
	for _, r := range reasons {
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(st.Refusals[r]), r)
	}
	g(descStaleMax, float64(st.Config.WithDefaults().MaxLag))
	for _, ts := range c.t.TaskSets() {
		set := shortHash(ts.Hash)
		g(descPrompts, float64(ts.Pending), set, "pending")
		g(descPrompts, float64(ts.Assigned), set, "assigned")
		g(descPrompts, float64(ts.Done), set, "trained")
		if n := len(ts.Evals); n > 0 {
			e := ts.Evals[n-1]
			g(descPassAt1, e.PassAt1, set)
			g(descTaskRwd, e.MeanReward, set)
			g(descEvalVer, float64(e.Version), set)
		}
	}
}

// shortHash is the first 16 hex digits of a hash, as metrics label sets.
func shortHash(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
}

var (
	descAnnounced   = prometheus.NewDesc("clawmesh_trainer_announcements_total", "Batch announcements received.", nil, nil)
	descDropped     = prometheus.NewDesc("clawmesh_trainer_announcements_dropped_total", "Batch announcements dropped: over the device's rate or queue, not from an admitted device, or malformed.", nil, nil)
	descPulls       = prometheus.NewDesc("clawmesh_trainer_pulls_total", "Batch pulls started.", nil, nil)
	descPullsFailed = prometheus.NewDesc("clawmesh_trainer_pulls_failed_total", "Batch pulls that failed, including batches refused once pulled.", nil, nil)
	descStrikes     = prometheus.NewDesc("clawmesh_trainer_peer_strikes_total", "Strikes against devices that overstepped their bounds (announcement floods, batches announced and not served or not matching, stalls).", nil, nil)
	descDisconnects = prometheus.NewDesc("clawmesh_trainer_peer_disconnects_total", "Peers disconnected for overstepping their bounds, by protocol (pull: batch announcements and pulls; rpc: trainers' streams).", []string{"protocol"}, nil)
	descPullAlloc   = prometheus.NewDesc("clawmesh_trainer_pull_allocated_bytes_total", "Bytes allocated for the bodies of pulled batches (taken as the bytes arrive).", nil, nil)
	descPullHeld    = prometheus.NewDesc("clawmesh_trainer_pull_held_bytes", "Bytes held now by batch pulls in progress.", nil, nil)
	descPullPeak    = prometheus.NewDesc("clawmesh_trainer_pull_held_peak_bytes", "The most bytes batch pulls held at once.", nil, nil)
	descPullBudget  = prometheus.NewDesc("clawmesh_trainer_pull_reserved_bytes", "Bytes of the pull budget (--pull-budget) the pulls in progress reserve.", nil, nil)
	descRPCRefused  = prometheus.NewDesc("clawmesh_trainer_rpc_streams_refused_total", "Trainers' streams reset because their peer had too many open at once.", nil, nil)
	descRPCAlloc    = prometheus.NewDesc("clawmesh_trainer_rpc_allocated_bytes_total", "Bytes allocated for the payloads of trainers' streams (taken as the bytes arrive).", nil, nil)
)

// boundsCollector reads the counters of the bounds on each peer's work.
type boundsCollector struct{ t *Trainer }

func (c boundsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAnnounced, descDropped, descPulls, descPullsFailed, descStrikes, descDisconnects, descPullAlloc, descPullHeld, descPullPeak, descPullBudget, descRPCRefused, descRPCAlloc} {
		ch <- d
	}
}

func (c boundsCollector) Collect(ch chan<- prometheus.Metric) {
	p, r := &c.t.pulls, &c.t.rpc
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(descAnnounced, p.Announcements.Load())
	counter(descDropped, p.Dropped.Load())
	counter(descPulls, p.Pulls.Load())
	counter(descPullsFailed, p.Failed.Load())
	counter(descStrikes, p.Strikes.Load())
	counter(descDisconnects, p.Disconnects.Load(), "pull")
	counter(descDisconnects, r.disconnects.Load(), "rpc")
	counter(descPullAlloc, p.Allocated.Load())
	gauge(descPullHeld, p.Held.Load())
	gauge(descPullPeak, p.HeldPeak.Load())
	gauge(descPullBudget, p.Reserved.Load())
	counter(descRPCRefused, r.refused.Load())
	counter(descRPCAlloc, r.allocated.Load())
}
