package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	yamux "github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/clawmesh/clawmesh/mesh"
)

const (
	// userAgent is what identify tells peers this host runs.
	userAgent = "clawmesh"
	// mdnsService is the DNS-SD service name clawmesh nodes announce.
	mdnsService = "_clawmesh._udp"
	// knownDialTimeout bounds one dial of ConnectKnown and of mDNS.
	knownDialTimeout = 10 * time.Second
	// knownDialers bounds the dials ConnectKnown runs at once.
	knownDialers = 8
	// foundDialers bounds the dials mDNS discoveries run at once; more
	// discoveries while they run are dropped (mDNS repeats itself).
	foundDialers = 4
	// saveEvery is how often the peer cache is written if it changed.
	saveEvery = 30 * time.Second
)

// Host is a mesh.Host on go-libp2p. Create it with New; Close it.
type Host struct {
	log    *slog.Logger
	gate   mesh.Gate
	open   map[string]bool
	maxMsg int

	host  host.Host
	ref   atomic.Pointer[hostRef] // host, for callbacks libp2p may run during New
	ps    *pubsub.PubSub
	book  *peerBook
	notif *notifier
	mdns  mdns.Service

	cancel  context.CancelFunc // stops pubsub, dials and the saver
	wg      sync.WaitGroup     // dials and the saver
	dialSem chan struct{}      // mDNS dials in flight

	mu     sync.Mutex
	closed bool
	topics map[string]*topic
}

type hostRef struct{ host.Host }

var _ mesh.Host = (*Host)(nil)

// New starts a Host: it loads or creates the identity in o.DataDir,
// listens, starts gossip (and mDNS, NAT traversal as o asks) and loads the
// peer cache into the peerstore; ConnectKnown dials the cached peers. ctx
// bounds the start only; the Host runs until Close.
func New(ctx context.Context, o Options) (*Host, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	log := o.Logger.With("component", "p2p")

	key, id, err := LoadIdentity(o.DataDir)
	if err != nil {
		return nil, err
	}
	book, err := loadPeerBook(filepath.Join(o.DataDir, PeersFile))
	if err != nil {
		log.Warn("peer cache", "err", err)
	}

	h := &Host{
		log:     log.With("peer", id),
		gate:    o.Gate,
		open:    make(map[string]bool, len(o.Open)),
		maxMsg:  o.MaxMessage,
		book:    book,
		dialSem: make(chan struct{}, foundDialers),
		topics:  make(map[string]*topic),
	}
	for _, p := range o.Open {
		h.open[p] = true
	}

	rm, err := resourceManager(o.MaxConns, o.MaxMemory)
	if err != nil {
		return nil, fmt.Errorf("p2p: resource manager: %w", err)
	}
	cm, err := connManager(o.MaxConns)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("p2p: connection manager: %w", err)
	}
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.NoListenAddrs, // listen below, with a fallback per address
		libp2p.Transport(quic.NewTransport),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.ConnectionGater(&gater{gate: o.Gate, log: h.log}),
		libp2p.DisableMetrics(), // no process-wide Prometheus registry
		libp2p.UserAgent(userAgent),
	}
	if o.NAT {
		opts = append(opts,
			libp2p.NATPortMap(),
			libp2p.EnableNATService(),
			libp2p.EnableAutoNATv2(),
			libp2p.EnableHolePunching(),
			libp2p.EnableRelay(),
			libp2p.EnableRelayService(relayv2.WithACL(relayACL{gate: o.Gate})),
		)
		if len(o.Relays) > 0 {
			relays, err := relayInfos(o.Relays)
			if err != nil {
				rm.Close()
				cm.Close()
				return nil, err
			}
			opts = append(opts, libp2p.EnableAutoRelayWithStaticRelays(relays))
		} else {
			opts = append(opts, libp2p.EnableAutoRelayWithPeerSource(h.relayCandidates,
				autorelay.WithMinInterval(time.Minute)))
		}
	} else {
		opts = append(opts, libp2p.DisableRelay())
	}
	lh, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		cm.Close()
		return nil, fmt.Errorf("p2p: start libp2p: %w", err)
	}
	h.host = lh
	h.ref.Store(&hostRef{lh})

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancel = cancel
	fail := func(err error) (*Host, error) {
		cancel()
		if h.notif != nil {
			h.notif.close()
		}
		_ = lh.Close()
		return nil, err
	}

	if h.notif, err = newNotifier(lh.EventBus(), h.peerChanged); err != nil {
		return fail(fmt.Errorf("p2p: connection events: %w", err))
	}
	if err := h.listen(o.listenAddrs()); err != nil {
		return fail(err)
	}
	for _, info := range book.list() {
		if !h.gate.Blocked(meshID(info.ID)) && info.ID != lh.ID() {
			lh.Peerstore().AddAddrs(info.ID, info.Addrs, peerstore.AddressTTL)
		}
	}
	if h.ps, err = h.startGossip(runCtx); err != nil {
		return fail(fmt.Errorf("p2p: gossip: %w", err))
	}
	if o.MDNS {
		h.mdns = mdns.NewMdnsService(lh, mdnsService, foundFunc(func(info peer.AddrInfo) { h.dialFound(runCtx, info) }))
		if err := h.mdns.Start(); err != nil {
			return fail(fmt.Errorf("p2p: mdns: %w", err))
		}
	}
	h.wg.Add(1)
	go h.saveLoop(runCtx)

	h.log.Info("p2p host started", "addrs", h.Addrs(), "mdns", o.MDNS, "nat", o.NAT)
	return h, nil
}

