package sim

import (
	"time"

	"github.com/clawmesh/clawmesh/mesh/weights"
)

// fetch is a node's fetch of one version: which chunks it has, which are
// on their way, and who holds the version.
type fetch struct {
	v         uint64
	m         *weights.Manifest
	have      []bool
	inflight  []bool
	nHave     int
	nInflight int
	retryAt   time.Duration // a retry is scheduled for then (0: none)
}

// handleOffer: node b reads a signed manifest from the wire, verifies it
// and fences it (real mesh/weights code), and fetches the version if it is
// newer than what it holds. It reports whether the offer is valid (gossip
// forwards only valid messages).
func (w *world) handleOffer(b int, data []byte) bool {
	m, err := weights.ParseManifest(data)
	if err != nil {
		w.offersRefused++
		return false
	}
	p := w.peers[b]
	if _, err := m.Verify(w.adminPub, wall(w.now), p.revs); err != nil {
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
		p.last = m
		w.startFetch(b, m)
	}
	return true
}

// startFetch starts fetching m's version, dropping an older fetch.
func (w *world) startFetch(b int, m *weights.Manifest) {
	p := w.peers[b]
	if p.fetch != nil && p.fetch.v >= m.Version {
		return
	}
	if p.fetch != nil {
		w.abandoned++
	}
	p.fetch = &fetch{v: m.Version, m: m, have: make([]bool, len(m.Chunks)), inflight: make([]bool, len(m.Chunks))}
	p.retries = 0
	w.pump(b)
}

// holds reports the newest version node i holds whole.
func (w *world) holds(i int) uint64 { return w.peers[i].held }

// pump asks holders for chunks until fetchParallel are in flight.
func (w *world) pump(b int) {
	p := w.peers[b]
	f := p.fetch
	nb := w.nodes[b]
	if f == nil || !w.live(nb) {
		return
	}
	for f.nInflight < fetchParallel {
		c := -1
		for i := range f.have {
			if !f.have[i] && !f.inflight[i] {
				c = i
				break
			}
		}
		if c < 0 {
			return
		}
		src := w.pickSource(b, f.v)
		if src < 0 {
			break
		}
		w.request(b, src, f, c)
	}
	if f.nInflight == 0 && f.retryAt == 0 {
		// No holder can serve now: try again later, backing off.
		d := min(2*time.Second, 250*time.Millisecond<<min(p.retries, 3))
		d += time.Duration(w.rFetch.Int64N(int64(d)))
		p.retries++
		f.retryAt = w.now + d
		w.at(f.retryAt, func() {
			if p.fetch == f {
				f.retryAt = 0
				w.pump(b)
			}
		})
	}
}

// pickSource chooses the holder of version v (or newer) that would deliver
// a chunk soonest: a trainer that holds it, or a neighbour that said it
// does; -1 if none can take a request now. The estimate is transmit's:
// the chunk starts when the holder's uplink is free, and takes the path's
// rate and latency, as the real fetcher, pulling from several sources,
// gets most from the fastest.
func (w *world) pickSource(b int, v uint64) int {
	nb := w.nodes[b]
	p := w.peers[b]
	best, bestAt := -1, time.Duration(0)
	try := func(j int) {
		nj := w.nodes[j]
		if nj.queued >= uploadQueue || !w.sendTo(nj, nb) || !w.sendTo(nb, nj) {
			return
		}
		start := max(w.now, nj.upFree)
		at := start + time.Duration(float64(weights.ChunkSize)/w.rate(nj, nb)*float64(time.Second)) + w.latency(nj, nb)
		if best < 0 || at < bestAt {
			best, bestAt = j, at
		}
	}
	for _, t := range w.trainers {
		if t.n.id != b && w.holds(t.n.id) >= v {
			try(t.n.id)
		}
	}
	for k, j := range nb.nbrs {
		if p.nbrHeld[k] >= v && !w.nodes[j].trainer {
			try(j)
		}
	}
	return best
}

// request has b ask src for chunk c of f.
func (w *world) request(b, src int, f *fetch, c int) {
	nb, ns := w.nodes[b], w.nodes[src]
	_, size := f.m.Chunk(c)
	f.inflight[c] = true
	f.nInflight++
	w.peers[b].asked = max(w.peers[b].asked, f.v)
	ns.queued++
	sent := w.now + w.latency(nb, ns)
	arrive := w.transmit(ns, nb, size, sent)
	w.peers[src].bytesUp += int64(size)
	w.chunkBytes += int64(size)
	w.at(arrive, func() {
		ns.queued--
		ok := w.sendTo(ns, nb)
		if ok {
			w.recordReceipt(src, b, sent)
		}
		p := w.peers[b]
		if p.fetch != f {
			w.wastedBytes += int64(size)
			return
		}
		f.inflight[c] = false
		f.nInflight--
		if !ok {
			w.wastedBytes += int64(size)
			w.pump(b)
			return
		}
		if !f.have[c] {
			f.have[c] = true
			f.nHave++
		}
		if f.nHave == len(f.have) {
			w.complete(b, f)
			return
		}
		w.pump(b)
	})
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
				w.pump(j)
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
				w.pump(b)
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
