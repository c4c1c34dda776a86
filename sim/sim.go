package sim

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Devices' batches (see the package documentation).
const (
	honestSteps     = 16
	honestEvery     = 2 * time.Minute // mean time between a device's batches
	floodFactor     = 16              // a flooding malicious device ships this many times as often
	bytesPerStep    = 4 << 10
	oversizedFactor = 1024 // an oversized batch is this many times an honest one
)

// batchInfo is what the simulator knows of a batch beyond the ledger:
// who made it and what it really holds.
type batchInfo struct {
	from  int
	kind  int
	steps int
	bytes int
	at    time.Duration // when it was shipped
	flood bool          // one of a flooding device's
}

// world is one run.
type world struct {
	clock
	o   Options
	def Defences

	rLinks, rNAT, rGraph, rGossip, rGossipsub, rFetch, rKeys, rRaft, rBatch, rLearn, rChurn, rFault *rand.Rand
	// eagerOnly turns gossipsub's IHAVE/IWANT gossip off (tests).
	eagerOnly bool

	nodes  []*node
	relays []int
	peers  []*peer

	adminKey ed25519.PrivateKey
	adminPub ed25519.PublicKey
	meshID   string
	// voterSet is the admin's signed set of the group's voters, whose
	// votes certify each version.
	voterSet *member.VoterSet

	msgs []*message

	// Weights.
	bundle    []byte
	newest    uint64
	published int
	pubAt     []time.Duration   // by version
	pubBy     []int             // by version: the node that published it
	liveAtPub [][]bool          // by version: the devices live when it was published
	lineage   []group.Version   // committed versions, as the leader's state has them
	reached   [][]time.Duration // by version, by node: when it held that version or a newer one
	cut       *cut              // the partition, if the run had one

	// Trainers and raft.
	trainers        []*trainerPeer
	term            uint64
	leader          int
	log             []logEntry
	lastCommit      time.Duration
	inflight        int
	electionPending bool
	// lostAt is when the voters last heard a leader.
	lostAt    time.Duration
	failing   *Failover
	failovers []Failover
	round     *roundRun
	lastStart time.Duration
	onStart   func(round uint64)
	learn     *learner
	trust     *trust // the trust scenario's adversaries (nil: none)

	// Batches.
	batches      map[core.BatchID]*batchInfo
	trainedTimes map[core.BatchID]int
	malice       []int // by device: its batches' kind
	made         [5]int
	intake       [5]int

	// Revocation.
	victim         int
	revokedAt      time.Duration
	victimReceipts []receipt

	// Counters.
	admissionRefused, offersRefused, offersFenced, verifies, abandoned, busyAnswers int
	lostProposals, refusedEntries, wastedSamples, unannounced                       int
	chunkBytes, wastedBytes, gossipBytes                                            int64
	violations                                                                      []string
	done                                                                            bool
	scores                                                                          []float64
}

