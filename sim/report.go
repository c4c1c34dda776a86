package sim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a run found. Its JSON form is the output of
// `clawmesh sim --json`: a stable contract, documented field by field in
// README.md. Times are virtual seconds from the run's start; -1 (or null
// for a list) means the thing did not happen.
type Report struct {
	Seed     uint64     `json:"seed"`
	Scenario string     `json:"scenario"`
	Nodes    int        `json:"nodes"`
	Trainers int        `json:"trainers"`
	Options  Summary    `json:"options"`
	Network  NetSummary `json:"network"`
	// Versions: one line per published version.
	Versions    []VersionReport  `json:"versions"`
	Propagation Propagation      `json:"propagation"`
	Gossip      GossipReport     `json:"gossip"`
	Staleness   Staleness        `json:"staleness"`
	Work        Work             `json:"work"`
	Failovers   []Failover       `json:"failovers"`
	Bytes       Bytes            `json:"bytes"`
	Revocation  RevocationReport `json:"revocation"`
	// Learning: the score after each version (index 0 is version 1): the
	// probability that the policy's reply is the preferred one, as a share
	// of the way from the start's to 1 (the package documentation).
	Learning []float64 `json:"learning"`
	// Poison: the learning curves under each defence (Poison scenario).
	Poison []PoisonRun `json:"poison,omitempty"`
	// Sweep: propagation over NAT shares and relay counts (Relays
	// scenario).
	Sweep []SweepRow `json:"sweep,omitempty"`
	// Trust: the adversaries of the Trust scenario and what they did.
	Trust *TrustReport `json:"trust,omitempty"`
	// Personal: the personal adapters' run (only with Options.Personal).
	Personal   *PersonalReport `json:"personal,omitempty"`
	Invariants Invariants      `json:"invariants"`
	// VirtualSeconds is the virtual time the run covered; Events the
	// events the simulator ran.
	VirtualSeconds float64 `json:"virtual_s"`
	Events         uint64  `json:"events"`
}

// Summary is the options the run used, after defaults.
type Summary struct {
	Versions  int     `json:"versions"`
	BundleMiB int     `json:"bundle_mib"`
	NATShare  float64 `json:"nat_share"`
	Relays    int     `json:"relays"`
	// HolePunch: the share of NAT-to-NAT connections hole punching
	// turned direct (0: none).
	HolePunch   float64 `json:"hole_punch"`
	Degree      int     `json:"degree"`
	RoundEveryS float64 `json:"round_every_s"`
	DurationS   float64 `json:"duration_s"`
	Malicious   float64 `json:"malicious"`
	MalTrainers int     `json:"malicious_trainers"`
	Defences    string  `json:"defences"`
}

// NetSummary describes the drawn network.
type NetSummary struct {
	MedianDownMbit float64 `json:"median_down_mbit"`
	MedianUpMbit   float64 `json:"median_up_mbit"`
	MedianRTTms    float64 `json:"median_rtt_ms"`
	NAT            int     `json:"nat"`
	Relays         int     `json:"relays"`
	MeanDegree     float64 `json:"mean_degree"`
	// NATPairs: connections in the peer graph between two NAT devices;
	// Punched: those of them hole punching made direct, the only ones
	// that carry anything (the others fail, or never start when neither
	// device holds a relay reservation). Reserved: the NAT devices that
	// hold a reservation on a relay (each relay takes relayReservations).
	NATPairs int `json:"nat_pairs"`
	Punched  int `json:"punched_pairs"`
	Reserved int `json:"nat_reserved"`
}

