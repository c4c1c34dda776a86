package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/time/rate"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// The trust scenario's models (see the package documentation).
const (
	// floodRate is how many announcements a flooding device sends a
	// second: 128 times the token bucket's rate.
	floodRate = 1024
	floodTick = 100 * time.Millisecond
	// floodRedial is how long a disconnected flooder takes to dial back.
	floodRedial = time.Second
	// floodBound is the factor within which the honest batches' ingest
	// and the versions' propagation stay of the clean run's under a flood.
	floodBound = 1.5
	// absorbedWithin is how near the clean run's a learning curve must
	// stay (final score and area under the curve) for the mesh to absorb
	// a share of rogue volunteers.
	absorbedWithin = 0.9
	// benchConfidence is the probability with which BenchBound rounds
	// bench a rogue volunteer.
	benchConfidence = 0.999
	// sweepTrainers, sweepVoters and sweepNodes are the sweep's mesh:
	// 10 trainers, so that a rogue volunteer is 10% of them.
	sweepTrainers = 10
	sweepVoters   = 3
	sweepNodes    = 200
	sweepSeeds    = 3
)

// Forgeries of a rogue volunteer's delta, in turn.
const (
	forgeSubtle = 1 + iota // the honest delta reversed, at its honest length
	forgeHuge              // reversed and hugeFactor times as long
)

// trust is the trust scenario's state.
type trust struct {
	rSpot *rand.Rand
	// By trainer: its forgery (0: honest volunteer or voter); whether it is
	// a rogue voter; whether the honest voters stopped answering it.
	forge      []int
	rogueVoter []bool
	distrusted []bool
	roguesLeft int
	// By trainer: rounds whose delta reached the leader; the round it was
	// benched in (0: not) and its rounds until then.
	contributed []int
	benchedIn   []uint64
	benchedAt   []int
	checks      int
	caught      int

	// forged: adapter hashes of the versions a rogue leader forged.
	forged            map[string]bool
	forgedVersions    int
	retractions       int
	forgedOffers      int // offers of forged versions devices refused
	forgedAccepted    int
	uncertifiedAccept int

	flooders                                                      []int
	links                                                         [][]*floodLink // by flooder, by trainer
	floodSeq                                                      int
	announced, taken, dropped, queueDropped, strikes, disconnects int

	// ingest: honest devices' batches, seconds from shipping to the
	// leader's ledger.
	ingest   []float64
	ingested map[core.BatchID]bool
}

// floodLink is a trainer's view of one flooding device: the announcements'
// token bucket (the real golang.org/x/time/rate limiter, with mesh's
// constants), its strikes (as mesh's puller counts them), when it may
// dial back after a disconnection, and its announcements waiting to be
// pulled.
type floodLink struct {
	lim     *rate.Limiter
	strikes float64
	struck  time.Duration
	down    time.Duration
	queued  []core.BatchID
}

func (w *world) setupTrust() {
	o := w.o
	tr := &trust{rSpot: stream(o.Seed, "spot checks"), forged: map[string]bool{}, ingested: map[core.BatchID]bool{},
		forge: make([]int, o.Trainers), rogueVoter: make([]bool, o.Trainers), distrusted: make([]bool, o.Trainers),
		contributed: make([]int, o.Trainers), benchedIn: make([]uint64, o.Trainers), benchedAt: make([]int, o.Trainers),
		roguesLeft: max(0, o.RogueVoters)}
	// The last volunteers are rogue, their forgeries in turn.
	for k := range max(0, o.RogueVolunteers) {
		tr.forge[o.Trainers-1-k] = forgeSubtle + k%2
	}
	if o.Flooders > 0 {
		rf := stream(o.Seed, "flood")
		for _, i := range rf.Perm(o.Nodes) {
			if len(tr.flooders) == o.Flooders {
				break
			}
			if !w.nodes[i].isRelay {
				tr.flooders = append(tr.flooders, i)
			}
		}
		slices.Sort(tr.flooders)
		for range tr.flooders {
			var row []*floodLink
			for range w.trainers {
				row = append(row, &floodLink{lim: rate.NewLimiter(mesh.AnnounceRate, mesh.AnnounceBurst)})
			}
			tr.links = append(tr.links, row)
		}
	}
	w.trust = tr
}