func newWorld(o Options, def Defences) (*world, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.WithDefaults()
	s := o.Seed
	w := &world{o: o, def: def, leader: -1, victim: -1,
		rLinks: stream(s, "links"), rNAT: stream(s, "nat"), rGraph: stream(s, "graph"), rGossip: stream(s, "gossip"),
		rGossipsub: stream(s, "gossipsub"),
		rFetch:     stream(s, "fetch"), rKeys: stream(s, "keys"), rRaft: stream(s, "raft"), rBatch: stream(s, "batches"),
		rLearn: stream(s, "learn"), rChurn: stream(s, "churn"), rFault: stream(s, "faults"),
		batches: map[core.BatchID]*batchInfo{}, trainedTimes: map[core.BatchID]int{}}
	w.makeNetwork()
	if err := w.setupMembership(); err != nil {
		return nil, err
	}
	w.learn = newLearner(stream(s, "target"), fitted)
	for i := range o.Trainers {
		n := w.nodes[o.Nodes+i]
		w.trainers = append(w.trainers, &trainerPeer{n: n, i: i, st: group.New(), malicious: o.Scenario == Poison && i >= o.Trainers-o.MaliciousTrainers})
	}
	if err := w.setupVoters(); err != nil {
		return nil, err
	}
	if o.Scenario == Trust {
		w.setupTrust()
	}
	for _, t := range w.trainers {
		w.followAgain(t)
	}
	w.buildMeshes()
	// Malicious devices: the Poison scenario's, their kinds in turn.
	w.malice = make([]int, o.Nodes)
	if o.Scenario == Poison && o.Malicious > 0 {
		rm := stream(s, "malice")
		k := int(o.Malicious*float64(o.Nodes) + 0.5)
		for j, i := range rm.Perm(o.Nodes)[:k] {
			w.malice[i] = 1 + j%4
		}
	}
	w.bundle = make([]byte, o.BundleMiB<<20)
	randReader{stream(s, "bundle")}.Read(w.bundle[:min(len(w.bundle), 4096)])
	w.reached = [][]time.Duration{nil}
	w.pubAt = []time.Duration{0}
	w.pubBy = []int{-1}
	w.liveAtPub = [][]bool{nil}
	return w, nil
}

// run plays the scenario until the trainers have published their versions
// and every live device holds the newest, or until the duration.
func (w *world) run() {
	o := w.o
	w.at(0, func() { w.checkLeader("start") })
	w.lastStart = -o.RoundEvery / 2
	w.at(0, w.tick)
	for i := range o.Nodes {
		w.scheduleBatch(i)
	}
	// Every scenario revokes one device part way.
	w.victim = w.rFault.IntN(o.Nodes)
	for w.nodes[w.victim].isRelay {
		w.victim = (w.victim + 1) % o.Nodes
	}
	// (It is revoked half a round after the middle version is out.)
	switch o.Scenario {
	case Churn:
		w.scheduleChurn()
	case Partition:
		w.schedulePartition()
	case Trust:
		if len(w.trust.flooders) > 0 {
			w.at(0, w.flood)
		}
	}
	w.at(time.Second, w.watch)
	for !w.done && w.step(o.Duration) {
	}
	w.finish()
}

// watch ends the run once it has nothing left to show.
func (w *world) watch() {
	if w.published >= w.o.Versions && w.revokedAt > 0 && w.converged() && w.leader >= 0 {
		w.done = true
		return
	}
	w.after(time.Second, w.watch)
}

// converged reports whether every live device but the revoked one holds the
// newest version.
func (w *world) converged() bool {
	for i := range w.o.Nodes {
		if w.live(w.nodes[i]) && !w.isVictim(i) && w.peers[i].held < w.newest {
			return false
		}
	}
	return true
}

// scheduleBatch schedules device i's next batch.
func (w *world) scheduleBatch(i int) {
	mean := honestEvery
	if k := w.malice[i]; k == flipped || k == forged {
		mean /= floodFactor
	}
	w.after(expDur(w.rBatch, mean), func() {
		if w.published >= w.o.Versions || w.nodes[i].left {
			return
		}
		if w.live(w.nodes[i]) {
			w.makeBatch(i)
		}
		w.scheduleBatch(i)
	})
}

// makeBatch has device i ship a batch and announce it to the trainers.
func (w *world) makeBatch(i int) {
	kind := w.malice[i]
	steps := honestSteps
	size := steps * bytesPerStep
	if kind == oversized {
		size *= oversizedFactor
	}
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, [3]uint64{w.o.Seed, uint64(i), uint64(len(w.batches))})
	id := core.BatchID(hex.EncodeToString(h.Sum(nil)))
	w.batches[id] = &batchInfo{from: i, kind: kind, steps: steps, bytes: size, at: w.now}
	w.made[kind]++
	if kind == oversized || kind == malformed {
		// The trainers' intake refuses it: too large, or it does not decode.
		w.intake[kind]++
		return
	}
	ref := group.BatchRef{ID: id, From: w.nodes[i].pid, Steps: steps, Adapters: []string{fmt.Sprintf("v%d", w.peers[i].held)}}
	nd := w.nodes[i]
	heard := false
	for _, t := range w.trainers {
		if !w.sendTo(nd, t.n) {
			continue
		}
		heard = true
		w.after(2*w.latency(nd, t.n), func() {
			if w.live(t.n) {
				t.buf = append(t.buf, ref)
			}
		})
	}
	if !heard {
		w.unannounced++
	}
}