// listen listens on each address, or on its fallback if it has one and
// the address is taken or fails. It fails if no address can be listened on.
func (h *Host) listen(addrs []listenAddr) error {
	var errs []error
	ok := 0
	for _, l := range addrs {
		var err error
		if l.fallback != "" && !portFree(l.addr) {
			err = fmt.Errorf("%s is taken", l.addr)
		} else {
			err = h.listenOn(l.addr)
		}
		if err != nil && l.fallback != "" {
			h.log.Debug("listen failed, trying a free port", "addr", l.addr, "err", err)
			err = h.listenOn(l.fallback)
		}
		if err != nil {
			if l.fallback == "" {
				h.log.Warn("cannot listen", "addr", l.addr, "err", err)
			} else {
				h.log.Debug("cannot listen", "addr", l.fallback, "err", err)
			}
			errs = append(errs, err)
			continue
		}
		ok++
	}
	if ok == 0 {
		return fmt.Errorf("%w: %w", ErrListen, errors.Join(errs...))
	}
	return nil
}

// portFree reports whether a plain socket can bind the address of a
// multiaddr (/ip4|ip6/.../tcp|udp/port/...). libp2p binds its TCP
// listeners with SO_REUSEPORT, so a second node on the same machine would
// share the first one's port (and the kernel would split incoming
// connections between them) instead of failing; a socket without
// SO_REUSEPORT cannot bind a port that anyone holds.
func portFree(s string) bool {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return false
	}
	ip, family := "", ""
	if v, err := a.ValueForProtocol(ma.P_IP4); err == nil {
		ip, family = v, "4"
	} else if v, err := a.ValueForProtocol(ma.P_IP6); err == nil {
		ip, family = v, "6"
	} else {
		return true // not an IP address: let libp2p decide
	}
	if port, err := a.ValueForProtocol(ma.P_TCP); err == nil {
		l, err := net.Listen("tcp"+family, net.JoinHostPort(ip, port))
		if err != nil {
			return false
		}
		_ = l.Close()
		return true
	}
	if port, err := a.ValueForProtocol(ma.P_UDP); err == nil {
		c, err := net.ListenPacket("udp"+family, net.JoinHostPort(ip, port))
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}
	return true
}

func (h *Host) listenOn(s string) error {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return err
	}
	return h.host.Network().Listen(a)
}

