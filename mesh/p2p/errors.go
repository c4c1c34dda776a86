package p2p

import "errors"

// Sentinel errors. Errors from this package wrap one of them (check with
// errors.Is) and say what was refused and why.
var (
	// ErrNotAdmitted: the peer is not admitted to the mesh, and the protocol
	// is not one of the open ones.
	ErrNotAdmitted = errors.New("p2p: peer not admitted")
	// ErrBlocked: the Gate blocks the peer; no connection is made.
	ErrBlocked = errors.New("p2p: peer blocked")
	// ErrIdentity: the identity file cannot be read, is damaged, or holds
	// a key that is not Ed25519. It is never replaced silently: replacing
	// it changes the device's peer id and loses its mesh membership.
	ErrIdentity = errors.New("p2p: identity")
	// ErrBadAddr: a multiaddr does not parse, does not end in /p2p/<id>,
	// or a set of addresses names more than one peer.
	ErrBadAddr = errors.New("p2p: bad address")
	// ErrBadPeer: a peer id does not parse.
	ErrBadPeer = errors.New("p2p: bad peer id")
	// ErrTooLarge: a gossip message is larger than Options.MaxMessage.
	ErrTooLarge = errors.New("p2p: gossip message too large")
	// ErrClosed: the Host or the Topic is closed.
	ErrClosed = errors.New("p2p: closed")
	// ErrJoined: the topic is already joined on this Host.
	ErrJoined = errors.New("p2p: topic already joined")
	// ErrOptions: the Options are invalid.
	ErrOptions = errors.New("p2p: invalid options")
	// ErrListen: the Host could not listen on any of its addresses.
	ErrListen = errors.New("p2p: cannot listen")
)
