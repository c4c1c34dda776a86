package sim

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// The network model's figures (see the package documentation).
const (
	mbit = 125_000.0 // bytes a second in one Mbit/s

	devDownLo, devDownHi = 25 * mbit, 500 * mbit
	devUpLo, devUpHi     = 5 * mbit, 50 * mbit
	devLatLo, devLatHi   = 5 * time.Millisecond, 40 * time.Millisecond // one way to the core: RTT 10-80 ms
	devLossHi            = 0.01

	trainerRate = 1000 * mbit
	trainerLat  = 5 * time.Millisecond

	// chunkSize is mesh/weights' chunk size.
	chunkSize = 1 << 20
	// msgBytes is a gossip message's size (a signed manifest or revocation).
	msgBytes = 2048
	// relayReservations is how many NAT devices one relay takes
	// reservations from: circuit relay v2's default (MaxReservations),
	// which mesh/p2p keeps.
	relayReservations = 128
)

// node is one peer: a device or a trainer.
type node struct {
	id      int
	pid     mesh.PeerID
	trainer bool

	down, up float64       // bytes a second
	lat      time.Duration // one way to the core
	loss     float64
	nat      bool // behind NAT: dialled through a relay, then hole punched
	relay    int  // for a NAT node the relay it holds a reservation on, else -1
	isRelay  bool

	nbrs []int // sorted
	// mesh: the gossipsub mesh, neighbours it pushes messages to;
	// heartbeat: the phase of its gossipsub heartbeat.
	mesh      []int
	heartbeat time.Duration

	// Liveness.
	asleep, left bool
	comp         int // partition component

	// Transfers: when the uplink and the downlink are next free, and the
	// weight requests being served.
	upFree, downFree time.Duration
	serving          int
}

// makeNetwork draws the nodes' links and the peer graph.
func (w *world) makeNetwork() {
	o := w.o
	r := w.rLinks
	n := o.Nodes + o.Trainers
	w.nodes = make([]*node, n)
	for i := range n {
		nd := &node{id: i, relay: -1}
		if i < o.Nodes {
			nd.pid = mesh.PeerID("dev-" + strconv.Itoa(i))
			nd.down = logUniform(r, devDownLo, devDownHi)
			nd.up = logUniform(r, devUpLo, devUpHi)
			nd.lat = devLatLo + time.Duration(r.Float64()*float64(devLatHi-devLatLo))
			nd.loss = r.Float64() * devLossHi
		} else {
			nd.trainer = true
			nd.pid = mesh.PeerID("trainer-" + strconv.Itoa(i-o.Nodes))
			nd.down, nd.up, nd.lat = trainerRate, trainerRate, trainerLat
		}
		w.nodes[i] = nd
	}
	// NAT and relays: relays are public devices.
	rn := w.rNAT
	var public []int
	for i := range o.Nodes {
		if rn.Float64() < o.NATShare {
			w.nodes[i].nat = true
		} else {
			public = append(public, i)
		}
	}
	if len(public) == 0 {
		public = []int{0}
		w.nodes[0].nat = false
	}
	relays := make([]int, 0, o.Relays)
	for _, k := range rn.Perm(len(public))[:min(o.Relays, len(public))] {
		relays = append(relays, public[k])
	}
	slices.Sort(relays)
	for _, i := range relays {
		w.nodes[i].isRelay = true
	}
	w.relays = relays
	// Each NAT device asks a relay for a reservation, and the next ones in
	// turn while the relay it asks is full; with every relay full it has
	// none, and no NAT device can dial it.
	taken := make(map[int]int, len(relays))
	for i := range o.Nodes {
		if !w.nodes[i].nat {
			continue
		}
		k := rn.IntN(len(relays))
		for range relays {
			if rl := relays[k]; taken[rl] < relayReservations {
				taken[rl]++
				w.nodes[i].relay = rl
				break
			}
			k = (k + 1) % len(relays)
		}
	}
	// Peer graph: every node dials others until Degree of its connections
	// carry streams, as libp2p's connection manager keeps a bounded set
	// and the mesh dials other known peers while too few answer;
	// connections are both ways. A connection that carries nothing (two
	// NAT devices the punch failed for) stays, as a relayed connection
	// does, but does not count.
	rg := w.rGraph
	adj := make([]map[int]bool, n)
	for i := range adj {
		adj[i] = map[int]bool{}
	}
	usable := make([]int, n)
	for i := range n {
		for tries := 0; usable[i] < o.Degree && tries < 20*o.Degree; tries++ {
			j := rg.IntN(n)
			if j == i || adj[i][j] {
				continue
			}
			adj[i][j], adj[j][i] = true, true
			if w.linked(w.nodes[i], w.nodes[j]) {
				usable[i]++
				usable[j]++
			}
		}
	}
	for i, m := range adj {
		for j := range m {
			w.nodes[i].nbrs = append(w.nodes[i].nbrs, j)
		}
		slices.Sort(w.nodes[i].nbrs)
	}
}

