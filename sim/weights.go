package sim

import (
	"errors"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// The fetch's figures: the real fetcher's and server's defaults
// (mesh/weights FetcherConfig, ServerConfig, node/adapters Config).
const (
	fetchStreams    = 2                      // requests at once per source
	fetchPerRequest = 8                      // chunks per request
	maxServing      = 4                      // requests a holder serves at once
	busyBackoff     = 100 * time.Millisecond // after a busy answer, doubling
	maxBusyBackoff  = 2 * time.Second
	stallTimeout    = 10 * time.Second // a source silent this long is left
	fetchRetry      = 5 * time.Second  // a failed fetch is tried again after
)

// errStalled is why a fetch leaves a source that stopped answering.
var errStalled = errors.New("stalled")

// fetch is a node's fetch of one version: the chunks it has (kept on disk
// across attempts, as the real fetch resumes), and the current attempt's
// plan, the real fetcher's (chunks.Plan), with its sources.
type fetch struct {
	v     uint64
	m     *chunks.Manifest
	have  []bool
	nHave int
	plan  *chunks.Plan
	gen   int                 // the attempt: events of an earlier one do nothing
	srcs  map[mesh.PeerID]int // source → node
	// parked are the sources whose workers wait for chunks to come back.
	parked []int
	// failedAt: the attempt failed (no source could finish it) and the
	// next starts fetchRetry later (0: running).
	failedAt time.Duration
}

// handleOffer: node b reads a signed manifest from the wire, verifies it,
// checks its certification and fences it (real mesh/weights code), and fetches the version if it is
// newer than what it holds. It reports whether the offer is valid (gossip
// forwards only valid messages).
func (w *world) handleOffer(b int, data []byte) bool {
	m, err := chunks.ParseManifest(data)
	if err != nil {
		w.offersRefused++
		return false
	}
	p := w.peers[b]
	if _, err := m.Verify(w.adminPub, wall(w.now), p.revs); err != nil {
		w.offersRefused++
		return false
	}
	// As the real service: a newer voter set the admin signed is adopted
	// from the certification, then the votes are checked against the set
	// in force.
	if c := m.Cert; c != nil && c.Voters != nil && p.voters.Newer(c.Voters) && c.Voters.Verify(w.adminPub) == nil {
		p.voters = c.Voters
	}
	if err := m.VerifyCertified(w.adminPub, p.voters); err != nil {
		w.offersRefused++
		return false
	}
	w.verifies++
	if err := m.Fence(p.last); err != nil {
		w.offersFenced++
		return true
	}
	if m.Version > p.held && (p.last == nil || m.Version >= p.last.Version) {
		if l := p.last; l != nil && m.Version > l.Version && (m.Index <= l.Index || m.Term < l.Term) {
			w.fail("%s accepted v%d (term %d, index %d) after v%d (term %d, index %d)", w.nodes[b].pid, m.Version, m.Term, m.Index, l.Version, l.Term, l.Index)
		}
		w.accepted(b, m)
		p.last = m
		w.startFetch(b, m)
	}
	return true
}

// startFetch starts fetching m's version, dropping an older fetch.
func (w *world) startFetch(b int, m *chunks.Manifest) {
	p := w.peers[b]
	if p.fetch != nil && p.fetch.v >= m.Version {
		return
	}
	if p.fetch != nil {
		w.abandoned++
	}
	p.fetch = &fetch{v: m.Version, m: m, have: make([]bool, len(m.Chunks))}
	w.attempt(b, p.fetch)
}

// holds reports the newest version node i holds whole.
func (w *world) holds(i int) uint64 { return w.peers[i].held }

// attempt starts an attempt at fetch f with a fresh plan of the chunks
// still missing, from the holders b knows of now.
func (w *world) attempt(b int, f *fetch) {
	var missing []int
	for i, ok := range f.have {
		if !ok {
			missing = append(missing, i)
		}
	}
	f.plan = chunks.NewPlan(missing, fetchPerRequest, 0)
	f.gen++
	f.srcs, f.parked, f.failedAt = map[mesh.PeerID]int{}, nil, 0
	w.addSources(b)
	if f.plan.Sources() == 0 {
		w.failFetch(b, f) // as the real fetch with no source given
	}
}

// failFetch ends an attempt no source can finish; the next starts
// fetchRetry later, as the node's follower tries again.
func (w *world) failFetch(b int, f *fetch) {
	if f.failedAt != 0 {
		return
	}
	f.failedAt = w.now
	f.parked = nil
	gen := f.gen
	w.after(fetchRetry, func() {
		if p := w.peers[b]; p.fetch == f && f.gen == gen && f.failedAt != 0 && w.live(w.nodes[b]) {
			w.attempt(b, f)
		}
	})
}

// resumeFetch starts a new attempt at b's fetch, if any, after b woke:
// its connections are gone, the chunks on disk are not.
func (w *world) resumeFetch(b int) {
	if f := w.peers[b].fetch; f != nil {
		f.failedAt = 0
		w.attempt(b, f)
	}
}

// addSources adds to b's running fetch the holders it knows of: the
// trainers that hold the version and the neighbours that said they do,
// as the weights service feeds its fetch the offers it hears.
func (w *world) addSources(b int) {
	p := w.peers[b]
	f := p.fetch
	if f == nil || f.failedAt != 0 || !w.live(w.nodes[b]) {
		return
	}
	for _, t := range w.trainers {
		if t.n.id != b && w.holds(t.n.id) >= f.v {
			w.addSource(b, f, t.n.id)
		}
	}
	for k, j := range w.nodes[b].nbrs {
		if p.nbrHeld[k] >= f.v && !w.nodes[j].trainer {
			w.addSource(b, f, j)
		}
	}
}

// addSource makes j a source of f, with fetchStreams workers, if b can
// reach it now and it was not one of this attempt before.
func (w *world) addSource(b int, f *fetch, j int) {
	nb, nj := w.nodes[b], w.nodes[j]
	if !w.sendTo(nb, nj) || !w.sendTo(nj, nb) || !f.plan.Add(nj.pid) {
		return
	}
	f.srcs[nj.pid] = j
	for range fetchStreams {
		w.work(b, f, j, 0)
	}
}

// work is one of a source's workers: it takes the plan's next request
// for the source and asks it. The holder serves it (its uplink reserved
// for the request's bytes), answers busy when it serves maxServing
// already (the worker backs off and asks again), or, gone, never answers
// (the fetch leaves it after stallTimeout). A worker with nothing to take
// parks until chunks come back.
func (w *world) work(b int, f *fetch, j int, backoff time.Duration) {
	p := w.peers[b]
	nb, nj := w.nodes[b], w.nodes[j]
	if p.fetch != f || f.failedAt != 0 || !w.live(nb) {
		return
	}
	gen := f.gen
	got := f.plan.Take(nj.pid)
	if got == nil {
		if f.plan.Live(nj.pid) && !f.plan.Over() {
			f.parked = append(f.parked, j)
		}
		return
	}
	p.asked = max(p.asked, f.v)
	if !w.sendTo(nb, nj) || !w.sendTo(nj, nb) {
		w.after(stallTimeout, func() { w.settle(b, f, gen, j, got, errStalled) })
		return
	}
	rtt := 2 * w.latency(nb, nj)
	if nj.serving >= maxServing {
		w.busyAnswers++
		sent := w.now + rtt/2
		w.after(rtt, func() {
			if w.sendTo(nj, nb) {
				w.recordReceipt(j, b, sent)
			}
			if !w.settle(b, f, gen, j, got, nil) {
				return
			}
			d := min(max(2*backoff, busyBackoff), maxBusyBackoff)
			w.after(d+time.Duration(w.rFetch.Int64N(int64(d))), func() {
				if f.gen == gen {
					w.work(b, f, j, d)
				}
			})
		})
		return
	}
	size := 0
	for _, c := range got {
		_, n := f.m.Chunk(c)
		size += n
	}
	nj.serving++
	sent := w.now + rtt/2
	arrive := w.transmit(nj, nb, size, sent)
	w.peers[j].bytesUp += int64(size)
	w.chunkBytes += int64(size)
	w.at(arrive, func() {
		nj.serving--
		ok := w.sendTo(nj, nb)
		if ok {
			w.recordReceipt(j, b, sent)
		}
		if p.fetch != f || f.gen != gen || f.failedAt != 0 || !ok {
			w.wastedBytes += int64(size)
			w.settle(b, f, gen, j, got, errStalled)
			return
		}
		for _, c := range got {
			f.plan.Got()
			if !f.have[c] {
				f.have[c] = true
				f.nHave++
			}
		}
		if f.nHave == len(f.have) {
			w.complete(b, f)
			return
		}
		if w.settle(b, f, gen, j, nil, nil) {
			w.work(b, f, j, 0)
		}
	})
}

// settle ends a request of attempt gen of f to j (Plan.Settle), wakes
// the parked workers, and fails the attempt if no source can finish it.
// It reports whether the attempt goes on.
func (w *world) settle(b int, f *fetch, gen, j int, rest []int, leave error) bool {
	if w.peers[b].fetch != f || f.gen != gen || f.failedAt != 0 {
		return false
	}
	f.plan.Settle(w.nodes[j].pid, rest, -1, leave)
	if f.plan.Stuck() {
		w.failFetch(b, f)
		return false
	}
	parked := f.parked
	f.parked = nil
	for _, k := range parked {
		w.work(b, f, k, 0)
	}
	return f.gen == gen && f.failedAt == 0
}

// complete installs a fetched version and tells the neighbours.
func (w *world) complete(b int, f *fetch) {
	p := w.peers[b]
	p.fetch = nil
	w.install(b, f.v)
	w.announceHave(b)
}

// install makes v the version node b holds and serves.
func (w *world) install(b int, v uint64) {
	p := w.peers[b]
	if v <= p.held {
		return
	}
	p.held = v
	for u := uint64(1); u <= v && int(u) < len(w.reached); u++ {
		if w.reached[u][b] < 0 {
			w.reached[u][b] = w.now
		}
	}
	if p.staleSince >= 0 && v >= w.newest {
		p.stale += w.now - p.staleSince
		p.staleSince = -1
	}
}

// announceHave tells b's neighbours the newest version it holds (the
// weights service's announcement to connected peers).
func (w *world) announceHave(b int) {
	nb := w.nodes[b]
	v := w.peers[b].held
	for _, j := range nb.nbrs {
		nj := w.nodes[j]
		if !w.sendTo(nb, nj) {
			continue
		}
		sent := w.now
		w.after(w.latency(nb, nj), func() {
			if !w.sendTo(nb, nj) {
				return
			}
			w.recordReceipt(b, j, sent)
			pj := w.peers[j]
			if k, ok := indexOf(nj.nbrs, b); ok && pj.nbrHeld[k] < v {
				pj.nbrHeld[k] = v
			}
			if pj.fetch != nil && pj.fetch.v <= v {
				w.addSources(j)
			}
		})
	}
}

// sync is what a node does on (re)connecting: it asks each neighbour for
// its newest manifest and its revocation list, and learns what it holds.
func (w *world) sync(b int) {
	nb := w.nodes[b]
	for _, j := range nb.nbrs {
		nj := w.nodes[j]
		if !w.sendTo(nj, nb) {
			continue
		}
		pj := w.peers[j]
		var data, revs []byte
		if pj.last != nil {
			data = pj.last.Marshal()
		}
		if pj.revs.Len() > 0 {
			revs = pj.revs.Marshal()
		}
		held := pj.held
		sent := w.now
		w.after(2*w.latency(nb, nj), func() {
			if !w.sendTo(nj, nb) {
				return
			}
			w.recordReceipt(j, b, sent)
			p := w.peers[b]
			if revs != nil {
				w.mergeRevocations(b, revs)
			}
			if k, ok := indexOf(nb.nbrs, j); ok && p.nbrHeld[k] < held {
				p.nbrHeld[k] = held
			}
			if data != nil {
				w.handleOffer(b, data)
			}
			if p.fetch != nil {
				w.addSources(b)
			}
		})
	}
}

func indexOf(xs []int, x int) (int, bool) {
	lo, hi := 0, len(xs)
	for lo < hi {
		m := (lo + hi) / 2
		if xs[m] < x {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(xs) && xs[lo] == x
}