func relayInfos(relays []string) ([]peer.AddrInfo, error) {
	var mas []ma.Multiaddr
	for _, s := range relays {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("%w: relay %q: %v", ErrBadAddr, s, err)
		}
		mas = append(mas, a)
	}
	infos, err := peer.AddrInfosFromP2pAddrs(mas...)
	if err != nil {
		return nil, fmt.Errorf("%w: relays: %v", ErrBadAddr, err)
	}
	return infos, nil
}

// relayCandidates offers autorelay the admitted peers we are connected to:
// those that are publicly reachable run a relay service for the mesh.
func (h *Host) relayCandidates(_ context.Context, num int) <-chan peer.AddrInfo {
	num = max(0, min(num, 64))
	ch := make(chan peer.AddrInfo, num)
	defer close(ch)
	ref := h.ref.Load()
	if ref == nil {
		return ch
	}
	for _, p := range ref.Network().Peers() {
		if len(ch) == num {
			break
		}
		if id := meshID(p); h.gate.Admitted(id) && !h.gate.Blocked(id) {
			ch <- peer.AddrInfo{ID: p, Addrs: ref.Peerstore().Addrs(p)}
		}
	}
	return ch
}

// ID is this host's peer id.
func (h *Host) ID() mesh.PeerID { return meshID(h.host.ID()) }

// Addrs are this host's addresses, loopback and private ones included,
// each ending in /p2p/<id>.
func (h *Host) Addrs() []string {
	mas, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: h.host.ID(), Addrs: h.host.Addrs()})
	if err != nil {
		return nil
	}
	out := make([]string, len(mas))
	for i, a := range mas {
		out[i] = a.String()
	}
	return out
}

// Connect dials the peer that addrs name (all of them the same peer) and
// returns its id. An address may be just /p2p/<id> if the host already
// knows the peer's addresses.
func (h *Host) Connect(ctx context.Context, addrs []string) (mesh.PeerID, error) {
	if h.isClosed() {
		return "", ErrClosed
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("%w: no address", ErrBadAddr)
	}
	mas := make([]ma.Multiaddr, 0, len(addrs))
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return "", fmt.Errorf("%w: %q: %v", ErrBadAddr, s, err)
		}
		if _, id := peer.SplitAddr(a); id == "" {
			return "", fmt.Errorf("%w: %q does not end in /p2p/<peer id>", ErrBadAddr, s)
		}
		mas = append(mas, a)
	}
	infos, err := peer.AddrInfosFromP2pAddrs(mas...)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadAddr, err)
	}
	if len(infos) != 1 {
		ids := make([]string, len(infos))
		for i, info := range infos {
			ids[i] = info.ID.String()
		}
		return "", fmt.Errorf("%w: the addresses name %d different peers (%v); give the addresses of one peer", ErrBadAddr, len(infos), ids)
	}
	info := infos[0]
	id := meshID(info.ID)
	if info.ID == h.host.ID() {
		return "", fmt.Errorf("%w: %s is this host's own address", ErrBadAddr, addrs[0])
	}
	if h.gate.Blocked(id) {
		return "", fmt.Errorf("%w: %s", ErrBlocked, id)
	}
	if len(info.Addrs) > 0 {
		h.host.Peerstore().AddAddrs(info.ID, info.Addrs, peerstore.AddressTTL)
	} else {
		h.ensureAddrs(info.ID)
	}
	if err := h.host.Connect(ctx, info); err != nil {
		return "", fmt.Errorf("p2p: connect to %s: %w", id, err)
	}
	return id, nil
}

// ensureAddrs puts p's cached addresses back into the peerstore if it has
// forgotten them (it keeps those of a disconnected peer for a while only).
func (h *Host) ensureAddrs(p peer.ID) {
	if len(h.host.Peerstore().Addrs(p)) > 0 {
		return
	}
	if addrs := h.book.addrs(p); len(addrs) > 0 {
		h.host.Peerstore().AddAddrs(p, addrs, peerstore.AddressTTL)
	}
}