// publishVersion: the leader signs the new version's manifest (real
// mesh/weights code), holds the version and offers it on gossip.
func (w *world) publishVersion(l *trainerPeer, v uint64) {
	ver, ok := l.st.Version(v)
	if !ok {
		w.fail("v%d committed but not in the leader's lineage", v)
		return
	}
	binary.LittleEndian.PutUint64(w.bundle, v)
	m, err := chunks.NewManifest(w.bundle)
	if err != nil {
		w.fail("manifest: %v", err)
		return
	}
	m.MeshID, m.Version, m.Parent, m.Base = w.meshID, v, ver.Parent, "tiny"
	m.AdapterHash, m.Term, m.Index = ver.Hash, ver.Term, ver.Index
	if parent, ok := l.st.Version(ver.Parent); ok {
		m.ParentHash = parent.Hash
	}
	if !w.certify(l, m) {
		if w.trust != nil {
			w.uncertified(l, m)
			return
		}
		w.fail("v%d committed without the votes of a quorum of the voters", v)
		return
	}
	if err := m.Sign(w.peers[l.n.id].key, w.peers[l.n.id].cert, wall(w.now)); err != nil {
		w.fail("sign: %v", err)
		return
	}
	w.lineage = append(w.lineage, ver)
	w.published++
	w.newest = v
	w.scores = append(w.scores, w.learn.score(w.learn.vectors[v]))
	row := make([]time.Duration, len(w.nodes))
	for i := range row {
		row[i] = -1
	}
	w.reached = append(w.reached, row)
	w.pubAt = append(w.pubAt, w.now)
	w.pubBy = append(w.pubBy, l.n.id)
	live := make([]bool, w.o.Nodes)
	for i := range w.o.Nodes {
		if w.live(w.nodes[i]) && !w.isVictim(i) {
			live[i] = true
			p := w.peers[i]
			if p.staleSince < 0 {
				p.staleSince = w.now
			}
			if w.published == 1 {
				p.liveSince = w.now
			}
		}
	}
	w.liveAtPub = append(w.liveAtPub, live)
	if w.published == (w.o.Versions+1)/2 {
		w.after(w.o.RoundEvery/2, w.revoke)
	}
	p := w.peers[l.n.id]
	p.last = m
	w.install(l.n.id, v)
	w.publish(l.n.id, &message{kind: "offer", version: v, data: m.Marshal()})
	w.announceHave(l.n.id)
}

// Churn: devices sleep and wake (some leave for good); the leader is
// killed and later restarted; another trainer is paused for a while.
const (
	awakeMean  = 20 * time.Minute
	asleepMean = 5 * time.Minute
	leaveShare = 0.1
	pauseFor   = 30 * time.Second
)

func (w *world) scheduleChurn() {
	for i := range w.o.Nodes {
		if w.nodes[i].isRelay || w.isVictim(i) {
			continue
		}
		w.scheduleSleep(i)
	}
	// The leader dies mid-round: 5 s into the second round, while its
	// trainers train.
	w.onStart = func(round uint64) {
		if round != 2 {
			return
		}
		w.after(5*time.Second, func() {
			if w.leader < 0 {
				return
			}
			t := w.trainers[w.leader]
			t.killed = true
			w.checkLeader("leader killed mid-round")
			w.after(2*w.o.RoundEvery, func() {
				t.killed = false
				w.followAgain(t)
				w.checkLeader("restart")
			})
		})
	}
	w.at(w.o.RoundEvery*3, func() {
		for _, t := range w.trainers {
			if t.i != w.leader && !t.killed {
				t.paused = true
				w.checkLeader("trainer paused")
				w.after(pauseFor, func() {
					t.paused = false
					// Its timers fire as it resumes.
					t.hbNext = max(t.hbNext, w.now)
					w.checkLeader("resume")
				})
				return
			}
		}
	})
}