func (w *world) isVoter(t *trainerPeer) bool { return t.i < w.o.Voters }

// elected: the trust scenario's rogue voters are the first leader and the
// voters after it.
func (w *world) elected(t *trainerPeer) {
	tr := w.trust
	if tr == nil || tr.roguesLeft == 0 {
		return
	}
	for k := range w.o.Voters {
		if v := w.trainers[(t.i+k)%w.o.Voters]; tr.roguesLeft > 0 {
			tr.rogueVoter[v.i] = true
			tr.roguesLeft--
		}
	}
}

// answers reports whether voter v answers t: the honest voters stop
// answering a voter they caught forging.
func (w *world) answers(t, v *trainerPeer) bool {
	tr := w.trust
	return tr == nil || !tr.distrusted[t.i] || tr.rogueVoter[v.i]
}

// benched reports whether t is a volunteer a spot check caught.
func (w *world) benched(t *trainerPeer) bool { return w.trust != nil && w.trust.benchedIn[t.i] > 0 }

// forgeDelta is a rogue volunteer's delta in place of the honest one d.
func (w *world) forgeDelta(t *trainerPeer, d []float32) ([]float32, bool) {
	if w.trust == nil || w.trust.forge[t.i] == 0 {
		return d, false
	}
	f := float32(-1)
	if w.trust.forge[t.i] == forgeHuge {
		f = -hugeFactor
	}
	out := make([]float32, len(d))
	for i, x := range d {
		out[i] = f * x
	}
	return out, true
}

// spotCheck has a voter re-execute a sample of the volunteers' deltas of
// round (SpotCheck of them, at least one): re-execution on the native
// engine is exact, so a forged delta is caught, dropped, and its
// volunteer benched. It returns the parts kept and the time the
// re-executions took.
func (w *world) spotCheck(round uint64, parts []part, contrib []group.Contribution) ([]part, []group.Contribution, time.Duration) {
	tr := w.trust
	if tr == nil || w.o.SpotCheck < 0 {
		return parts, contrib, 0
	}
	var vol []int
	for k, p := range parts {
		if !w.isVoter(w.trainers[p.trainer]) {
			vol = append(vol, k)
		}
	}
	if len(vol) == 0 {
		return parts, contrib, 0
	}
	s := max(1, int(math.Ceil(w.o.SpotCheck*float64(len(vol)))))
	drop := map[int]bool{}
	var cost time.Duration
	for _, j := range tr.rSpot.Perm(len(vol))[:s] {
		p := parts[vol[j]]
		tr.checks++
		cost += time.Duration(float64(p.samples) / samplesPerSecond * float64(time.Second))
		if p.forged {
			tr.caught++
			drop[vol[j]] = true
			tr.benchedIn[p.trainer] = round
			tr.benchedAt[p.trainer] = tr.contributed[p.trainer]
		}
	}
	var kp []part
	var kc []group.Contribution
	for k := range parts {
		if !drop[k] {
			kp, kc = append(kp, parts[k]), append(kc, contrib[k])
		}
	}
	return kp, kc, cost
}

// benchBound is the number of rounds within which a rogue volunteer
// among v volunteers is benched with probability benchConfidence at
// spot-check share rate: each round it hands a delta in, its delta is
// among the max(1, ⌈rate·k⌉) of the k volunteers' deltas checked with
// probability q = max(1, ⌈rate·k⌉)/k ≥ q(v) (fewer volunteers, a larger
// q), so it escapes n rounds with probability at most (1 − q)^n.
func benchBound(v int, r float64) int {
	if v <= 0 || r < 0 {
		return -1
	}
	q := float64(max(1, int(math.Ceil(r*float64(v))))) / float64(v)
	if q >= 1 {
		return 1
	}
	return int(math.Ceil(math.Log(1-benchConfidence) / math.Log(1-q)))
}

