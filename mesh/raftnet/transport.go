package raftnet

import (
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
)

// Defaults for the zero values of TransportOptions.
const (
	// DefaultMaxPool is the number of idle connections (streams) kept per
	// peer, as Consul and Nomad keep: raft uses one for the replication
	// pipeline and one or two for the RPCs beside it (votes, heartbeats
	// are on their own), and a stream on an open libp2p connection is
	// cheap to open again.
	DefaultMaxPool = 3
	// DefaultTimeout bounds opening a stream and each RPC's I/O (raft
	// scales it up for snapshots). It is raft's and Consul's usual figure:
	// long enough for a peer reached through a relay across a home
	// network, short enough that a vanished peer's RPC fails well within
	// a human's patience. Elections do not wait on it; they run on
	// raft.Config's own timeouts.
	DefaultTimeout = 10 * time.Second
)

// TransportOptions configure NewTransport. The zero value of every field
// means its default; a negative number does too.
type TransportOptions struct {
	// MaxPool is the number of idle connections kept per peer (default
	// DefaultMaxPool).
	MaxPool int
	// Timeout bounds opening a connection and each RPC's I/O (default
	// DefaultTimeout).
	Timeout time.Duration
	// MaxRPCsInFlight is raft's pipelining depth for AppendEntries
	// (default raft.DefaultMaxRPCsInFlight, 2; 1 turns pipelining off).
	MaxRPCsInFlight int
	// Logger receives the transport's logs, with component=raftnet;
	// default: none.
	Logger *slog.Logger
}

// NewTransport returns raft's NetworkTransport over l. The transport owns
// l: closing the transport (raft.Raft's Shutdown does) closes the Layer.
func NewTransport(l *Layer, o TransportOptions) *raft.NetworkTransport {
	if o.MaxPool <= 0 {
		o.MaxPool = DefaultMaxPool
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxRPCsInFlight < 0 {
		o.MaxRPCsInFlight = 0
	}
	var log *slog.Logger
	if o.Logger != nil {
		log = o.Logger.With("component", "raftnet")
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:          l,
		MaxPool:         o.MaxPool,
		Timeout:         o.Timeout,
		MaxRPCsInFlight: o.MaxRPCsInFlight,
		Logger:          HCLog(log),
	})
}
