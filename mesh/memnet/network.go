package memnet

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Network is a simulated network: the hosts made on it, the connections
// between them, and the faults that cut them. Create it with NewNetwork;
// its methods may be called concurrently.
type Network struct {
	o     Options
	log   *slog.Logger
	stats stats

	mu       sync.Mutex
	closed   bool
	hosts    map[mesh.PeerID]*Host                 // running
	addrs    map[mesh.PeerID]string                // each id's usual address, without /p2p/<id>
	ports    int                                   // fresh addresses given (HostOptions.NewAddr)
	conns    map[mesh.PeerID]map[mesh.PeerID]*conn // each connection under both its ends
	group    map[mesh.PeerID]int                   // partition of each host named by Partition; 0 for the rest
	isolated map[mesh.PeerID]bool
	drop     map[link]float64
	opened   map[link]uint64 // streams opened on each directed link: a stream's draw
	keys     uint64          // keys made: a key's draw
}

// link is a directed link between two hosts.
type link struct{ from, to mesh.PeerID }

// NewNetwork makes an empty network. It panics if o is invalid
// (Options.Validate): a simulation set up wrong is a bug in its caller.
func NewNetwork(o Options) *Network {
	if err := o.Validate(); err != nil {
		panic(err)
	}
	o = o.withDefaults()
	return &Network{
		o:        o,
		log:      o.Logger.With("component", "memnet"),
		hosts:    map[mesh.PeerID]*Host{},
		addrs:    map[mesh.PeerID]string{},
		conns:    map[mesh.PeerID]map[mesh.PeerID]*conn{},
		group:    map[mesh.PeerID]int{},
		isolated: map[mesh.PeerID]bool{},
		drop:     map[link]float64{},
		opened:   map[link]uint64{},
	}
}

// NewKey makes an Ed25519 key drawn from the seed: the n-th key a Network
// makes is the same for the same seed. It is for simulations only: anyone
// who knows the seed knows the key.
func (n *Network) NewKey() ed25519.PrivateKey {
	n.mu.Lock()
	n.keys++
	k := n.keys
	n.mu.Unlock()
	r := n.draw("key", "", "", "", k)
	seed := make([]byte, 0, ed25519.SeedSize)
	for len(seed) < ed25519.SeedSize {
		seed = binary.LittleEndian.AppendUint64(seed, r.Uint64())
	}
	return ed25519.NewKeyFromSeed(seed)
}

// NewHost makes a host and starts it. Its id is its key's (HostOptions.Key),
// else HostOptions.ID, else that of a key the Network makes; no other
// running host may have it. A host of an id that ran before (and was
// closed or crashed) gets the same address again, as a device restarted
// on its data directory, unless HostOptions.NewAddr.
func (n *Network) NewHost(o HostOptions) (*Host, error) {
	key, id := o.Key, o.ID
	switch {
	case key != nil:
		if len(key) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("%w: a key of %d bytes, not an Ed25519 private key", ErrBadPeer, len(key))
		}
		kid, err := IDFromKey(key.Public().(ed25519.PublicKey))
		if err != nil {
			return nil, err
		}
		if id != "" && id != kid {
			return nil, fmt.Errorf("%w: the key's id is %s, not %s", ErrBadPeer, kid, id)
		}
		id = kid
	case id == "":
		key = n.NewKey()
		var err error
		if id, err = IDFromKey(key.Public().(ed25519.PublicKey)); err != nil {
			return nil, err
		}
	default:
		if err := validID(id); err != nil {
			return nil, err
		}
	}
	gate := o.Gate
	if gate == nil {
		gate = openGate{}
	}

	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("%w: the network", ErrClosed)
	}
	if n.hosts[id] != nil {
		return nil, fmt.Errorf("%w: a host %s is running", ErrIDTaken, id)
	}
	prefix, ok := n.addrs[id]
	if !ok {
		i := len(n.addrs) + 1
		prefix = fmt.Sprintf("/ip4/10.%d.%d.%d/tcp/4001", i>>16&0xff, i>>8&0xff, i&0xff)
		n.addrs[id] = prefix
	}
	if o.NewAddr {
		n.ports++
		prefix = fmt.Sprintf("%s/tcp/%d", strings.TrimSuffix(prefix, "/tcp/4001"), 10000+n.ports)
	}
	h := newHost(n, id, key, prefix, gate, o.Open)
	n.hosts[id] = h
	if n.conns[id] == nil {
		n.conns[id] = map[mesh.PeerID]*conn{}
	}
	h.log.Debug("host started", "addr", h.addr)
	return h, nil
}