// forgeVersion is a rogue leader's version in place of the aggregate d
// over base: the other way, hugeFactor times as far.
func (w *world) forgeVersion(l *trainerPeer, d []float32) bool {
	if w.trust == nil || !w.trust.rogueVoter[l.i] {
		return false
	}
	for i := range d {
		d[i] *= -hugeFactor
	}
	w.trust.forgedVersions++
	return true
}

// votes reports whether voter t votes for m: an honest voter recomputes
// the aggregate from the round's deltas and votes only for a version that
// is what they make; a rogue one votes only for forged versions.
func (w *world) votes(t *trainerPeer, m *chunks.Manifest) bool {
	if w.trust == nil {
		return true
	}
	return w.trust.forged[m.AdapterHash] == w.trust.rogueVoter[t.i]
}

// uncertified: no quorum of the voters certified version v, which the
// leader l committed: it never goes to the devices. A rogue leader offers
// it to its neighbours anyway, signed and with its own vote (they refuse
// it), and the honest voters, having found it forged, stop answering it:
// it loses its quorum and steps down, and the next leader retracts the
// version before it plans a round (as the real trainer's awaitCertified).
func (w *world) uncertified(l *trainerPeer, m *chunks.Manifest) {
	tr := w.trust
	if !tr.forged[m.AdapterHash] {
		return
	}
	if err := m.Sign(w.peers[l.n.id].key, w.peers[l.n.id].cert, wall(w.now)); err == nil {
		data := m.Marshal()
		for _, j := range l.n.nbrs {
			nj := w.nodes[j]
			if nj.trainer || !w.sendTo(l.n, nj) {
				continue
			}
			w.after(w.latency(l.n, nj), func() {
				if !w.sendTo(l.n, nj) {
					return
				}
				before := w.peers[j].last
				w.handleOffer(j, data)
				if w.peers[j].last != before {
					tr.uncertifiedAccept++
				} else {
					tr.forgedOffers++
				}
			})
		}
	}
	tr.distrusted[l.i] = true
	w.checkLeader("a rogue leader's version refused")
}

// retractUncertified has the leader l retract the newest version when no
// quorum certified it; it reports whether it proposed the retraction.
func (w *world) retractUncertified(l *trainerPeer) bool {
	cur, ok := l.st.Current()
	if w.trust == nil || !ok || cur.Version <= w.newest {
		return false
	}
	w.propose(&group.Entry{Retract: &group.Retract{Version: cur.Version, Hash: cur.Hash, Reason: "no quorum of the voters certified it"}}, func(err error, _, _ uint64) {
		if err != nil {
			return
		}
		w.trust.retractions++
		w.learn.vectors = w.learn.vectors[:cur.Version]
		w.learn.hashes = w.learn.hashes[:cur.Version]
	})
	return true
}

// accepted checks a device's acceptance of m against the trust
// invariants: no device accepts a forged version.
func (w *world) accepted(b int, m *chunks.Manifest) {
	if w.trust != nil && w.trust.forged[m.AdapterHash] {
		w.trust.forgedAccepted++
		w.fail("%s accepted the forged v%d", w.nodes[b].pid, m.Version)
	}
}

// ingested records the honest devices' batches the leader's ledger took.
func (w *world) ingestedBatches(refs []group.BatchRef) {
	tr := w.trust
	if tr == nil {
		return
	}
	for _, r := range refs {
		b := w.batches[r.ID]
		if b == nil || b.flood || slices.Contains(tr.flooders, b.from) || tr.ingested[r.ID] {
			continue
		}
		tr.ingested[r.ID] = true
		tr.ingest = append(tr.ingest, seconds(w.now-b.at))
	}
}