// VersionReport is one version's spread.
type VersionReport struct {
	Version   uint64  `json:"version"`
	Term      uint64  `json:"term"`
	Index     uint64  `json:"index"`
	Published float64 `json:"published_s"`
	// Live: the denominator, devices live at publication that stayed in
	// the mesh (not gone for good, not asleep at the end without it).
	Live int `json:"live"`
	// Reach50..Reach99: seconds from publication until that share of them
	// held it (or a newer version); Bound50..Bound99 the log-tree bound.
	Reach50 float64 `json:"reach50_s"`
	Reach95 float64 `json:"reach95_s"`
	Reach99 float64 `json:"reach99_s"`
	Bound50 float64 `json:"bound50_s"`
	Bound95 float64 `json:"bound95_s"`
	Bound99 float64 `json:"bound99_s"`
	// Ratio99 is Reach99 / Bound99.
	Ratio99 float64 `json:"ratio99"`
	Score   float64 `json:"score"`
	// AwakeLive: of Live, the devices that stayed awake from the
	// publication until they held the version (or to the end of the run):
	// those no protocol could have missed. AwakeReach50..AwakeReach99 are
	// the reach times over them, AwakeBound99 the bound for their number,
	// AwakeRatio99 AwakeReach99 / AwakeBound99.
	AwakeLive    int     `json:"awake_live"`
	AwakeReach50 float64 `json:"awake_reach50_s"`
	AwakeReach95 float64 `json:"awake_reach95_s"`
	AwakeReach99 float64 `json:"awake_reach99_s"`
	AwakeBound99 float64 `json:"awake_bound99_s"`
	AwakeRatio99 float64 `json:"awake_ratio99"`
	// CutOff: of Live, the devices a partition held the version back from:
	// on a side of the cut where, when the cut began, no node held any byte
	// of it or of a newer version, and where none was published before the
	// heal. CutBound99 is the bound given the cut: Bound99, or, if 99% of
	// Live needs some of those devices, the time until enough of them could
	// have had the whole bundle, each over its own downlink from the heal
	// on, if that is later. CutRatio99 is Reach99 / CutBound99. With no
	// partition (every scenario but Partition), or none that held the
	// version back from enough devices, CutOff is 0 or CutBound99 equals
	// Bound99.
	CutOff     int     `json:"cut_off"`
	CutBound99 float64 `json:"cut_bound99_s"`
	CutRatio99 float64 `json:"cut_ratio99"`
}

// Propagation summarises the versions: the worst and median Reach99 /
// Bound99, and whether every version reached 99% within 2× the bound; the
// Awake fields the same over the devices that stayed awake until they held
// the version (VersionReport.AwakeRatio99); the Cut fields the same against
// the bound given the partition (VersionReport.CutRatio99; with no
// partition they equal the plain ones).
type Propagation struct {
	MedianRatio99      float64 `json:"median_ratio99"`
	MaxRatio99         float64 `json:"max_ratio99"`
	Within2x           bool    `json:"within_2x"`
	AwakeMedianRatio99 float64 `json:"awake_median_ratio99"`
	AwakeMaxRatio99    float64 `json:"awake_max_ratio99"`
	AwakeWithin2x      bool    `json:"awake_within_2x"`
	CutMedianRatio99   float64 `json:"cut_median_ratio99"`
	CutMaxRatio99      float64 `json:"cut_max_ratio99"`
	CutWithin2x        bool    `json:"cut_within_2x"`
}

// GossipReport: version offers and the revocation gossiped over the
// gossipsub meshes.
type GossipReport struct {
	Messages int `json:"messages"`
	// DeliveryRatio: of the devices live when a message was published, the
	// share it reached by gossip.
	DeliveryRatio float64 `json:"delivery_ratio"`
	// CopiesPerNode: copies sent per node per message; Lost: copies lost
	// on links.
	CopiesPerNode float64 `json:"copies_per_node"`
	Lost          int     `json:"lost"`
	// IHavesPerNode: gossipsub IHAVEs sent per node per message; Pulled:
	// copies sent because a node asked for them (IWANT) after an IHAVE.
	IHavesPerNode float64 `json:"ihaves_per_node"`
	Pulled        int     `json:"pulled"`
	// Reach99S: the longest any message took to reach 99% of the devices
	// live at its publication (seconds; -1 if one never did).
	Reach99S float64 `json:"reach99_s"`
}

// Staleness: how long live devices served an adapter older than the newest
// committed one.
type Staleness struct {
	// Share of live device-time spent serving an older version.
	Share float64 `json:"share"`
	// MeanPerVersion: mean seconds a live device lagged per version.
	MeanPerVersion float64 `json:"mean_per_version_s"`
}

