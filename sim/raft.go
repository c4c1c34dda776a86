package sim

import (
	"cmp"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Raft timing, as hashicorp/raft's defaults (the trainers' Timing keeps
// them): a follower's heartbeat timer fires every 1–2 heartbeat timeouts,
// and it stands for election when one fires a heartbeat timeout or more
// after it last heard the leader; a candidate asks for pre-votes and, if
// refused, again after an election timeout (1–2 s); a leader that cannot
// reach a quorum steps down after the leader lease.
const (
	heartbeatTimeout = time.Second
	electionTimeout  = time.Second
	leaderLease      = 500 * time.Millisecond
	fsyncTime        = 2 * time.Millisecond
	tickEvery        = 500 * time.Millisecond
	maxAddPerEntry   = 512
)

// Training cost: the native engine trains the tiny model at 15,032 tokens
// a second (docs/benchmarks.md, 2026-11-25); a sample here is 64 tokens.
const (
	engineTokensPerSecond = 15032
	tokensPerSample       = 64
	samplesPerSecond      = float64(engineTokensPerSecond) / tokensPerSample
)

// trainerPeer is one trainer: its own copy of the group's state, applied
// from the shared log with the real group.State.Apply.
type trainerPeer struct {
	n         *node
	i         int
	st        *group.State
	applied   int
	killed    bool
	paused    bool
	malicious bool
	// Raft's timers (see scheduleElection): hbNext is when its heartbeat
	// timer fires next; stood when it stood for election since the leader
	// was lost (-1: it has not); nextVote its next request for pre-votes.
	hbNext, stood, nextVote time.Duration
	buf                     []group.BatchRef
	work                    *work
}

func (w *world) trainerOf(n *node) *trainerPeer { return w.trainers[n.id-w.o.Nodes] }

// logEntry is a committed entry; e is nil for raft's own no-op.
type logEntry struct {
	e           *group.Entry
	term, index uint64
}

// work is a trainer's part of one round in progress.
type work struct {
	round   uint64
	base    uint64
	ids     []core.BatchID
	pending int
	refused []group.Refusal
	ok      []core.BatchID
}

// roundRun is what the leader collects for the open round.
type roundRun struct {
	number  uint64
	leader  int
	term    uint64
	parts   []part
	contrib []group.Contribution
	refused []group.Refusal
	from    map[int]bool
	expect  int
	closing bool
}

// Failover is one loss of the leader and how long the group took to
// commit again.
type Failover struct {
	Cause string `json:"cause"`
	// At is when the fault happened; Elected when a new leader won its
	// election; Committed when it committed its first entry. Seconds is
	// Committed − At.
	At        float64 `json:"at_s"`
	Elected   float64 `json:"elected_s"`
	Committed float64 `json:"committed_s"`
	Seconds   float64 `json:"seconds"`
	Term      uint64  `json:"term"`
}

func (w *world) leaderNode() int {
	if w.leader < 0 {
		return -1
	}
	return w.trainers[w.leader].n.id
}

func (w *world) voters() []*trainerPeer { return w.trainers[:w.o.Voters] }

func (w *world) quorum() int { return len(w.voters())/2 + 1 }

// reachable lists the voters t reaches (t itself included when it is one).
func (w *world) reachable(t *trainerPeer) []*trainerPeer {
	var out []*trainerPeer
	if !w.live(t.n) {
		return nil
	}
	for _, v := range w.voters() {
		if v == t || w.reach(t.n, v.n) && w.answers(t, v) {
			out = append(out, v)
		}
	}
	return out
}

// commitDelay is how long the leader takes to hear from a quorum: the
// quorum's slowest round trip and an fsync.
func (w *world) commitDelay(l *trainerPeer) time.Duration {
	var rtts []time.Duration
	for _, v := range w.reachable(l) {
		if v != l {
			rtts = append(rtts, 2*w.latency(l.n, v.n))
		}
	}
	slices.Sort(rtts)
	k := w.quorum() - 2
	d := fsyncTime
	if k >= 0 && k < len(rtts) {
		d += rtts[k]
	}
	return d
}

// propose has the leader replicate e; it commits once a quorum has it,
// unless the leader is deposed first. then runs on commit with the
// leader's Apply result.
func (w *world) propose(e *group.Entry, then func(err error, term, index uint64)) bool {
	if w.leader < 0 {
		return false
	}
	l := w.trainers[w.leader]
	if len(w.reachable(l)) < w.quorum() {
		return false
	}
	if e != nil {
		e.At = wall(w.now)
	}
	at := max(w.now+w.commitDelay(l), w.lastCommit)
	w.lastCommit = at
	term, li := w.term, w.leader
	w.inflight++
	w.at(at, func() {
		w.inflight--
		if w.leader != li || w.term != term || len(w.reachable(l)) < w.quorum() {
			w.lostProposals++
			return
		}
		index := uint64(len(w.log) + 1)
		w.log = append(w.log, logEntry{e: e, term: term, index: index})
		var err error
		for _, t := range w.trainers {
			if t == l || w.reach(l.n, t.n) {
				if t == l {
					err = w.catchUp(t)
				} else {
					w.catchUp(t)
				}
			}
		}
		if f := w.failing; f != nil && f.Committed == 0 {
			f.Committed = seconds(w.now)
			f.Seconds = f.Committed - f.At
			f.Term = term
			w.failovers = append(w.failovers, *f)
			w.failing = nil
		}
		if then != nil {
			then(err, term, index)
		}
	})
	return true
}

// catchUp applies the committed entries t has not applied yet, and
// returns the last one's result.
func (w *world) catchUp(t *trainerPeer) error {
	var err error
	for ; t.applied < len(w.log); t.applied++ {
		le := w.log[t.applied]
		if le.e == nil {
			continue
		}
		err = t.st.Apply(le.e, le.term, le.index)
		if err != nil && t == w.trainers[0] {
			w.refusedEntries++
		}
	}
	return err
}

// checkLeader reacts to a change of who reaches whom: a leader that is
// gone or cut from a quorum loses its followers, and an election follows.
func (w *world) checkLeader(cause string) {
	if w.leader >= 0 {
		l := w.trainers[w.leader]
		if w.live(l.n) && len(w.reachable(l)) >= w.quorum() {
			return
		}
		w.leader = -1
		if w.failing == nil {
			w.failing = &Failover{Cause: cause, At: seconds(w.now)}
		}
		// Its followers last heard it at its last heartbeat, which it
		// sends every tenth of a heartbeat timeout.
		w.lostAt = w.now - time.Duration(w.rRaft.Int64N(int64(heartbeatTimeout/10)))
		for _, t := range w.voters() {
			t.stood = -1
		}
		if w.live(l.n) {
			w.followAgain(l)
		}
	}
	w.scheduleElection()
}

// randomTimeout is hashicorp/raft's: between d and 2d.
func (w *world) randomTimeout(d time.Duration) time.Duration {
	return d + time.Duration(w.rRaft.Int64N(int64(d)))
}

// stand works out when voter t stood for election after the leader was
// lost at w.lostAt: the first firing of its heartbeat timer a heartbeat
// timeout or more after it last heard the leader (each firing sets the
// next 1–2 timeouts on).
func (w *world) stand(t *trainerPeer) {
	if t.stood >= 0 {
		return
	}
	for t.hbNext-w.lostAt < heartbeatTimeout {
		t.hbNext += w.randomTimeout(heartbeatTimeout)
	}
	t.stood, t.nextVote = t.hbNext, t.hbNext
}

// followAgain restarts t's heartbeat timer, as raft does when a server
// becomes a follower.
func (w *world) followAgain(t *trainerPeer) {
	t.hbNext = w.now + w.randomTimeout(heartbeatTimeout)
	t.stood = -1
}

// scheduleElection plays hashicorp/raft's election with pre-vote among the
// live voters. Each stands when its heartbeat timer finds the leader gone
// (stand), and asks the voters it reaches for pre-votes; a voter grants
// one only once it has stood itself (until then it still has a leader)
// and if its log is no newer. A candidate refused asks again after an
// election timeout. The first to gather a quorum wins after two round
// trips (the pre-vote and the vote).
func (w *world) scheduleElection() {
	if w.electionPending {
		return
	}
	var live []*trainerPeer
	for _, t := range w.voters() {
		if w.live(t.n) {
			w.stand(t)
			for t.nextVote < w.now {
				t.nextVote += w.randomTimeout(electionTimeout)
			}
			live = append(live, t)
		}
	}
	if len(live) < w.quorum() {
		return
	}
	// Bounded: with a quorum reachable the second round of requests at
	// the latest wins; without one, nothing does until the network
	// changes, and checkLeader calls again.
	for range 16 * len(live) {
		c := live[0]
		for _, t := range live[1:] {
			if t.nextVote < c.nextVote {
				c = t
			}
		}
		at := c.nextVote
		granted := 0
		var rtt time.Duration
		for _, v := range w.reachable(c) {
			if v == c || (v.stood >= 0 && v.stood <= at && v.applied <= c.applied) {
				granted++
			}
			if v != c {
				rtt = max(rtt, 2*w.latency(c.n, v.n))
			}
		}
		if granted < w.quorum() {
			c.nextVote = at + w.randomTimeout(electionTimeout)
			continue
		}
		t := c
		w.electionPending = true
		w.at(at+2*rtt, func() {
			w.electionPending = false
			if w.leader >= 0 {
				return
			}
			if len(w.reachable(t)) < w.quorum() {
				w.scheduleElection()
				return
			}
			w.term++
			w.leader = t.i
			w.round = nil
			w.elected(t)
			if w.failing != nil {
				w.failing.Elected = seconds(w.now)
			}
			for _, v := range w.voters() {
				if v != t {
					w.followAgain(v)
				}
			}
			for _, v := range w.reachable(t) {
				w.catchUp(v)
			}
			// A new leader commits a no-op first.
			w.propose(nil, nil)
		})
		return
	}
}

// tick is the leader's loop: batches in, stale ones out, rounds planned,
// stragglers cut at the deadline.
func (w *world) tick() {
	if w.leader >= 0 && w.inflight == 0 {
		l := w.trainers[w.leader]
		if w.live(l.n) {
			w.lead(l)
		}
	}
	if w.now+tickEvery <= w.o.Duration && !w.done {
		w.after(tickEvery, w.tick)
	}
}

func (w *world) lead(l *trainerPeer) {
	st := l.st
	if _, ok := st.Current(); !ok {
		w.bootstrap(l)
		return
	}
	// A version no quorum certified is retracted first.
	if w.retractUncertified(l) {
		return
	}
	// Intake: the announced batches the ledger lacks.
	var add []group.BatchRef
	for _, r := range l.buf {
		if _, ok := st.Batches[r.ID]; !ok && len(add) < maxAddPerEntry {
			add = append(add, r)
		}
	}
	l.buf = slices.DeleteFunc(l.buf, func(r group.BatchRef) bool { _, ok := st.Batches[r.ID]; return ok })
	if len(add) > 0 {
		var then func(error, uint64, uint64)
		if w.trust != nil {
			then = func(err error, _, _ uint64) {
				if err == nil {
					w.ingestedBatches(add)
				}
			}
		}
		w.propose(&group.Entry{Add: add}, then)
	}
	if st.Round != nil {
		r := w.round
		switch {
		case r == nil || r.number != st.Round.Number || r.term != w.term:
			// A round a deposed leader opened: its deltas go to no one.
			w.propose(&group.Entry{Abort: &group.Abort{Round: st.Round.Number, Reason: "leader changed"}}, nil)
		case !r.closing && !wall(w.now).Before(st.Round.Deadline):
			w.closeRound(l)
		}
		return
	}
	if w.published >= w.o.Versions || w.now < w.lastStart+w.o.RoundEvery {
		return
	}
	if stale := st.Stale(); len(stale) > 0 {
		w.propose(&group.Entry{Refuse: stale}, nil)
	}
	var live []mesh.PeerID
	for _, t := range w.trainers {
		if (t == l || w.reach(l.n, t.n)) && !w.benched(t) {
			live = append(live, t.n.pid)
		}
	}
	start, ok := st.Plan(wall(w.now), l.n.pid, live)
	if !ok {
		return
	}
	w.lastStart = w.now
	w.propose(&group.Entry{Start: start}, func(err error, term, index uint64) {
		if err != nil {
			return
		}
		w.round = &roundRun{number: start.Round, leader: l.i, term: term, from: map[int]bool{}, expect: len(start.Shares)}
		for _, t := range w.trainers {
			if ids := t.st.Share(t.n.pid); len(ids) > 0 && t.st.Round != nil && t.st.Round.Number == start.Round {
				w.startWork(t, start.Round, start.Base, ids)
			}
		}
		if w.onStart != nil {
			w.onStart(start.Round)
		}
	})
}

// bootstrap commits the configuration, version 0 and the trainers.
func (w *world) bootstrap(l *trainerPeer) {
	c := group.Config{Quota: 1 << 20, RoundSteps: 1 << 16, Deadline: 2 * time.Minute, MaxLag: group.DefaultMaxLag, Aggregate: group.AggMean}
	if w.def.Quota {
		c.Quota = honestQuota
	}
	if w.def.Aggregate == "trimmed" {
		c.Aggregate = group.AggTrimmed
	}
	if w.def.Clip {
		c.MaxNorm = maxNorm
	}
	w.propose(&group.Entry{Configure: &c}, nil)
	w.propose(&group.Entry{Genesis: &group.Genesis{Hash: w.learn.hashes[0], Publisher: l.n.pid}}, nil)
	for _, t := range w.trainers {
		w.propose(&group.Entry{Register: &group.Trainer{ID: t.n.pid, Engine: "native", Device: "cpu", Speed: samplesPerSecond}}, nil)
	}
}

// startWork: trainer t pulls its share's batches from their devices,
// re-verifies them when the defence is on, trains, and sends its delta to
// the leader.
func (w *world) startWork(t *trainerPeer, round, base uint64, ids []core.BatchID) {
	wk := &work{round: round, base: base, ids: ids, pending: len(ids)}
	t.work = wk
	if !w.live(t.n) {
		return
	}
	for _, id := range ids {
		b := w.batches[id]
		dev := w.nodes[b.from]
		if !w.sendTo(dev, t.n) {
			wk.refused = append(wk.refused, group.Refusal{ID: id, Reason: "unreadable"})
			wk.pending--
			continue
		}
		arrive := w.transmit(dev, t.n, b.bytes, w.now+w.latency(t.n, dev))
		w.at(arrive, func() {
			if t.work != wk {
				return
			}
			if !w.sendTo(dev, t.n) {
				wk.refused = append(wk.refused, group.Refusal{ID: id, Reason: "unreadable"})
			} else if w.def.Reverify && (b.kind == flipped || b.kind == forged) {
				wk.refused = append(wk.refused, group.Refusal{ID: id, Reason: "verify"})
			} else {
				wk.ok = append(wk.ok, id)
			}
			wk.pending--
			if wk.pending == 0 {
				w.train(t, wk)
			}
		})
	}
	if wk.pending == 0 {
		w.train(t, wk)
	}
}

func (w *world) train(t *trainerPeer, wk *work) {
	slices.Sort(wk.ok)
	slices.SortFunc(wk.refused, func(a, b group.Refusal) int { return cmp.Compare(a.ID, b.ID) })
	samples := 0
	for _, id := range wk.ok {
		samples += w.batches[id].steps
	}
	dur := time.Duration(float64(samples) / samplesPerSecond * float64(time.Second))
	w.at(w.now+dur, func() {
		if t.work != wk || !w.live(t.n) {
			w.wastedSamples += samples
			return
		}
		t.work = nil
		base := w.learn.vectors[wk.base]
		dirs := make([][]float64, len(wk.ok))
		steps := make([]int, len(wk.ok))
		for k, id := range wk.ok {
			b := w.batches[id]
			dirs[k] = w.learn.batchDir(w.rLearn, base, b.kind, b.steps)
			steps[k] = b.steps
			w.trainedTimes[id]++
		}
		p := part{from: string(t.n.pid), trainer: t.i, samples: samples, delta: w.learn.trainerDelta(dirs, steps, t.malicious)}
		p.delta, p.forged = w.forgeDelta(t, p.delta)
		c := group.Contribution{Trainer: t.n.pid, Batches: wk.ok, Samples: samples, Norm: norm(p.delta), Clipped: norm(p.delta), Seconds: dur.Seconds()}
		li := w.leader
		if li < 0 {
			w.wastedSamples += samples
			return
		}
		l := w.trainers[li]
		arrive := w.now
		if l != t {
			if !w.reach(t.n, l.n) {
				w.wastedSamples += samples
				return
			}
			arrive = w.transmit(t.n, l.n, w.o.BundleMiB<<20, w.now)
		}
		w.at(arrive, func() {
			r := w.round
			if w.leader != li || r == nil || r.number != wk.round || r.closing || r.from[t.i] || (l != t && !w.reach(t.n, l.n)) {
				w.wastedSamples += samples
				return
			}
			r.from[t.i] = true
			r.refused = append(r.refused, wk.refused...)
			if samples > 0 {
				r.parts = append(r.parts, p)
				r.contrib = append(r.contrib, c)
				if w.trust != nil {
					w.trust.contributed[t.i]++
				}
			}
			if len(r.from) == r.expect {
				w.closeRound(l)
			}
		})
	})
}

// closeRound aggregates the deltas in and publishes the next version, or
// aborts the round when none came.
func (w *world) closeRound(l *trainerPeer) {
	r := w.round
	st := l.st
	if r == nil || st.Round == nil || st.Round.Number != r.number {
		return
	}
	r.closing = true
	slices.SortFunc(r.refused, func(a, b group.Refusal) int { return cmp.Compare(a.ID, b.ID) })
	if len(r.parts) == 0 {
		refused := r.refused
		w.propose(&group.Entry{Abort: &group.Abort{Round: r.number, Reason: "no delta"}}, func(err error, _, _ uint64) {
			w.round = nil
			if err == nil && len(refused) > 0 {
				w.propose(&group.Entry{Refuse: refused}, nil)
			}
		})
		return
	}
	// Deterministic order: by trainer.
	idx := make([]int, len(r.parts))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(r.parts[a].from, r.parts[b].from) })
	parts := make([]part, len(idx))
	contrib := make([]group.Contribution, len(idx))
	for k, i := range idx {
		parts[k], contrib[k] = r.parts[i], r.contrib[i]
	}
	parts, contrib, cost := w.spotCheck(r.number, parts, contrib)
	if cost == 0 {
		w.publishRound(l, r, parts, contrib)
		return
	}
	w.after(cost, func() {
		if w.leader == l.i && w.round == r && l.st.Round != nil && l.st.Round.Number == r.number {
			w.publishRound(l, r, parts, contrib)
		}
	})
}