// flood has each flooding device announce floodRate batches a second to
// the trainers it reaches. Each trainer takes them through its token
// bucket; one over the rate is dropped with a strike, and MaxStrikes
// strikes (one forgotten every StrikeDecay) disconnect the device, which
// dials back floodRedial later. A taken announcement waits to be pulled,
// at most PullsPerPeer+PullQueue of the device's at once (more are
// dropped, without a strike), and enters the ledger as the leader adds it.
func (w *world) flood() {
	tr := w.trust
	if w.published >= w.o.Versions || w.done {
		return
	}
	per := int(floodRate * floodTick / time.Second)
	for k, f := range tr.flooders {
		nf := w.nodes[f]
		if !w.live(nf) {
			continue
		}
		ids := make([]core.BatchID, per)
		for a := range ids {
			ids[a] = w.batchID(f)
		}
		for ti, t := range w.trainers {
			fl := tr.links[k][ti]
			if w.now < fl.down || !w.live(t.n) || !w.sendTo(nf, t.n) {
				continue
			}
			fl.queued = slices.DeleteFunc(fl.queued, func(id core.BatchID) bool { _, ok := t.st.Batches[id]; return ok })
			for _, id := range ids {
				tr.announced++
				if !fl.lim.AllowN(wall(w.now), 1) {
					tr.dropped++
					tr.strikes++
					fl.strikes = max(0, fl.strikes-float64(w.now-fl.struck)/float64(mesh.StrikeDecay)) + 1
					fl.struck = w.now
					if fl.strikes >= mesh.MaxStrikes {
						fl.strikes = 0
						fl.down = w.now + floodRedial
						tr.disconnects++
						break
					}
					continue
				}
				if len(fl.queued) >= mesh.PullsPerPeer+mesh.PullQueue {
					tr.queueDropped++
					continue
				}
				tr.taken++
				if w.batches[id] == nil {
					w.batches[id] = &batchInfo{from: f, kind: honest, steps: honestSteps, bytes: honestSteps * bytesPerStep, at: w.now, flood: true}
					w.made[honest]++
				}
				fl.queued = append(fl.queued, id)
				t.buf = append(t.buf, group.BatchRef{ID: id, From: nf.pid, Steps: honestSteps, Adapters: []string{fmt.Sprintf("v%d", w.peers[f].held)}})
			}
		}
	}
	w.after(floodTick, w.flood)
}

// batchID names a flooding device's next batch.
func (w *world) batchID(f int) core.BatchID {
	w.trust.floodSeq++
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, [3]uint64{w.o.Seed, uint64(f), uint64(w.trust.floodSeq)})
	h.Write([]byte("flood"))
	return core.BatchID(hex.EncodeToString(h.Sum(nil)))
}