// ConnectKnown dials every peer of the peer cache that is not connected
// (at most 8 at once, each for at most 10 s) and returns how many of the
// cached peers are connected afterwards. Blocked peers are skipped.
func (h *Host) ConnectKnown(ctx context.Context) int {
	if h.isClosed() {
		return 0
	}
	var (
		n   atomic.Int64
		wg  sync.WaitGroup
		sem = make(chan struct{}, knownDialers)
	)
loop:
	for _, info := range h.book.list() {
		if info.ID == h.host.ID() || h.gate.Blocked(meshID(info.ID)) {
			continue
		}
		if h.host.Network().Connectedness(info.ID) == network.Connected {
			n.Add(1)
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, knownDialTimeout)
			defer cancel()
			h.host.Peerstore().AddAddrs(info.ID, info.Addrs, peerstore.AddressTTL)
			if err := h.host.Connect(dctx, info); err != nil {
				h.log.Debug("known peer unreachable", "to", info.ID, "err", err)
				return
			}
			n.Add(1)
		}()
	}
	wg.Wait()
	return int(n.Load())
}

// NewStream opens a stream of proto to p, dialling p if needed at the
// addresses the host knows. A peer that is not admitted may only be asked
// for open protocols (ErrNotAdmitted); a blocked one for none (ErrBlocked).
func (h *Host) NewStream(ctx context.Context, p mesh.PeerID, proto string) (mesh.Stream, error) {
	if h.isClosed() {
		return nil, ErrClosed
	}
	id, err := libp2pID(p)
	if err != nil {
		return nil, err
	}
	if h.gate.Blocked(p) && !(h.open[proto] && mayTell(h.gate, p)) {
		return nil, fmt.Errorf("%w: %s", ErrBlocked, p)
	}
	if !h.open[proto] && !h.gate.Admitted(p) {
		return nil, fmt.Errorf("%w: %s may not be asked for %s", ErrNotAdmitted, p, proto)
	}
	h.ensureAddrs(id)
	s, err := h.host.NewStream(ctx, id, protocol.ID(proto))
	if err != nil {
		return nil, fmt.Errorf("p2p: open %s to %s: %w", proto, p, err)
	}
	return stream{s}, nil
}

// Handle serves proto with fn. Unless proto is open, a stream from a peer
// that is not admitted is reset before fn sees it; a stream from a blocked
// peer (blocked while connected) always is. A nil fn stops serving proto.
func (h *Host) Handle(proto string, fn mesh.StreamHandler) {
	pid := protocol.ID(proto)
	if fn == nil {
		h.host.RemoveStreamHandler(pid)
		return
	}
	open := h.open[proto]
	h.host.SetStreamHandler(pid, func(s network.Stream) {
		remote := meshID(s.Conn().RemotePeer())
		if h.gate.Blocked(remote) && !(open && mayTell(h.gate, remote)) || (!open && !h.gate.Admitted(remote)) {
			h.log.Debug("stream refused: peer not admitted", "from", remote, "proto", proto)
			_ = s.Reset()
			return
		}
		fn(stream{s})
	})
}

// Connected lists the peers connected now.
func (h *Host) Connected() []mesh.PeerID {
	peers := h.host.Network().Peers()
	out := make([]mesh.PeerID, len(peers))
	for i, p := range peers {
		out[i] = meshID(p)
	}
	return out
}

// Disconnect closes every connection to p.
func (h *Host) Disconnect(p mesh.PeerID) error {
	id, err := libp2pID(p)
	if err != nil {
		return err
	}
	if err := h.host.Network().ClosePeer(id); err != nil {
		return fmt.Errorf("p2p: disconnect %s: %w", p, err)
	}
	return nil
}

// Notify calls fn(p, true) when p's first connection opens and fn(p,
// false) when its last one closes (relayed, limited connections count).
// Calls come in order, from one goroutine, never from libp2p's own; fn
// sees only changes after Notify returns, and none after Close. fn must
// not call Close (Close waits for a call in flight).
func (h *Host) Notify(fn func(p mesh.PeerID, up bool)) {
	h.notif.add(fn)
}

