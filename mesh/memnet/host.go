package memnet

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Host states.
const (
	stateRunning int32 = iota
	stateClosed
	stateCrashed
)

// Host is a mesh.Host on a Network. Make it with Network.NewHost; Close
// it (or let Network.Crash kill it).
type Host struct {
	n      *Network
	id     mesh.PeerID
	key    ed25519.PrivateKey
	prefix string // the address without /p2p/<id>
	addr   string
	gate   mesh.Gate
	open   map[string]bool
	log    *slog.Logger
	notif  *notifier
	state  atomic.Int32 // changed under n.mu

	// known are the addresses (without /p2p/<id>) this host has of each
	// peer: given to Connect, or learnt connecting; guarded by n.mu.
	known map[mesh.PeerID]map[string]bool

	mu       sync.Mutex
	handlers map[string]mesh.StreamHandler
	topics   map[string]*topic
	seen     map[string]time.Time // gossip message ids: when first seen
	sweep    time.Time            // when to forget old ids next
}

var _ mesh.Host = (*Host)(nil)

func newHost(n *Network, id mesh.PeerID, key ed25519.PrivateKey, prefix string, gate mesh.Gate, open []string) *Host {
	h := &Host{
		n: n, id: id, key: key, prefix: prefix, addr: prefix + "/p2p/" + string(id), gate: gate,
		open:     make(map[string]bool, len(open)),
		log:      n.log.With("peer", id),
		notif:    newNotifier(),
		known:    map[mesh.PeerID]map[string]bool{},
		handlers: map[string]mesh.StreamHandler{},
		topics:   map[string]*topic{},
		seen:     map[string]time.Time{},
	}
	for _, p := range open {
		h.open[p] = true
	}
	return h
}

// ID is this host's peer id.
func (h *Host) ID() mesh.PeerID { return h.id }

// Key is the host's identity key, or nil for a host made from an ID only.
func (h *Host) Key() ed25519.PrivateKey { return h.key }

// Addrs is this host's one address: a multiaddr string ending in
// /p2p/<id>.
func (h *Host) Addrs() []string { return []string{h.addr} }

// learnLocked records an address of peer p; n.mu is held.
func (h *Host) learnLocked(p mesh.PeerID, prefix string) {
	if h.known[p] == nil {
		h.known[p] = map[string]bool{}
	}
	h.known[p][prefix] = true
}

func (h *Host) address() Addr { return Addr{ID: h.id, Addr: h.addr} }

func (h *Host) running() bool { return h.state.Load() == stateRunning }

// Connect connects to the peer that addrs name (all of them the same
// peer) and returns its id; this host keeps the addresses. An address may
// be just /p2p/<id> if this host already has one of the peer's. It fails
// if this host's Gate blocks the peer (ErrBlocked), the peer's blocks this
// host (ErrRefused), the peer does not run at any address this host has
// of it (ErrUnreachable), or a partition is between them (ErrPartitioned).
// Connecting to a connected peer does nothing.
func (h *Host) Connect(ctx context.Context, addrs []string) (mesh.PeerID, error) {
	if !h.running() {
		return "", fmt.Errorf("%w: host %s", ErrClosed, h.id)
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("%w: no address", ErrBadAddr)
	}
	var id mesh.PeerID
	prefixes := make([]string, 0, len(addrs))
	for _, a := range addrs {
		i := strings.LastIndex(a, "/p2p/")
		if i < 0 || validID(mesh.PeerID(a[i+5:])) != nil {
			return "", fmt.Errorf("%w: %q does not end in /p2p/<peer id>", ErrBadAddr, a)
		}
		if q := mesh.PeerID(a[i+5:]); id == "" {
			id = q
		} else if q != id {
			return "", fmt.Errorf("%w: the addresses name different peers (%s, %s); give the addresses of one peer", ErrBadAddr, id, q)
		}
		prefixes = append(prefixes, a[:i])
	}
	if id == h.id {
		return "", fmt.Errorf("%w: %s is this host's own address", ErrBadAddr, addrs[0])
	}
	if h.gate.Blocked(id) {
		return "", fmt.Errorf("%w: %s", ErrBlocked, id)
	}
	n := h.n
	n.mu.Lock()
	for _, p := range prefixes {
		if p != "" {
			h.learnLocked(id, p)
		}
	}
	n.mu.Unlock()
	if _, err := h.dial(ctx, id); err != nil {
		return "", fmt.Errorf("memnet: connect to %s: %w", id, err)
	}
	return id, nil
}