// TrustReport is the Trust scenario's findings: the run with its
// adversaries against the same run clean, and the sweep of rogue
// volunteers.
type TrustReport struct {
	Voters     int     `json:"voters"`
	Volunteers int     `json:"volunteers"`
	SpotCheck  float64 `json:"spot_check"`
	// Rogue volunteers: SpotChecks deltas re-executed, Caught forged ones
	// among them; BenchedAfter, by rogue volunteer, the rounds it handed a
	// delta in until a spot check caught it (-1: never caught);
	// BenchBound the rounds within which one is caught with probability
	// 0.999 (benchBound); HonestBenched honest volunteers benched (must
	// be 0).
	RogueVolunteers int   `json:"rogue_volunteers"`
	SpotChecks      int   `json:"spot_checks"`
	Caught          int   `json:"caught"`
	BenchedAfter    []int `json:"benched_after_rounds"`
	BenchBound      int   `json:"bench_bound_rounds"`
	HonestBenched   int   `json:"honest_benched"`
	// Rogue voters: Forged versions a rogue leader committed, Retracted
	// versions taken back, ForgedOffersRefused offers of forged versions
	// devices refused, ForgedAccepted (must be 0) those they accepted;
	// DelayS how much later the last version came out than in the clean
	// run.
	RogueVoters         int     `json:"rogue_voters"`
	Forged              int     `json:"forged_versions"`
	Retracted           int     `json:"retracted"`
	ForgedOffersRefused int     `json:"forged_offers_refused"`
	ForgedAccepted      int     `json:"forged_accepted"`
	DelayS              float64 `json:"delay_s"`
	// The flood: announcements the flooders sent to trainers, Taken
	// through the token bucket, Dropped over it, QueueDropped past the
	// pull queue, Strikes and Disconnects. The honest devices' batches'
	// ingest (shipping to the leader's ledger, median and 99th
	// percentile) and the versions' median 99% reach, against the clean
	// run's; FloodWithin: both ratios within FloodBound.
	Flooders            int     `json:"flooders"`
	Announced           int     `json:"announced"`
	Taken               int     `json:"taken"`
	Dropped             int     `json:"dropped"`
	QueueDropped        int     `json:"queue_dropped"`
	Strikes             int     `json:"strikes"`
	Disconnects         int     `json:"disconnects"`
	IngestMedianS       float64 `json:"ingest_median_s"`
	Ingest99S           float64 `json:"ingest99_s"`
	CleanIngestMedianS  float64 `json:"clean_ingest_median_s"`
	CleanIngest99S      float64 `json:"clean_ingest99_s"`
	IngestRatio         float64 `json:"ingest_ratio"`
	MedianReach99S      float64 `json:"median_reach99_s"`
	CleanMedianReach99S float64 `json:"clean_median_reach99_s"`
	ReachRatio          float64 `json:"reach_ratio"`
	FloodBound          float64 `json:"flood_bound"`
	FloodWithin         bool    `json:"flood_within"`
	// The learning curves, with the adversaries and clean.
	Scores      []float64 `json:"scores"`
	CleanScores []float64 `json:"clean_scores"`
	// Sweep: the share of rogue volunteers among the trainers, with every
	// defence on, over seeds; Absorbed the largest share up to which every
	// share's curve stayed within 10% of the clean one's (final score and
	// area under the curve, on every seed).
	Sweep    []TrustSweepRow `json:"sweep"`
	Absorbed float64         `json:"absorbed_share"`
}

// TrustSweepRow is one share of rogue volunteers in the sweep: the mean
// final score and area under the curve (the mean score over the versions)
// over the seeds, the clean runs' means, the worst ratio of a seed's
// (the smaller of its final's and area's to its clean run's), and the
// rogue volunteers caught of all the seeds'.
type TrustSweepRow struct {
	Rogue      int     `json:"rogue"`
	Share      float64 `json:"share"`
	Final      float64 `json:"final"`
	AUC        float64 `json:"auc"`
	CleanFinal float64 `json:"clean_final"`
	CleanAUC   float64 `json:"clean_auc"`
	WorstRatio float64 `json:"worst_ratio"`
	Within     bool    `json:"within"`
	Caught     int     `json:"caught"`
	Rogues     int     `json:"rogues"`
}

