package memnet

import "errors"

// Sentinel errors. Errors from this package wrap one of them (check with
// errors.Is) and say what failed and why.
var (
	// ErrClosed: the Host was closed or crashed, or the Topic closed.
	ErrClosed = errors.New("memnet: closed")
	// ErrBlocked: this host's Gate blocks the peer.
	ErrBlocked = errors.New("memnet: peer blocked")
	// ErrRefused: the peer's Gate blocks this host, so it refused the
	// connection.
	ErrRefused = errors.New("memnet: connection refused")
	// ErrNotAdmitted: the peer is not admitted, and the protocol is not
	// one of the open ones.
	ErrNotAdmitted = errors.New("memnet: peer not admitted")
	// ErrBadAddr: an address does not end in /p2p/<id>, names this host,
	// or a set of addresses names more than one peer.
	ErrBadAddr = errors.New("memnet: bad address")
	// ErrNoAddr: a stream was asked of a peer this host has no address
	// of (never connected to it, never given its address).
	ErrNoAddr = errors.New("memnet: no address for peer")
	// ErrUnreachable: no host runs at the address or id (never made,
	// closed, crashed), or the connection was cut while the stream opened.
	ErrUnreachable = errors.New("memnet: peer unreachable")
	// ErrPartitioned: the peer is in another partition, or one of the two
	// is isolated.
	ErrPartitioned = errors.New("memnet: peer in another partition")
	// ErrNoProtocol: the peer does not handle the protocol.
	ErrNoProtocol = errors.New("memnet: protocol not supported")
	// ErrReset: the stream was reset, by either end or by its connection
	// closing.
	ErrReset = errors.New("memnet: stream reset")
	// ErrStreamClosed: a write after CloseWrite or Close, or a read after
	// Close.
	ErrStreamClosed = errors.New("memnet: stream closed")
	// ErrTooLarge: a gossip message is larger than Options.MaxMessage.
	ErrTooLarge = errors.New("memnet: gossip message too large")
	// ErrJoined: the topic is already joined on this Host.
	ErrJoined = errors.New("memnet: topic already joined")
	// ErrIDTaken: a running host has this id already.
	ErrIDTaken = errors.New("memnet: id taken")
	// ErrBadPeer: a peer id or key is not valid.
	ErrBadPeer = errors.New("memnet: bad peer id")
	// ErrOptions: the Options are invalid.
	ErrOptions = errors.New("memnet: invalid options")
)