// dial returns the connection to p, making it if there is none.
func (h *Host) dial(ctx context.Context, p mesh.PeerID) (*conn, error) {
	n := h.n
	n.mu.Lock()
	c, t, err := n.routeLocked(h, p)
	n.mu.Unlock()
	if c != nil || err != nil {
		return c, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The peer's gater, outside the lock: a Gate may take its own.
	if t.gate.Blocked(h.id) {
		return nil, fmt.Errorf("%w: %s blocks %s", ErrRefused, p, h.id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c, t2, err := n.routeLocked(h, p)
	switch {
	case c != nil || err != nil:
		return c, err
	case t2 != t:
		return nil, fmt.Errorf("%w: %s restarted while dialled", ErrUnreachable, p)
	}
	return n.connectLocked(h, t), nil
}

// NewStream opens a stream of proto to p, connecting first if this host
// has p's address. The stream is a *Stream. A peer not admitted may only be asked for open
// protocols (ErrNotAdmitted), a blocked one for none (ErrBlocked). The
// stream is opened after the network's latency; if p's Gate does not let
// this host open proto, p resets the stream before its handler sees it,
// and the first read or write fails (as with libp2p, whose negotiation
// succeeds before the handler refuses).
func (h *Host) NewStream(ctx context.Context, p mesh.PeerID, proto string) (mesh.Stream, error) {
	if !h.running() {
		return nil, fmt.Errorf("%w: host %s", ErrClosed, h.id)
	}
	if p == h.id {
		return nil, fmt.Errorf("%w: a stream from %s to itself", ErrBadAddr, p)
	}
	if h.gate.Blocked(p) {
		return nil, fmt.Errorf("%w: %s", ErrBlocked, p)
	}
	if !h.open[proto] && !h.gate.Admitted(p) {
		return nil, fmt.Errorf("%w: %s may not be asked for %s", ErrNotAdmitted, p, proto)
	}
	c, err := h.dial(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("memnet: open %s to %s: %w", proto, p, err)
	}
	n := h.n
	n.mu.Lock()
	k := n.opened[link{h.id, p}]
	n.opened[link{h.id, p}] = k + 1
	n.mu.Unlock()
	if d := n.delay(n.draw("stream", h.id, p, proto, k)); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("memnet: open %s to %s: %w", proto, p, ctx.Err())
		case <-c.done:
			t.Stop()
			return nil, fmt.Errorf("memnet: open %s to %s: %w: the connection closed", proto, p, ErrUnreachable)
		}
	}
	remote := c.other(h)
	remote.mu.Lock()
	fn := remote.handlers[proto]
	remote.mu.Unlock()
	if fn == nil {
		return nil, fmt.Errorf("memnet: open %s to %s: %w", proto, p, ErrNoProtocol)
	}
	refuse := remote.gate.Blocked(h.id) || (!remote.open[proto] && !remote.gate.Admitted(h.id))
	local, rs := newStreamPair(c, proto, h.address(), remote.address(), n.o.StreamBuffer)
	if !c.open(local, remote, func() {
		if !refuse {
			go fn(rs)
		}
	}) {
		return nil, fmt.Errorf("memnet: open %s to %s: %w: the connection closed", proto, p, ErrUnreachable)
	}
	n.stats.streams.Add(1)
	if refuse {
		remote.log.Debug("stream refused: peer not admitted", "from", h.id, "proto", proto)
		rs.reset(fmt.Errorf("%w: %s refused %s from %s", ErrReset, p, proto, h.id))
	}
	return local, nil
}

// Handle serves proto with fn, each stream (a *Stream) on its own
// goroutine. Unless proto is open, a stream from a peer not admitted is
// reset before fn sees it; one from a blocked peer always is. A nil fn
// stops serving proto.
func (h *Host) Handle(proto string, fn mesh.StreamHandler) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if fn == nil {
		delete(h.handlers, proto)
		return
	}
	h.handlers[proto] = fn
}

// Connected lists the peers connected now, sorted.
func (h *Host) Connected() []mesh.PeerID {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if !h.running() {
		return nil
	}
	out := make([]mesh.PeerID, 0, len(h.n.conns[h.id]))
	for p := range h.n.conns[h.id] {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Disconnect closes the connection to p, if any: its streams reset, both
// ends are notified.
func (h *Host) Disconnect(p mesh.PeerID) error {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.conns[h.id][p]; c != nil {
		n.cutLocked(c, fmt.Sprintf("%s disconnected", h.id))
	}
	return nil
}

// Notify calls fn(p, true) when p connects and fn(p, false) when its
// connection closes. Calls come in order, from one goroutine of the
// Host's; fn sees the changes after Notify returns, and none after Close
// or Crash. fn must not block, nor call Close (Close waits for a call in
// flight).
func (h *Host) Notify(fn func(p mesh.PeerID, up bool)) { h.notif.add(fn) }

// Close takes the host off the network: its topics close, its
// connections close (their streams reset, its peers notified). Later
// calls do nothing.
func (h *Host) Close() error {
	h.n.stop(h, stateClosed)
	return nil
}