// trustReport fills in the adversaries' figures of w, the run with them,
// against clean, the same run without them.
func (w *world) trustReport(r, clean *Report, cw *world) *TrustReport {
	tr := w.trust
	o := w.o
	t := &TrustReport{Voters: o.Voters, Volunteers: o.Trainers - o.Voters, SpotCheck: max(0, o.SpotCheck),
		RogueVolunteers: max(0, o.RogueVolunteers), SpotChecks: tr.checks, Caught: tr.caught, BenchBound: benchBound(o.Trainers-o.Voters, o.SpotCheck),
		RogueVoters: max(0, o.RogueVoters), Forged: tr.forgedVersions, Retracted: tr.retractions, ForgedOffersRefused: tr.forgedOffers,
		ForgedAccepted: tr.forgedAccepted + tr.uncertifiedAccept,
		Flooders:       len(tr.flooders), Announced: tr.announced, Taken: tr.taken, Dropped: tr.dropped, QueueDropped: tr.queueDropped,
		Strikes: tr.strikes, Disconnects: tr.disconnects, FloodBound: floodBound,
		Scores: r.Learning, CleanScores: clean.Learning, BenchedAfter: []int{}}
	for i, f := range tr.forge {
		switch {
		case f != 0 && tr.benchedIn[i] > 0:
			t.BenchedAfter = append(t.BenchedAfter, tr.benchedAt[i])
		case f != 0:
			t.BenchedAfter = append(t.BenchedAfter, -1)
		case tr.benchedIn[i] > 0:
			t.HonestBenched++
		}
	}
	ingest := func(x []float64) (float64, float64) {
		x = slices.Clone(x)
		slices.Sort(x)
		return round3(at(x, len(x), 0.5)), round3(at(x, len(x), 0.99))
	}
	t.IngestMedianS, t.Ingest99S = ingest(tr.ingest)
	t.CleanIngestMedianS, t.CleanIngest99S = ingest(cw.trust.ingest)
	reach := func(r *Report) float64 {
		var x []float64
		for _, v := range r.Versions {
			if v.Reach99 >= 0 {
				x = append(x, v.Reach99)
			}
		}
		return round3(median(x))
	}
	t.MedianReach99S, t.CleanMedianReach99S = reach(r), reach(clean)
	ratioOf := func(a, b float64) float64 {
		if a < 0 || b <= 0 {
			return -1
		}
		return round3(a / b)
	}
	t.IngestRatio = ratioOf(t.Ingest99S, t.CleanIngest99S)
	t.ReachRatio = ratioOf(t.MedianReach99S, t.CleanMedianReach99S)
	t.FloodWithin = t.IngestRatio >= 0 && t.IngestRatio <= floodBound && t.ReachRatio >= 0 && t.ReachRatio <= floodBound
	if n, c := len(r.Versions), len(clean.Versions); n > 0 && c > 0 {
		t.DelayS = round3(r.Versions[n-1].Published - clean.Versions[c-1].Published)
	}
	return t
}

// runTrust runs the Trust scenario's clean run and its sweep, and adds
// their figures to r, the report of w.
func runTrust(orig Options, w *world, r *Report) error {
	clean := orig
	clean.RogueVolunteers, clean.RogueVoters, clean.Flooders = -1, -1, -1
	cw, err := newWorld(clean, DefAll)
	if err != nil {
		return err
	}
	cw.run()
	r.Trust = w.trustReport(r, cw.report(), cw)
	sweep, absorbed, err := trustSweep(orig)
	if err != nil {
		return err
	}
	r.Trust.Sweep, r.Trust.Absorbed = sweep, absorbed
	return nil
}

// trustSweep runs the sweep of rogue volunteers: sweepTrainers trainers
// (sweepVoters of them voters), 0 to half of them rogue volunteers, no
// rogue voter and no flood, every defence on, on sweepSeeds seeds from the
// run's, at most sweepNodes devices.
func trustSweep(orig Options) ([]TrustSweepRow, float64, error) {
	type curve struct{ final, auc float64 }
	run := func(rogue int, seed uint64) (curve, int, error) {
		o := orig
		o.Seed, o.Nodes, o.Trainers, o.Voters = seed, min(orig.WithDefaults().Nodes, sweepNodes), sweepTrainers, sweepVoters
		o.RogueVoters, o.Flooders, o.RogueVolunteers, o.Relays = -1, -1, -1, 0
		if rogue > 0 {
			o.RogueVolunteers = rogue
		}
		w, err := newWorld(o, DefAll)
		if err != nil {
			return curve{}, 0, err
		}
		w.run()
		var c curve
		for _, s := range w.scores {
			c.auc += s / float64(w.o.Versions)
		}
		if n := len(w.scores); n > 0 {
			c.final = w.scores[n-1]
		}
		return c, w.trust.caught, nil
	}
	cleans := make([]curve, sweepSeeds)
	var rows []TrustSweepRow
	absorbed, broken := 0.0, false
	for rogue := 0; 2*rogue <= sweepTrainers; rogue++ {
		row := TrustSweepRow{Rogue: rogue, Share: round3(float64(rogue) / sweepTrainers), WorstRatio: 1}
		for k := range sweepSeeds {
			c, caught, err := run(rogue, orig.Seed+uint64(k))
			if err != nil {
				return nil, 0, err
			}
			if rogue == 0 {
				cleans[k] = c
			}
			cl := cleans[k]
			row.Final += c.final / sweepSeeds
			row.AUC += c.auc / sweepSeeds
			row.CleanFinal += cl.final / sweepSeeds
			row.CleanAUC += cl.auc / sweepSeeds
			if cl.final > 0 && cl.auc > 0 {
				row.WorstRatio = min(row.WorstRatio, c.final/cl.final, c.auc/cl.auc)
			}
			row.Caught += caught
			row.Rogues += rogue
		}
		row.Final, row.AUC, row.CleanFinal, row.CleanAUC, row.WorstRatio = round3(row.Final), round3(row.AUC), round3(row.CleanFinal), round3(row.CleanAUC), round3(row.WorstRatio)
		row.Within = row.WorstRatio >= absorbedWithin
		if !row.Within {
			broken = true
		}
		if !broken {
			absorbed = row.Share
		}
		rows = append(rows, row)
	}
	return rows, absorbed, nil
}

