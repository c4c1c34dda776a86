package sim

import (
	"slices"
	"time"
)

// Gossipsub's defaults (go-libp2p-pubsub's GossipSub* constants), which
// mesh/p2p runs with: each node keeps a mesh of about gsD peers it pushes
// every message to, and at each heartbeat tells gsDlazy others (or a
// gsGossipFactor share, if more) the ids of the messages it saw in the last
// gsHistoryGossip heartbeats (IHAVE), any of which they may ask for
// (IWANT).
const (
	gsD             = 6
	gsDlo           = 5
	gsDhi           = 12
	gsDlazy         = 6
	gsGossipFactor  = 0.25
	gsHeartbeat     = time.Second
	gsHistoryGossip = 3
	// controlBytes is an IHAVE or IWANT of one message id, framed.
	controlBytes = 64
)

// repairMesh is node a's heartbeat on its mesh: it forgets the peers it
// can no longer reach or that pruned it, and below gsDlo grafts reachable
// neighbours (whose own mesh is below gsDhi) up to gsD. The library repairs
// at every heartbeat, a second apart; the simulator repairs when a node is
// about to use its mesh, which for messages minutes apart is the same.
func (w *world) repairMesh(a int) {
	na := w.nodes[a]
	na.mesh = slices.DeleteFunc(na.mesh, func(j int) bool {
		nb := w.nodes[j]
		return !w.sendTo(na, nb) || !slices.Contains(nb.mesh, a)
	})
	if len(na.mesh) >= gsDlo {
		return
	}
	var cand []int
	for _, j := range na.nbrs {
		nb := w.nodes[j]
		if slices.Contains(na.mesh, j) || len(nb.mesh) >= gsDhi || !w.sendTo(na, nb) || !w.sendTo(nb, na) {
			continue
		}
		cand = append(cand, j)
	}
	w.rGossipsub.Shuffle(len(cand), func(x, y int) { cand[x], cand[y] = cand[y], cand[x] })
	for _, j := range cand {
		if len(na.mesh) >= gsD {
			break
		}
		na.mesh = append(na.mesh, j)
		if nb := w.nodes[j]; !slices.Contains(nb.mesh, a) {
			nb.mesh = append(nb.mesh, a)
		}
	}
}

// buildMeshes forms every node's mesh when the network comes up.
func (w *world) buildMeshes() {
	for i, n := range w.nodes {
		n.heartbeat = time.Duration(w.rGossipsub.Int64N(int64(gsHeartbeat)))
		w.repairMesh(i)
	}
}

// nextHeartbeat is a's first heartbeat after now.
func (w *world) nextHeartbeat(a int) time.Duration {
	ph := w.nodes[a].heartbeat
	k := (w.now-ph)/gsHeartbeat + 1
	if w.now < ph {
		k = 0
	}
	return ph + k*gsHeartbeat
}

// gossipLater has a, which has just seen m, announce it at its next
// gsHistoryGossip heartbeats.
func (w *world) gossipLater(a int, m *message) {
	if w.eagerOnly {
		return
	}
	hb := w.nextHeartbeat(a)
	for k := range gsHistoryGossip {
		w.at(hb+time.Duration(k)*gsHeartbeat, func() { w.ihave(a, m) })
	}
}

// ihave is a's heartbeat gossip of m: an IHAVE to gsDlazy (or a
// gsGossipFactor share of) the reachable neighbours outside its mesh.
func (w *world) ihave(a int, m *message) {
	na := w.nodes[a]
	if !w.live(na) {
		return
	}
	w.repairMesh(a)
	var cand []int
	for _, j := range na.nbrs {
		if !slices.Contains(na.mesh, j) && w.sendTo(na, w.nodes[j]) {
			cand = append(cand, j)
		}
	}
	n := max(gsDlazy, int(gsGossipFactor*float64(len(cand))))
	w.rGossipsub.Shuffle(len(cand), func(x, y int) { cand[x], cand[y] = cand[y], cand[x] })
	for _, j := range cand[:min(n, len(cand))] {
		nb := w.nodes[j]
		w.gossipBytes += controlBytes
		m.ihaves++
		if w.rGossip.Float64() < w.lossOf(na, nb) {
			continue
		}
		w.after(w.latency(na, nb), func() { w.iwant(a, j, m) })
	}
}

// iwant is b's answer to a's IHAVE of m: it asks for m unless it has it or
// has asked already, and a sends it.
func (w *world) iwant(a, b int, m *message) {
	na, nb := w.nodes[a], w.nodes[b]
	if m.seen[b] || m.wanted[b] || !w.sendTo(nb, na) {
		return
	}
	m.wanted[b] = true
	w.gossipBytes += controlBytes
	lost := w.rGossip.Float64() < w.lossOf(nb, na)
	w.after(w.latency(nb, na), func() {
		if lost || !w.sendTo(na, nb) {
			m.wanted[b] = false
			return
		}
		m.copies++
		m.pulled++
		w.gossipBytes += msgBytes
		if w.rGossip.Float64() < w.lossOf(na, nb) {
			m.lost++
			m.wanted[b] = false
			return
		}
		sent := w.now
		w.after(w.latency(na, nb)+time.Duration(msgBytes/w.rate(na, nb)*float64(time.Second)), func() {
			m.wanted[b] = false
			w.deliver(a, b, sent, m)
		})
	})
}