// Partition splits the network: hosts in different groups cannot reach
// each other, and hosts named in no group form one more group. It replaces
// the previous partition (isolations stay); a host named twice is in the
// last group that names it. Connections across the new cuts are closed at
// once: their streams reset, both ends notified.
func (n *Network) Partition(groups ...[]mesh.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = map[mesh.PeerID]int{}
	for i, g := range groups {
		for _, id := range g {
			n.group[id] = i + 1
		}
	}
	n.log.Info("partitioned", "groups", groups)
	n.cutUnreachableLocked("partitioned")
}

// Isolate cuts a host (running or not) off from every other until Heal:
// its connections are closed and none can be made.
func (n *Network) Isolate(id mesh.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.isolated[id] = true
	n.log.Info("isolated", "peer", id)
	n.cutUnreachableLocked("isolated")
}

// Heal ends every partition and isolation. Connections cut stay closed:
// hosts must dial again, as after a real outage.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = map[mesh.PeerID]int{}
	n.isolated = map[mesh.PeerID]bool{}
	n.log.Info("healed")
}

// Crash makes the running host of id vanish as under kill -9: its
// connections close (their streams reset, its peers notified), its
// handlers are never called again, it notifies nothing more, its topics
// and calls fail with ErrClosed. A new host may then be made with the
// same id or key. Crash returns an error wrapping ErrUnreachable if no
// host of id runs.
func (n *Network) Crash(id mesh.PeerID) error {
	n.mu.Lock()
	h := n.hosts[id]
	n.mu.Unlock()
	if h == nil || !n.stop(h, stateCrashed) {
		return fmt.Errorf("%w: no host %s is running", ErrUnreachable, id)
	}
	return nil
}

// SetDrop sets the probability that a gossip message from one host to
// another is lost (that direction only), clamped to [0, 1]; it replaces
// Options.Drop for that link.
func (n *Network) SetDrop(from, to mesh.PeerID, p float64) {
	if !(p > 0) {
		p = 0
	}
	p = min(p, 1)
	n.mu.Lock()
	n.drop[link{from, to}] = p
	n.mu.Unlock()
}

// Close closes every running host; no host can be made after it.
func (n *Network) Close() error {
	n.mu.Lock()
	n.closed = true
	hosts := make([]*Host, 0, len(n.hosts))
	for _, h := range n.hosts {
		hosts = append(hosts, h)
	}
	n.mu.Unlock()
	for _, h := range hosts {
		n.stop(h, stateClosed)
	}
	return nil
}

// Stats count what the network has carried since it was made.
type Stats struct {
	// Streams is how many streams were opened.
	Streams uint64
	// GossipSent counts gossip messages put on a link (one per hop),
	// GossipDropped those of them lost to Drop, GossipDelivered those
	// handed to a Topic (buffer space permitting).
	GossipSent, GossipDropped, GossipDelivered uint64
}

type stats struct {
	streams, sent, dropped, delivered atomic.Uint64
}

// Stats returns the counts so far.
func (n *Network) Stats() Stats {
	return Stats{
		Streams:         n.stats.streams.Load(),
		GossipSent:      n.stats.sent.Load(),
		GossipDropped:   n.stats.dropped.Load(),
		GossipDelivered: n.stats.delivered.Load(),
	}
}

// stop takes a running host off the network (Close or Crash): it reports
// false if the host was not running.
func (n *Network) stop(h *Host, how int32) bool {
	n.mu.Lock()
	if h.state.Load() != stateRunning {
		n.mu.Unlock()
		return false
	}
	h.state.Store(how)
	if n.hosts[h.id] == h {
		delete(n.hosts, h.id)
	}
	n.mu.Unlock()

	h.notif.close() // no callback after this, none in flight
	h.closeTopics()
	why := "closed"
	if how == stateCrashed {
		why = "crashed"
	}
	n.mu.Lock()
	for _, c := range n.conns[h.id] {
		n.cutLocked(c, fmt.Sprintf("%s %s", h.id, why))
	}
	n.mu.Unlock()
	if how == stateCrashed {
		h.log.Info("host crashed")
	} else {
		h.log.Debug("host closed")
	}
	return true
}