// Work counts batches and training.
type Work struct {
	Batches int `json:"batches"`
	Trained int `json:"trained"`
	// TrainedTwice: batches in more than one version (must be 0).
	TrainedTwice int `json:"trained_twice"`
	// Retrained: batches trained more than once because a round's result
	// was lost (aborted, late); WastedSamples the samples trained for
	// nothing.
	Retrained     int `json:"retrained"`
	WastedSamples int `json:"wasted_samples"`
	// Dropped: batches refused (by reason), refused at intake, or shipped
	// when no trainer could hear of them (Unannounced). Pending: in the
	// ledger, not trained yet.
	Refused       map[string]int `json:"refused"`
	IntakeRefused int            `json:"intake_refused"`
	Unannounced   int            `json:"unannounced"`
	Pending       int            `json:"pending"`
}

// Bytes moved by the weights service.
type Bytes struct {
	// PerNodePerVersionMiB: chunk bytes sent per device per version;
	// TrainerPerVersionMiB: by the trainers together per version;
	// MaxNodePerVersionMiB: by the busiest device.
	PerNodePerVersionMiB float64 `json:"per_node_per_version_mib"`
	TrainerPerVersionMiB float64 `json:"trainer_per_version_mib"`
	MaxNodePerVersionMiB float64 `json:"max_node_per_version_mib"`
	WastedMiB            float64 `json:"wasted_mib"`
	// RelayedMiB is always 0: nothing of the mesh's crosses a relay (see
	// linked); it stays for the readers of earlier reports.
	RelayedMiB float64 `json:"relayed_mib"`
	GossipMiB  float64 `json:"gossip_mib"`
}

// RevocationReport: the run's revocation of one device.
type RevocationReport struct {
	Peer   string  `json:"peer"`
	Issued float64 `json:"issued_s"`
	// Reached: devices that learnt of it; AllBy when the last of them did.
	Reached int     `json:"reached"`
	AllBy   float64 `json:"all_by_s"`
	// AfterLearnt: things the revoked peer received from a node after that
	// node learnt of the revocation (must be 0).
	AfterLearnt int `json:"after_learnt"`
}

// Invariants: OK when every check held; Violations says which did not.
type Invariants struct {
	OK         bool     `json:"ok"`
	Violations []string `json:"violations"`
}

// PoisonRun is one learning curve of the Poison scenario.
type PoisonRun struct {
	Defences  string    `json:"defences"`
	Malicious float64   `json:"malicious"`
	Scores    []float64 `json:"scores"`
	Final     float64   `json:"final"`
	// Refused: batches refused by re-verification; IntakeRefused at intake.
	Refused       int `json:"refused_verify"`
	IntakeRefused int `json:"intake_refused"`
}

// SweepRow is one configuration of the Relays scenario.
type SweepRow struct {
	NATShare      float64 `json:"nat_share"`
	Relays        int     `json:"relays"`
	HolePunch     float64 `json:"hole_punch"`
	MedianReach99 float64 `json:"median_reach99_s"`
	MedianRatio99 float64 `json:"median_ratio99"`
	RelayedMiB    float64 `json:"relayed_mib"` // always 0 (Bytes.RelayedMiB)
	Converged     bool    `json:"converged"`
	// Reserved, NATPairs and Punched are the drawn network's (NetSummary).
	Reserved int `json:"nat_reserved"`
	NATPairs int `json:"nat_pairs"`
	Punched  int `json:"punched_pairs"`
}

func round3(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return -1
	}
	return math.Round(x*1000) / 1000
}