// live reports whether n is running: awake, not gone, not killed or
// paused.
func (w *world) live(n *node) bool {
	if n.asleep || n.left {
		return false
	}
	if n.trainer {
		t := w.trainerOf(n)
		return !t.killed && !t.paused
	}
	return true
}

// linked reports whether a connection between a and b carries anything. A
// NAT device reaches a public one directly (it dials out). Two NAT devices
// meet through a relay, the one where either holds a reservation, and only
// a connection hole punching then makes direct carries streams: libp2p
// opens none on a relayed connection unless asked to, and neither the
// mesh's protocols nor gossipsub ask (a circuit is also capped at 128 KiB
// and 2 minutes), so a pair the punch failed for exchanges nothing.
func (w *world) linked(a, b *node) bool {
	if !a.nat || !b.nat {
		return true
	}
	return (a.relay >= 0 || b.relay >= 0) && w.punched(a, b)
}

// punched reports whether hole punching turns a connection between a and b
// direct, a share HolePunch of the pairs. The draw is a hash of the seed
// and the unordered pair, not a stream's, so that it shifts no other
// purpose's draws and does not depend on which pair asks first.
func (w *world) punched(a, b *node) bool {
	if w.o.HolePunch <= 0 {
		return false
	}
	lo, hi := uint64(min(a.id, b.id)), uint64(max(a.id, b.id))
	x := mix64(mix64(w.o.Seed^holePunchSalt) ^ lo<<32 ^ hi)
	return float64(x>>11)/(1<<53) < w.o.HolePunch
}

// holePunchSalt keeps the hole punching hash apart from any other use of
// the seed.
const holePunchSalt = 0x686f6c652d70756e // "hole-pun"

// mix64 is SplitMix64's finaliser: every input bit moves about half of the
// output bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// reach reports whether a can send to b now: both live, on the same side of
// any partition, on a connection that carries streams.
func (w *world) reach(a, b *node) bool {
	return w.live(a) && w.live(b) && a.comp == b.comp && w.linked(a, b)
}

// latency is the one-way latency from a to b.
func (w *world) latency(a, b *node) time.Duration {
	return a.lat + b.lat
}

// lossOf is the chance a gossip message from a to b is lost.
func (w *world) lossOf(a, b *node) float64 {
	return 1 - (1-a.loss)*(1-b.loss)
}

// rate is the rate of a lone message from a to b: a's uplink or b's
// downlink, whichever is less.
func (w *world) rate(a, b *node) float64 {
	return math.Min(a.up, b.down)
}

// transmit sends n bytes from a to b, starting no earlier than from, and
// returns when the last byte arrives. a's uplink and b's downlink are each
// a queue at the link's full rate: the transfer holds each for n bytes
// after the transfers before it, so that no link carries more than its
// rate, and the bytes are in once both have passed them. A holder so
// interleaves its fetchers, and a fetcher its sources.
func (w *world) transmit(a, b *node, n int, from time.Duration) time.Duration {
	start := max(from, a.upFree)
	a.upFree = start + time.Duration(float64(n)/a.up*float64(time.Second))
	down := max(start, b.downFree)
	b.downFree = down + time.Duration(float64(n)/b.down*float64(time.Second))
	return max(a.upFree, b.downFree) + w.latency(a, b)
}

// median returns the median of xs (xs is sorted in place).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}