// reachableLocked reports whether a and b may be connected now.
func (n *Network) reachableLocked(a, b mesh.PeerID) error {
	switch {
	case n.isolated[a]:
		return fmt.Errorf("%w: %s is isolated", ErrPartitioned, a)
	case n.isolated[b]:
		return fmt.Errorf("%w: %s is isolated", ErrPartitioned, b)
	case n.group[a] != n.group[b]:
		return fmt.Errorf("%w: %s and %s are in different partitions", ErrPartitioned, a, b)
	}
	return nil
}

// route returns h's connection to p, or the running host p to dial; n.mu
// is held.
func (n *Network) routeLocked(h *Host, p mesh.PeerID) (*conn, *Host, error) {
	if h.state.Load() != stateRunning {
		return nil, nil, fmt.Errorf("%w: host %s", ErrClosed, h.id)
	}
	if c := n.conns[h.id][p]; c != nil {
		return c, nil, nil
	}
	if len(h.known[p]) == 0 {
		return nil, nil, fmt.Errorf("%w: %s knows no address of %s", ErrNoAddr, h.id, p)
	}
	t := n.hosts[p]
	if t == nil {
		return nil, nil, fmt.Errorf("%w: no host %s is running", ErrUnreachable, p)
	}
	if !h.known[p][t.prefix] {
		return nil, nil, fmt.Errorf("%w: %s does not listen at the addresses %s knows", ErrUnreachable, p, h.id)
	}
	if err := n.reachableLocked(h.id, p); err != nil {
		return nil, nil, err
	}
	return nil, t, nil
}

// connectLocked connects a and b, which are not connected, and notifies
// both; n.mu is held.
func (n *Network) connectLocked(a, b *Host) *conn {
	c := newConn(a, b)
	n.conns[a.id][b.id] = c
	n.conns[b.id][a.id] = c
	a.learnLocked(b.id, b.prefix) // as identify tells each its peer's listen address
	b.learnLocked(a.id, a.prefix)
	a.notif.push(b.id, true)
	b.notif.push(a.id, true)
	n.log.Debug("connected", "from", a.id, "to", b.id)
	return c
}

// cutLocked closes a connection: its streams reset, both ends notified;
// n.mu is held.
func (n *Network) cutLocked(c *conn, why string) {
	if n.conns[c.a.id][c.b.id] != c {
		return
	}
	delete(n.conns[c.a.id], c.b.id)
	delete(n.conns[c.b.id], c.a.id)
	c.a.notif.push(c.b.id, false)
	c.b.notif.push(c.a.id, false)
	n.log.Debug("connection closed", "a", c.a.id, "b", c.b.id, "why", why)
	c.close(fmt.Errorf("%w: the connection between %s and %s closed (%s)", ErrReset, c.a.id, c.b.id, why))
}

// cutUnreachableLocked closes the connections that the partitions and
// isolations no longer allow; n.mu is held.
func (n *Network) cutUnreachableLocked(why string) {
	var cut []*conn
	for a, peers := range n.conns {
		for b, c := range peers {
			if a < b && n.reachableLocked(a, b) != nil {
				cut = append(cut, c)
			}
		}
	}
	slices.SortFunc(cut, func(x, y *conn) int { return compareLinks(x, y) })
	for _, c := range cut {
		n.cutLocked(c, why)
	}
}

func compareLinks(x, y *conn) int {
	if x.a.id != y.a.id {
		return cmpID(x.a.id, y.a.id)
	}
	return cmpID(x.b.id, y.b.id)
}

func cmpID(a, b mesh.PeerID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// dropLocked is the probability of losing a gossip message on a link;
// n.mu is held.
func (n *Network) dropLocked(from, to mesh.PeerID) float64 {
	if p, ok := n.drop[link{from, to}]; ok {
		return p
	}
	return n.o.Drop
}

// draw returns the random source of one draw: a pure function of the seed
// and of what is drawn (kind, the link, a name and a number).
func (n *Network) draw(kind string, from, to mesh.PeerID, name string, k uint64) *rand.Rand {
	h := fnv.New64a()
	for _, s := range []string{kind, string(from), string(to), name} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(binary.LittleEndian.AppendUint64(nil, k))
	return rand.New(rand.NewPCG(splitmix(n.o.Seed), splitmix(h.Sum64()^n.o.Seed)))
}

// delay draws a delay: Latency plus a draw in [0, Jitter).
func (n *Network) delay(r *rand.Rand) time.Duration {
	d := n.o.Latency
	if n.o.Jitter > 0 {
		d += time.Duration(r.Int64N(int64(n.o.Jitter)))
	}
	return d
}

// splitmix is SplitMix64's finaliser: it spreads a seed's bits.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
