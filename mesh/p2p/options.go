package p2p

import (
	"fmt"
	"log/slog"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/clawmesh/clawmesh/mesh"
)

// Defaults for the zero values of Options.
const (
	// DefaultPort is the port the Host listens on (UDP for QUIC, TCP)
	// when Options.Listen is empty; if it is taken, a free port is used.
	DefaultPort = 4001
	// DefaultMaxMessage bounds one gossip message. Gossip carries batch
	// announcements (small manifests); the batches themselves travel over
	// streams.
	DefaultMaxMessage = 64 << 10
	// DefaultMaxConns is the connection limit of the resource manager: a
	// personal device keeps a few dozen mesh peers, and a trainer perhaps a
	// hundred.
	DefaultMaxConns = 128
	// DefaultMaxMemory is the memory the libp2p stack may reserve (stream
	// buffers, mostly): small enough for a Raspberry Pi or a phone-sized
	// device. Bulk transfers (adapter weights) use their own QUIC service.
	DefaultMaxMemory = 64 << 20

	// maxMaxMessage is the largest MaxMessage accepted: gossip is for
	// announcements, and every peer buffers what it relays.
	maxMaxMessage = 4 << 20
	// minMaxConns and minMaxMemory are the smallest limits that still let
	// libp2p's own services (identify, ping, gossip) work.
	minMaxConns  = 8
	minMaxMemory = 16 << 20
)

// listenAddr is an address to listen on, and the one to try instead if it
// cannot be listened on ("" for none).
type listenAddr struct{ addr, fallback string }

// listenAddrs are the addresses o asks to listen on.
func (o *Options) listenAddrs() []listenAddr {
	if len(o.Listen) > 0 {
		l := make([]listenAddr, len(o.Listen))
		for i, a := range o.Listen {
			l[i] = listenAddr{addr: a}
		}
		return l
	}
	var l []listenAddr
	for _, ip := range []string{"/ip4/0.0.0.0", "/ip6/::"} {
		for _, f := range []string{"/udp/%d/quic-v1", "/tcp/%d"} {
			l = append(l, listenAddr{
				addr:     ip + fmt.Sprintf(f, DefaultPort),
				fallback: ip + fmt.Sprintf(f, 0),
			})
		}
	}
	return l
}

// Options configure a Host. The zero value of every field but DataDir and
// Gate means its default.
type Options struct {
	// DataDir holds the identity (DataDir/identity.key: the libp2p
	// Ed25519 private key, created 0600 on first start, reused after) and
	// the peer cache (DataDir/peers.json: addresses of peers seen, reloaded
	// at start so a restarted node finds its mesh without the bootstrap).
	// Required; created 0700 if missing.
	DataDir string
	// Listen are multiaddrs to listen on. Default: QUIC and TCP on all
	// interfaces, IPv4 and IPv6, at port 4001, each falling back to a free
	// port if 4001 is taken. Addresses given here get no fallback; New
	// fails only if none of them can be listened on.
	Listen []string
	// Gate decides admission (see mesh.Gate). Required.
	Gate mesh.Gate
	// Open are the protocols any connected peer may open (redeeming an
	// invite, exchanging certificates); every other protocol is for
	// admitted peers only.
	Open []string
	// MDNS turns on local-network discovery: peers found are dialled, and
	// the Gate still decides.
	MDNS bool
	// NAT turns on NAT traversal: UPnP/NAT-PMP port mapping, the AutoNAT
	// service for others and AutoNAT v2 for ourselves, hole punching, the
	// relay client, and a relay service for admitted peers (libp2p runs it
	// only while this host is publicly reachable). Relay candidates are
	// Relays if given, else the admitted peers we are connected to.
	NAT bool
	// Relays are static relays (multiaddrs ending in /p2p/<id>), used only
	// when NAT is on.
	Relays []string
	// MaxMessage bounds one gossip message's data (default
	// DefaultMaxMessage, at most 4 MiB).
	MaxMessage int
	// MaxConns bounds connections (default DefaultMaxConns, at least 8).
	// The connection manager trims idle connections above 3/4 of it,
	// down to 1/2.
	MaxConns int
	// MaxMemory bounds the memory the libp2p stack reserves (default
	// DefaultMaxMemory, at least 16 MiB).
	MaxMemory int64
	// Logger receives the Host's logs; default: none.
	Logger *slog.Logger
}

// Validate reports the first invalid field, wrapping ErrOptions.
func (o *Options) Validate() error {
	if o.DataDir == "" {
		return fmt.Errorf("%w: DataDir is required", ErrOptions)
	}
	if o.Gate == nil {
		return fmt.Errorf("%w: Gate is required", ErrOptions)
	}
	for _, s := range o.Listen {
		if _, err := ma.NewMultiaddr(s); err != nil {
			return fmt.Errorf("%w: listen address %q: %v", ErrOptions, s, err)
		}
	}
	for _, p := range o.Open {
		if p == "" {
			return fmt.Errorf("%w: empty protocol in Open", ErrOptions)
		}
	}
	for _, s := range o.Relays {
		m, err := ma.NewMultiaddr(s)
		if err != nil {
			return fmt.Errorf("%w: relay address %q: %v", ErrOptions, s, err)
		}
		if _, err := peer.AddrInfoFromP2pAddr(m); err != nil {
			return fmt.Errorf("%w: relay address %q must end in /p2p/<id>", ErrOptions, s)
		}
	}
	switch {
	case o.MaxMessage < 0 || o.MaxMessage > maxMaxMessage:
		return fmt.Errorf("%w: MaxMessage %d is outside 0 (default) to %d", ErrOptions, o.MaxMessage, maxMaxMessage)
	case o.MaxConns < 0 || (o.MaxConns > 0 && o.MaxConns < minMaxConns):
		return fmt.Errorf("%w: MaxConns %d: use 0 (default) or at least %d", ErrOptions, o.MaxConns, minMaxConns)
	case o.MaxMemory < 0 || (o.MaxMemory > 0 && o.MaxMemory < minMaxMemory):
		return fmt.Errorf("%w: MaxMemory %d: use 0 (default) or at least %d", ErrOptions, o.MaxMemory, minMaxMemory)
	}
	return nil
}

// withDefaults returns o with its zero values replaced by the defaults.
func (o Options) withDefaults() Options {
	if o.MaxMessage == 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxMemory == 0 {
		o.MaxMemory = DefaultMaxMemory
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}