// report builds the Report of a finished run.
func (w *world) report() *Report {
	o := w.o
	r := &Report{Seed: o.Seed, Scenario: o.Scenario, Nodes: o.Nodes, Trainers: o.Trainers,
		Options: Summary{Versions: o.Versions, BundleMiB: o.BundleMiB, NATShare: max(0, o.NATShare), Relays: len(w.relays), HolePunch: max(0, o.HolePunch), Degree: o.Degree,
			RoundEveryS: o.RoundEvery.Seconds(), DurationS: o.Duration.Seconds(), Defences: w.def.Name},
		VirtualSeconds: round3(seconds(w.now)), Events: w.events, Failovers: w.failovers}
	if o.Scenario == Poison {
		r.Options.Malicious, r.Options.MalTrainers = max(0, o.Malicious), max(0, o.MaliciousTrainers)
	}
	if r.Failovers == nil {
		r.Failovers = []Failover{}
	}
	// Network.
	var downs, ups, rtts []float64
	nat, reserved, deg, natPairs, punched := 0, 0, 0, 0, 0
	for i := range o.Nodes {
		n := w.nodes[i]
		downs, ups, rtts = append(downs, n.down/mbit), append(ups, n.up/mbit), append(rtts, 2*n.lat.Seconds()*1000)
		if n.nat {
			nat++
			if n.relay >= 0 {
				reserved++
			}
			for _, j := range n.nbrs {
				if m := w.nodes[j]; j > i && m.nat {
					natPairs++
					if w.linked(n, m) {
						punched++
					}
				}
			}
		}
		deg += len(n.nbrs)
	}
	r.Network = NetSummary{MedianDownMbit: round3(median(downs)), MedianUpMbit: round3(median(ups)), MedianRTTms: round3(median(rtts)),
		NAT: nat, Relays: len(w.relays), MeanDegree: round3(float64(deg) / float64(o.Nodes)), NATPairs: natPairs, Punched: punched, Reserved: reserved}
	// Versions and the bound.
	hop := w.hopTime()
	// at is the time until a share q of n devices held a version, given
	// the sorted times of those that did; bound is the log-tree bound.
	bound := func(n int, q float64) float64 {
		k := math.Ceil(q * float64(n))
		return round3(math.Ceil(math.Log2(k+1)) * hop)
	}
	ratioOf := func(reach, bound float64) float64 {
		if reach >= 0 && bound > 0 {
			return round3(reach / bound)
		}
		return -1
	}
	var ratios, awakeRatios, cutRatios []float64
	for k, ver := range w.lineage {
		v := ver.Version
		vr := VersionReport{Version: v, Term: ver.Term, Index: ver.Index, Published: round3(seconds(w.pubAt[v])), Score: round3(w.scores[k])}
		// The devices live at publication that stayed: not gone for good,
		// and not asleep at the end without the version. Of those, the
		// awake ones did not sleep or leave before they held it, and the
		// cut-off ones could not have held it before the earliest time
		// cutOff gives.
		var times, awake []float64
		var cutOff []time.Duration
		earliest := w.cutOff(v)
		for i := range o.Nodes {
			t := w.reached[v][i]
			if !w.liveAtPub[v][i] || w.isVictim(i) || w.nodes[i].left && t < 0 || w.nodes[i].asleep && t < 0 {
				continue
			}
			vr.Live++
			if earliest != nil && earliest[i] >= 0 {
				cutOff = append(cutOff, earliest[i])
			}
			if t >= 0 {
				times = append(times, seconds(t-w.pubAt[v]))
			}
			if w.slept(i, w.pubAt[v], t) {
				continue
			}
			vr.AwakeLive++
			if t >= 0 {
				awake = append(awake, seconds(t-w.pubAt[v]))
			}
		}
		slices.Sort(times)
		slices.Sort(awake)
		vr.Reach50, vr.Reach95, vr.Reach99 = at(times, vr.Live, 0.5), at(times, vr.Live, 0.95), at(times, vr.Live, 0.99)
		vr.Bound50, vr.Bound95, vr.Bound99 = bound(vr.Live, 0.5), bound(vr.Live, 0.95), bound(vr.Live, 0.99)
		vr.Ratio99 = ratioOf(vr.Reach99, vr.Bound99)
		if vr.Ratio99 >= 0 {
			ratios = append(ratios, vr.Ratio99)
		}
		// Given the cut: if 99% needs need of the cut-off devices, it
		// comes no sooner than the need-th earliest of them.
		vr.CutOff, vr.CutBound99 = len(cutOff), vr.Bound99
		if need := int(math.Ceil(0.99*float64(vr.Live))) - (vr.Live - vr.CutOff); need > 0 {
			slices.Sort(cutOff)
			vr.CutBound99 = max(vr.Bound99, round3(seconds(cutOff[need-1]-w.pubAt[v])))
		}
		vr.CutRatio99 = ratioOf(vr.Reach99, vr.CutBound99)
		if vr.CutRatio99 >= 0 {
			cutRatios = append(cutRatios, vr.CutRatio99)
		}
		vr.AwakeReach50, vr.AwakeReach95, vr.AwakeReach99 = at(awake, vr.AwakeLive, 0.5), at(awake, vr.AwakeLive, 0.95), at(awake, vr.AwakeLive, 0.99)
		vr.AwakeBound99 = bound(vr.AwakeLive, 0.99)
		vr.AwakeRatio99 = ratioOf(vr.AwakeReach99, vr.AwakeBound99)
		if vr.AwakeRatio99 >= 0 {
			awakeRatios = append(awakeRatios, vr.AwakeRatio99)
		}
		r.Versions = append(r.Versions, vr)
		r.Learning = append(r.Learning, vr.Score)
	}
	if r.Learning == nil {
		r.Learning = []float64{}
	}
	r.Propagation.MedianRatio99, r.Propagation.MaxRatio99, r.Propagation.Within2x = summarise(ratios, len(r.Versions))
	r.Propagation.AwakeMedianRatio99, r.Propagation.AwakeMaxRatio99, r.Propagation.AwakeWithin2x = summarise(awakeRatios, len(r.Versions))
	r.Propagation.CutMedianRatio99, r.Propagation.CutMaxRatio99, r.Propagation.CutWithin2x = summarise(cutRatios, len(r.Versions))
	// Gossip.
	var live, got, copies, lost, ihaves, pulled int
	var reach99 float64
	for _, m := range w.msgs {
		live += m.liveAt
		got += m.delivered
		copies += m.copies
		lost += m.lost
		ihaves += m.ihaves
		pulled += m.pulled
		if t := at(m.deliveredAt, m.liveAt, 0.99); t < 0 || reach99 < 0 {
			reach99 = -1
		} else {
			reach99 = max(reach99, t)
		}
	}
	r.Gossip = GossipReport{Messages: len(w.msgs), Lost: lost, Pulled: pulled, Reach99S: reach99}
	if live > 0 {
		r.Gossip.DeliveryRatio = round3(float64(got) / float64(live))
	}
	if len(w.msgs) > 0 {
		r.Gossip.CopiesPerNode = round3(float64(copies) / float64(len(w.msgs)*len(w.nodes)))
		r.Gossip.IHavesPerNode = round3(float64(ihaves) / float64(len(w.msgs)*len(w.nodes)))
	}
	// Staleness.
	var stale, liveTime time.Duration
	devices := 0
	for i := range o.Nodes {
		if !w.isVictim(i) {
			stale += w.peers[i].stale
			liveTime += w.peers[i].liveTime
			devices++
		}
	}
	if w.published > 0 {
		r.Staleness.MeanPerVersion = round3(stale.Seconds() / float64(devices*w.published))
		if liveTime > 0 {
			r.Staleness.Share = round3(stale.Seconds() / liveTime.Seconds())
		}
	}
	// Work.
	st := w.trainers[0].st
	r.Work = Work{Batches: len(w.batches), Trained: st.Counts["trained"], Refused: map[string]int{}, WastedSamples: w.wastedSamples, Unannounced: w.unannounced, Pending: st.Counts["pending"] + st.Counts["assigned"]}
	for k, n := range st.Refusals {
		r.Work.Refused[k] = n
	}
	for _, n := range w.intake {
		r.Work.IntakeRefused += n
	}
	in := map[string]int{}
	for _, v := range st.Versions {
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				in[string(id)]++
			}
		}
	}
	for _, n := range in {
		if n > 1 {
			r.Work.TrainedTwice++
		}
	}
	for _, n := range w.trainedTimes {
		if n > 1 {
			r.Work.Retrained++
		}
	}
	// Bytes.
	if w.published > 0 {
		var dev, tr, mx int64
		for i, p := range w.peers {
			if i < o.Nodes {
				dev += p.bytesUp
				mx = max(mx, p.bytesUp)
			} else {
				tr += p.bytesUp
			}
		}
		pv := float64(w.published) * (1 << 20)
		r.Bytes = Bytes{PerNodePerVersionMiB: round3(float64(dev) / float64(o.Nodes) / pv), TrainerPerVersionMiB: round3(float64(tr) / pv),
			MaxNodePerVersionMiB: round3(float64(mx) / pv)}
	}
	r.Bytes.WastedMiB = round3(float64(w.wastedBytes) / (1 << 20))
	r.Bytes.GossipMiB = round3(float64(w.gossipBytes) / (1 << 20))
	// Revocation.
	r.Revocation = RevocationReport{Peer: string(w.nodes[w.victim].pid), Issued: -1, AllBy: -1}
	if w.revokedAt > 0 {
		r.Revocation.Issued = round3(seconds(w.revokedAt))
		var last time.Duration
		for i := range o.Nodes {
			if l := w.peers[i].learnt; l >= 0 {
				r.Revocation.Reached++
				last = max(last, l)
			}
		}
		r.Revocation.AllBy = round3(seconds(last))
	}
	for _, rc := range w.victimReceipts {
		if l := w.peers[rc.from].learnt; l >= 0 && l <= rc.at {
			r.Revocation.AfterLearnt++
		}
	}
	r.Invariants = Invariants{OK: len(w.violations) == 0, Violations: w.violations}
	if r.Invariants.Violations == nil {
		r.Invariants.Violations = []string{}
	}
	return r
}