func (w *world) scheduleSleep(i int) {
	w.after(expDur(w.rChurn, awakeMean), func() {
		if w.published >= w.o.Versions {
			return // the mesh settles once the last version is out
		}
		n := w.nodes[i]
		w.setAwake(i, false)
		if w.rChurn.Float64() < leaveShare {
			n.left = true
			return
		}
		w.after(expDur(w.rChurn, asleepMean), func() {
			w.setAwake(i, true)
			w.scheduleSleep(i)
		})
	})
}

// setAwake puts device i to sleep or wakes it: awake, it reconnects and
// syncs with its neighbours, and resumes its fetch.
func (w *world) setAwake(i int, awake bool) {
	n, p := w.nodes[i], w.peers[i]
	n.asleep = !awake
	if !awake {
		p.sleeps = append(p.sleeps, w.now)
		if p.staleSince >= 0 {
			p.stale += w.now - p.staleSince
			p.staleSince = -1
		}
		if p.liveSince >= 0 {
			p.liveTime += w.now - p.liveSince
			p.liveSince = -1
		}
		return
	}
	if w.published > 0 {
		p.liveSince = w.now
	}
	if p.held < w.newest && p.staleSince < 0 {
		p.staleSince = w.now
	}
	w.sync(i)
	w.resumeFetch(i)
}

// Partition: the network is cut in two, the leader on the smaller side
// with a share of the devices, then healed.
const partitionShare = 0.3

func (w *world) schedulePartition() {
	w.at(w.o.RoundEvery*3/2, func() {
		for i := range w.o.Nodes {
			if w.rFault.Float64() < partitionShare {
				w.nodes[i].comp = 1
			}
		}
		if w.leader >= 0 {
			w.trainers[w.leader].n.comp = 1
		} else {
			w.trainers[0].n.comp = 1
		}
		w.recordCut()
		w.checkLeader("partition")
		w.after(2*w.o.RoundEvery, func() {
			w.cut.healed = w.now
			for _, n := range w.nodes {
				n.comp = 0
			}
			w.checkLeader("heal")
			for _, t := range w.trainers {
				if w.leader >= 0 && w.reach(w.trainers[w.leader].n, t.n) {
					w.catchUp(t)
				}
			}
			for i := range w.nodes {
				if w.live(w.nodes[i]) {
					w.sync(i)
				}
			}
		})
	})
}

// cut is what the partition-aware bound needs of the run's partition: when
// it began and healed, each node's side, and what each node had of the
// versions when it began.
type cut struct {
	began, healed time.Duration // healed < 0: not healed
	side          []int         // by node
	// had: by node, the newest version of which it held, or had asked for,
	// any byte when the cut began.
	had []uint64
}

// recordCut notes the partition just made.
func (w *world) recordCut() {
	c := &cut{began: w.now, healed: -1, side: make([]int, len(w.nodes)), had: make([]uint64, len(w.nodes))}
	for i, n := range w.nodes {
		c.side[i] = n.comp
		c.had[i] = max(w.peers[i].held, w.peers[i].asked)
	}
	w.cut = c
}

