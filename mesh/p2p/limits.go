package p2p

import (
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
)

// resourceManager builds the libp2p resource manager for a small device.
//
// It starts from libp2p's default scaling limits with its default service
// limits (identify, ping, autonat, relay, hole punching), taken at their base
// figures: they are not scaled up with the machine's memory, because a node
// shares its device with an agent and an LLM. Then the system scope gets
// the figures of Options:
//
//   - connections: maxConns in all (default 128), inbound and outbound each
//     up to maxConns;
//   - streams: 16 per connection (2048 by default), inbound and outbound
//     each up to that;
//   - memory: maxMemory (default 64 MiB);
//   - file descriptors: libp2p's base, 256.
//
// The transient scope (connections and streams not yet attached to a peer
// or protocol) gets a quarter of each. Per peer, libp2p's base figures
// apply (8 connections, 256 inbound and 512 outbound streams); per
// connection and per stream, its defaults.
func resourceManager(maxConns int, maxMemory int64) (network.ResourceManager, error) {
	scaling := rcmgr.DefaultLimits // a copy; its maps are nil, so nothing shared is changed
	libp2p.SetDefaultServiceLimits(&scaling)
	base := scaling.Scale(0, 0) // memory below 128 MiB: the base figures

	conns := rcmgr.LimitVal(maxConns)
	streams := rcmgr.LimitVal(16 * maxConns)
	partial := rcmgr.PartialLimitConfig{
		System: rcmgr.ResourceLimits{
			Conns:           conns,
			ConnsInbound:    conns,
			ConnsOutbound:   conns,
			Streams:         streams,
			StreamsInbound:  streams,
			StreamsOutbound: streams,
			Memory:          rcmgr.LimitVal64(maxMemory),
		},
		Transient: rcmgr.ResourceLimits{
			Conns:           max(conns/4, 2),
			ConnsInbound:    max(conns/4, 2),
			ConnsOutbound:   max(conns/4, 2),
			Streams:         streams / 4,
			StreamsInbound:  streams / 4,
			StreamsOutbound: streams / 4,
			Memory:          rcmgr.LimitVal64(maxMemory / 4),
		},
	}
	return rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(partial.Build(base)))
}

// connManager trims connections before the resource manager has to refuse
// them: above 3/4 of maxConns it closes the least useful ones (gossip mesh
// peers are protected by the router) down to 1/2, sparing those younger than
// a minute.
func connManager(maxConns int) (*connmgr.BasicConnMgr, error) {
	return connmgr.NewConnManager(maxConns/2, maxConns*3/4, connmgr.WithGracePeriod(time.Minute))
}