// summarise returns the median and the worst of the versions' ratios (-1
// if some of the n versions have none) and whether all n are within 2×.
func summarise(ratios []float64, n int) (med, worst float64, within2x bool) {
	within2x = len(ratios) == n && n > 0
	for _, x := range ratios {
		worst = math.Max(worst, x)
		if x > 2 {
			within2x = false
		}
	}
	med = round3(median(slices.Clone(ratios)))
	if len(ratios) < n {
		worst = -1
	}
	return med, worst, within2x
}

// slept reports whether device i fell asleep or left in [from, until), or
// from from on if until is negative (it never held the version).
func (w *world) slept(i int, from, until time.Duration) bool {
	for _, s := range w.peers[i].sleeps {
		if s >= from && (until < 0 || s < until) {
			return true
		}
	}
	return false
}

// cutOff returns, by node, the earliest time it could have held version v
// (or a newer one) given the run's partition, or -1 where the partition
// did not hold v back from it; nil if it held v back from no one.
//
// A side of the cut holds v back if, when the cut began, none of its nodes
// held any byte of v or of a newer version, nor had asked for one, and no
// node of it published one before the heal: until the heal, no byte of
// such a version can reach its nodes by any protocol. Each of them can
// hold one no sooner than the heal plus the whole bundle at its own
// downlink (however many holders send to it at once) plus its latency and
// the lowest latency of any node on the other side.
func (w *world) cutOff(v uint64) []time.Duration {
	c := w.cut
	if c == nil || c.healed < 0 || w.pubAt[v] >= c.healed {
		return nil
	}
	back := make([]bool, slices.Max(c.side)+1)
	for s := range back {
		back[s] = true
	}
	for i, s := range c.side {
		if c.had[i] >= v {
			back[s] = false
		}
	}
	for u := v; int(u) < len(w.pubAt); u++ {
		if t := w.pubAt[u]; t >= c.began && t < c.healed {
			back[c.side[w.pubBy[u]]] = false
		}
	}
	if !slices.Contains(back, true) {
		return nil
	}
	var lat time.Duration = -1
	for i, n := range w.nodes {
		if !back[c.side[i]] && (lat < 0 || n.lat < lat) {
			lat = n.lat
		}
	}
	if lat < 0 {
		return nil // every side held it back: no node had it
	}
	bundle := float64(w.o.BundleMiB << 20)
	at := make([]time.Duration, len(w.nodes))
	for i, n := range w.nodes {
		at[i] = -1
		if back[c.side[i]] {
			at[i] = c.healed + time.Duration(bundle/n.down*float64(time.Second)) + n.lat + lat
		}
	}
	return at
}