// versionsOK checks the lineage the trainers committed against the ledger
// invariants; finish runs it with the others.
func (w *world) finish() {
	// Every trainer catches up and must hold the same lineage.
	for _, t := range w.trainers {
		w.catchUp(t)
	}
	ref := w.trainers[0].st
	for _, t := range w.trainers[1:] {
		if !slices.EqualFunc(ref.Versions, t.st.Versions, func(a, b group.Version) bool {
			return a.Version == b.Version && a.Hash == b.Hash && a.Term == b.Term && a.Index == b.Index
		}) {
			w.fail("trainer %s's lineage differs from trainer %s's", t.n.pid, w.trainers[0].n.pid)
		}
	}
	batches := make([]group.Batch, 0, len(ref.Batches))
	for _, b := range ref.Batches {
		batches = append(batches, *b)
	}
	for _, v := range CheckLineage(ref.Versions, batches) {
		w.fail("%s", v)
	}
	// What the devices accepted is what the trainers committed.
	for i, p := range w.peers {
		if p.last == nil {
			continue
		}
		c := group.Claim{Version: p.last.Version, Hash: p.last.AdapterHash, Term: p.last.Term, Index: p.last.Index}
		if err := ref.Check(c); err != nil {
			w.fail("%s holds a manifest the lineage refuses: %v", w.nodes[i].pid, err)
		}
	}
	// Every live device converges on the newest version.
	if w.published < w.o.Versions {
		w.fail("only %d of %d versions published in %v", w.published, w.o.Versions, w.o.Duration)
	}
	for i := range w.o.Nodes {
		if w.live(w.nodes[i]) && !w.isVictim(i) && w.peers[i].held < w.newest {
			w.fail("live device %s holds v%d, the newest is v%d", w.nodes[i].pid, w.peers[i].held, w.newest)
			break
		}
	}
	// A revoked peer receives nothing from a node after that node learnt of
	// the revocation.
	for _, r := range w.victimReceipts {
		if l := w.peers[r.from].learnt; l >= 0 && l <= r.at {
			w.fail("%s sent to the revoked %s at %.3fs, having learnt of the revocation at %.3fs", w.nodes[r.from].pid, w.nodes[w.victim].pid, seconds(r.at), seconds(l))
		}
	}
	// Close the staleness intervals.
	for i, p := range w.peers {
		if p.staleSince >= 0 && i < w.o.Nodes {
			p.stale += w.now - p.staleSince
			p.staleSince = -1
		}
		if p.liveSince >= 0 {
			p.liveTime += w.now - p.liveSince
			p.liveSince = -1
		}
	}
}

// CheckLineage checks a trainers' lineage and batch ledger (as a trainer's
// group.State holds them, or trainer.Trainer's Lineage and Ledger report
// them) against the invariants: no batch is in two versions, a batch is
// Trained exactly when a version has it, and the versions strictly
// increase from 0 with their raft (term, index), each the child of the one
// before. It returns the violations, sorted.
func CheckLineage(versions []group.Version, batches []group.Batch) []string {
	var out []string
	in := map[core.BatchID]uint64{}
	for _, v := range versions {
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				if prev, ok := in[id]; ok {
					out = append(out, fmt.Sprintf("batch %s trained into v%d and v%d", short(id), prev, v.Version))
				}
				in[id] = v.Version
			}
		}
	}
	for _, b := range batches {
		if v, ok := in[b.ID]; (b.Status == group.Trained) != ok || ok && b.Version != v {
			out = append(out, fmt.Sprintf("batch %s is %s (v%d) but the lineage says v%d", short(b.ID), b.Status, b.Version, v))
		}
	}
	for k, v := range versions {
		if v.Version != uint64(k) || v.Term == 0 || v.Index == 0 {
			out = append(out, fmt.Sprintf("version %d at position %d has term %d index %d", v.Version, k, v.Term, v.Index))
		}
		if k > 0 {
			p := versions[k-1]
			if v.Index <= p.Index || v.Term < p.Term || v.Parent != p.Version {
				out = append(out, fmt.Sprintf("v%d (term %d, index %d) does not follow v%d (term %d, index %d)", v.Version, v.Term, v.Index, p.Version, p.Term, p.Index))
			}
		}
	}
	slices.Sort(out)
	return out
}

func short(id core.BatchID) string { return string(id[:min(12, len(id))]) }