// writeTrust prints the Trust scenario's figures.
func writeTrust(f func(string, ...any), b io.Writer, t *TrustReport) {
	f("\ntrust: %d voters, %d volunteers, spot checks of %.0f%% of the volunteers' deltas a round (at least one)\n", t.Voters, t.Volunteers, 100*t.SpotCheck)
	f("rogue volunteers: %d; %d deltas re-executed, %d forged caught and dropped; rounds each handed a delta in until benched: %v (bound %d rounds at 99.9%%); honest volunteers benched: %d\n",
		t.RogueVolunteers, t.SpotChecks, t.Caught, t.BenchedAfter, t.BenchBound, t.HonestBenched)
	f("rogue voters: %d; %d forged versions, %d retracted, %d offers of them refused by devices, %d accepted; the last version %.1f s later than clean\n",
		t.RogueVoters, t.Forged, t.Retracted, t.ForgedOffersRefused, t.ForgedAccepted, t.DelayS)
	f("flood: %d flooders; %d announcements to trainers, %d taken, %d dropped over the bucket, %d past the pull queue; %d strikes, %d disconnections\n",
		t.Flooders, t.Announced, t.Taken, t.Dropped, t.QueueDropped, t.Strikes, t.Disconnects)
	f("honest ingest: median %s, 99%% %s (clean %s, %s): %s; versions' median 99%% reach %s (clean %s): %s; within %.1fx: %v\n",
		secs(t.IngestMedianS), secs(t.Ingest99S), secs(t.CleanIngestMedianS), secs(t.CleanIngest99S), ratio(t.IngestRatio),
		secs(t.MedianReach99S), secs(t.CleanMedianReach99S), ratio(t.ReachRatio), t.FloodBound, t.FloodWithin)
	curve := func(x []float64) string {
		var c []string
		for _, s := range x {
			c = append(c, fmt.Sprintf("%.2f", s))
		}
		return strings.Join(c, " ")
	}
	f("learning: %s (clean %s)\n", curve(t.Scores), curve(t.CleanScores))
	f("\nrogue volunteers among %d trainers (%d voters), every defence on, %d seeds\n", sweepTrainers, sweepVoters, sweepSeeds)
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rogue share\tfinal\tarea\tclean final\tclean area\tworst ratio\twithin 10%\tcaught\t")
	for _, s := range t.Sweep {
		fmt.Fprintf(tw, "%.0f%%\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%v\t%d of %d\t\n", 100*s.Share, s.Final, s.AUC, s.CleanFinal, s.CleanAUC, s.WorstRatio, s.Within, s.Caught, s.Rogues)
	}
	tw.Flush()
	f("absorbed: up to %.0f%% of the trainers rogue volunteers, the learning curve within 10%% of the clean one's\n", 100*t.Absorbed)
}