// at is when a share q of n devices held something, given the times (in
// order) at which those that did got it: -1 if fewer than that did.
func at(times []float64, n int, q float64) float64 {
	need := int(math.Ceil(q * float64(n)))
	if need == 0 {
		return 0
	}
	if need > len(times) {
		return -1
	}
	return round3(times[need-1])
}

// hopTime is one hop of the log-tree bound: a whole bundle over the median
// device link (the smaller of the median uplink and the median downlink)
// plus the median one-way latency between two devices.
func (w *world) hopTime() float64 {
	var ups, downs, lats []float64
	for i := range w.o.Nodes {
		n := w.nodes[i]
		ups, downs, lats = append(ups, n.up), append(downs, n.down), append(lats, n.lat.Seconds())
	}
	rate := math.Min(median(ups), median(downs))
	return float64(w.o.BundleMiB<<20)/rate + 2*median(lats)
}

// WriteTable prints the report for people: the seed first.
func (r *Report) WriteTable(out io.Writer) error {
	var b strings.Builder
	f := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	f("seed %d, scenario %s: %d devices, %d trainers, %d MiB bundles\n", r.Seed, r.Scenario, r.Nodes, r.Trainers, r.Options.BundleMiB)
	f("network: median down %.0f Mbit/s, up %.1f Mbit/s, RTT %.0f ms; %d behind NAT, %d of them with a reservation on one of %d relays; mean degree %.1f\n",
		r.Network.MedianDownMbit, r.Network.MedianUpMbit, r.Network.MedianRTTms, r.Network.NAT, r.Network.Reserved, r.Network.Relays, r.Network.MeanDegree)
	f("hole punching: %.0f%% of NAT-to-NAT connections; %d of %d in the peer graph direct, %d carry nothing (relays only broker the punch)\n",
		100*r.Options.HolePunch, r.Network.Punched, r.Network.NATPairs, r.Network.NATPairs-r.Network.Punched)
	f("\nadapter versions reaching the live devices (seconds after publication; bound: log-tree at median links)\n")
	// A partition run adds the bound given the cut (elsewhere it is the
	// bound).
	cut := r.Scenario == Partition
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "version\tterm\tindex\tpublished\tlive\t50%\t95%\t99%\tbound 99%\t99%/bound\t")
	if cut {
		fmt.Fprint(tw, "cut off\tcut bound 99%\t99%/cut bound\t")
	}
	fmt.Fprintln(tw, "stayed up\ttheir 99%\ttheir 99%/bound\tscore\t")
	for _, v := range r.Versions {
		fmt.Fprintf(tw, "v%d\t%d\t%d\t%.1f\t%d\t%s\t%s\t%s\t%.1f\t%s\t", v.Version, v.Term, v.Index, v.Published, v.Live,
			secs(v.Reach50), secs(v.Reach95), secs(v.Reach99), v.Bound99, ratio(v.Ratio99))
		if cut {
			fmt.Fprintf(tw, "%d\t%.1f\t%s\t", v.CutOff, v.CutBound99, ratio(v.CutRatio99))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.3f\t\n", v.AwakeLive, secs(v.AwakeReach99), ratio(v.AwakeRatio99), v.Score)
	}
	tw.Flush()
	f("99%% within 2x the bound: %v (median %.2fx, worst %s)\n", r.Propagation.Within2x, r.Propagation.MedianRatio99, ratio(r.Propagation.MaxRatio99))
	if cut {
		f("99%% within 2x the bound given the cut (none of the cut-off devices before the heal): %v (median %.2fx, worst %s)\n",
			r.Propagation.CutWithin2x, r.Propagation.CutMedianRatio99, ratio(r.Propagation.CutMaxRatio99))
	}
	f("99%% of those that stayed up until they held it, within 2x the bound: %v (median %.2fx, worst %s)\n",
		r.Propagation.AwakeWithin2x, r.Propagation.AwakeMedianRatio99, ratio(r.Propagation.AwakeMaxRatio99))
	f("\ngossip: %d messages, delivery ratio %.4f, %.2f copies per node per message, %d lost on links\n",
		r.Gossip.Messages, r.Gossip.DeliveryRatio, r.Gossip.CopiesPerNode, r.Gossip.Lost)
	f("gossipsub: %.2f IHAVEs per node per message, %d copies pulled by IWANT; every message at 99%% of the live devices within %s\n",
		r.Gossip.IHavesPerNode, r.Gossip.Pulled, secondsOrNever(r.Gossip.Reach99S))
	f("staleness: %.2f%% of live device-time on an older adapter, %.1f s per device per version\n", 100*r.Staleness.Share, r.Staleness.MeanPerVersion)
	f("bytes per version: %.1f MiB per device (busiest %.1f), %.1f MiB from the trainers; wasted %.1f MiB, gossip %.1f MiB\n",
		r.Bytes.PerNodePerVersionMiB, r.Bytes.MaxNodePerVersionMiB, r.Bytes.TrainerPerVersionMiB, r.Bytes.WastedMiB, r.Bytes.GossipMiB)
	keys := make([]string, 0, len(r.Work.Refused))
	for k := range r.Work.Refused {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var refused []string
	for _, k := range keys {
		refused = append(refused, fmt.Sprintf("%s %d", k, r.Work.Refused[k]))
	}
	f("work: %d batches, %d trained, %d trained twice, %d retrained, %d samples wasted, %d pending; refused: %s; at intake %d; unheard of %d\n",
		r.Work.Batches, r.Work.Trained, r.Work.TrainedTwice, r.Work.Retrained, r.Work.WastedSamples, r.Work.Pending, orNone(strings.Join(refused, ", ")), r.Work.IntakeRefused, r.Work.Unannounced)
	if len(r.Failovers) == 0 {
		f("failovers: none\n")
	}
	for _, fo := range r.Failovers {
		f("failover (%s at %.1f s): elected at %.1f s, committing again at %.1f s: %.2f s (term %d)\n", fo.Cause, fo.At, fo.Elected, fo.Committed, fo.Seconds, fo.Term)
	}
	f("revocation of %s at %s: %d devices learnt it, the last at %s; %d things reached it after its sender knew\n",
		r.Revocation.Peer, secs(r.Revocation.Issued), r.Revocation.Reached, secs(r.Revocation.AllBy), r.Revocation.AfterLearnt)
	if len(r.Poison) > 0 {
		f("\nlearning under poisoning (score after each version; 1 is the target)\n")
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "defences\tmalicious\tfinal\trefused (verify)\tat intake\tcurve\t")
		for _, p := range r.Poison {
			var c []string
			for _, s := range p.Scores {
				c = append(c, fmt.Sprintf("%.2f", s))
			}
			fmt.Fprintf(tw, "%s\t%.0f%%\t%.3f\t%d\t%d\t%s\t\n", p.Defences, 100*p.Malicious, p.Final, p.Refused, p.IntakeRefused, strings.Join(c, " "))
		}
		tw.Flush()
	}
	if t := r.Trust; t != nil {
		writeTrust(f, &b, t)
	}
	if len(r.Sweep) > 0 {
		f("\nNAT and relays\n")
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "NAT share\trelays\thole punching\tNAT reserved\tNAT pairs direct\tmedian 99%\tmedian 99%/bound\tconverged\t")
		for _, s := range r.Sweep {
			fmt.Fprintf(tw, "%.0f%%\t%d\t%.0f%%\t%d\t%d of %d\t%s\t%s\t%v\t\n", 100*s.NATShare, s.Relays, 100*s.HolePunch, s.Reserved, s.Punched, s.NATPairs,
				secs(s.MedianReach99), ratio(s.MedianRatio99), s.Converged)
		}
		tw.Flush()
	}
	if pr := r.Personal; pr != nil {
		writePersonal(f, &b, pr)
	}
	f("\ninvariants: ")
	if r.Invariants.OK {
		f("all held (no batch trained twice, versions increase with (term, index), live devices converged, revoked peer cut off)\n")
	} else {
		f("%d violated\n", len(r.Invariants.Violations))
		for _, v := range r.Invariants.Violations {
			f("  %s\n", v)
		}
	}
	f("%.0f virtual seconds, %d events\n", r.VirtualSeconds, r.Events)
	_, err := io.WriteString(out, b.String())
	return err
}

func secs(x float64) string {
	if x < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", x)
}

func ratio(x float64) string {
	if x < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// secondsOrNever prints a figure in seconds, or "never" for -1.
func secondsOrNever(s float64) string {
	if s < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1f s", s)
}