// publishRound aggregates the round's deltas and commits the version.
func (w *world) publishRound(l *trainerPeer, r *roundRun, parts []part, contrib []group.Contribution) {
	st := l.st
	if len(parts) == 0 {
		refused := r.refused
		w.propose(&group.Entry{Abort: &group.Abort{Round: r.number, Reason: "no delta"}}, func(err error, _, _ uint64) {
			w.round = nil
			if err == nil && len(refused) > 0 {
				w.propose(&group.Entry{Refuse: refused}, nil)
			}
		})
		return
	}
	base := st.Round.Base
	d, err := aggregate(parts, w.learn.hashes[base], w.def)
	if err != nil {
		w.fail("%v", err)
		return
	}
	forged := w.forgeVersion(l, d)
	vec := make([]float32, dim)
	for i := range vec {
		vec[i] = w.learn.vectors[base][i] + d[i]
	}
	hash := hashOf(uint64(len(w.learn.vectors)), vec)
	if forged {
		w.trust.forged[hash] = true
	}
	pub := &group.Publish{Round: r.number, Version: base + 1, Parent: base, Hash: hash, Publisher: l.n.pid, Contributors: contrib, Refused: r.refused}
	w.propose(&group.Entry{Publish: pub}, func(err error, term, index uint64) {
		w.round = nil
		if err != nil {
			return
		}
		w.learn.add(vec)
		w.publishVersion(l, pub.Version)
	})
}