// peerChanged keeps the peer cache: runs before the Notify callbacks.
func (h *Host) peerChanged(p peer.ID, up bool) {
	if h.gate.Blocked(meshID(p)) {
		h.book.forget(p)
		return
	}
	if up {
		h.book.seen(p)
		return
	}
	h.book.setAddrs(p, h.host.Peerstore().Addrs(p))
}

// saveLoop writes the peer cache every saveEvery if it changed.
func (h *Host) saveLoop(ctx context.Context) {
	defer h.wg.Done()
	t := time.NewTicker(saveEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			h.savePeers()
		case <-ctx.Done():
			return
		}
	}
}

// savePeers refreshes the addresses of the connected peers and writes the
// peer cache if it changed.
func (h *Host) savePeers() {
	for _, p := range h.host.Network().Peers() {
		h.book.setAddrs(p, h.host.Peerstore().Addrs(p))
	}
	blocked := func(p peer.ID) bool { return h.gate.Blocked(meshID(p)) }
	admitted := func(p peer.ID) bool { return h.gate.Admitted(meshID(p)) }
	if err := h.book.save(blocked, admitted); err != nil {
		h.log.Warn("cannot save the peer cache", "err", err)
	}
}

// foundFunc is an mdns.Notifee.
type foundFunc func(peer.AddrInfo)

func (f foundFunc) HandlePeerFound(info peer.AddrInfo) { f(info) }

// dialFound dials a peer mDNS found, unless it is known to be blocked or
// connected, or foundDialers dials are already running.
func (h *Host) dialFound(ctx context.Context, info peer.AddrInfo) {
	if info.ID == h.host.ID() || h.gate.Blocked(meshID(info.ID)) ||
		h.host.Network().Connectedness(info.ID) == network.Connected {
		return
	}
	select {
	case h.dialSem <- struct{}{}:
	default:
		return // busy; mDNS will announce it again
	}
	if !h.track() {
		<-h.dialSem
		return
	}
	go func() {
		defer h.wg.Done()
		defer func() { <-h.dialSem }()
		dctx, cancel := context.WithTimeout(ctx, knownDialTimeout)
		defer cancel()
		if err := h.host.Connect(dctx, info); err != nil {
			h.log.Debug("mdns: peer found but unreachable", "peer", info.ID, "err", err)
			return
		}
		h.log.Debug("mdns: connected", "peer", info.ID)
	}()
}

// track registers a goroutine with the Host's wait group, unless the Host
// is closing.
func (h *Host) track() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.wg.Add(1)
	return true
}

func (h *Host) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// Close stops mDNS, leaves the topics, stops gossip, saves the peer cache
// and closes the libp2p host. Later calls do nothing.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	topics := make([]*topic, 0, len(h.topics))
	for _, t := range h.topics {
		topics = append(topics, t)
	}
	h.mu.Unlock()

	var errs []error
	if h.mdns != nil {
		if err := h.mdns.Close(); err != nil {
			errs = append(errs, fmt.Errorf("mdns: %w", err))
		}
	}
	for _, t := range topics {
		_ = t.Close()
	}
	h.cancel()
	h.wg.Wait()
	h.savePeers()
	if err := h.host.Close(); err != nil {
		errs = append(errs, err)
	}
	h.notif.close()
	h.log.Info("p2p host closed")
	if len(errs) > 0 {
		return fmt.Errorf("p2p: close: %w", errors.Join(errs...))
	}
	return nil
}

// stream is a libp2p stream as a mesh.Stream.
type stream struct{ network.Stream }

func (s stream) RemotePeer() mesh.PeerID { return meshID(s.Conn().RemotePeer()) }

// Read marks a read cut by the peer's clean close of the connection
// (network.ConnNoError from the remote end) with mesh.ErrPeerLeft.
func (s stream) Read(b []byte) (int, error) {
	n, err := s.Stream.Read(b)
	var ce *network.ConnError
	if err != nil && errors.As(err, &ce) && ce.Remote && ce.ErrorCode == network.ConnNoError {
		err = fmt.Errorf("%w: %w", mesh.ErrPeerLeft, err)
	}
	return n, err
}
