package mesh

import (
	"context"
	"errors"
	"io"
	"time"
)

// PeerID names a peer: its libp2p peer id, as text.
type PeerID string

// ErrPeerLeft wraps a stream's read error when the peer closed the whole
// connection cleanly (it stopped its host, with no error code): the
// stream is cut, as on a reset, but the peer left rather than failed.
var ErrPeerLeft = errors.New("mesh: the peer closed the connection")

// Stream is one bidirectional stream of one protocol with a peer. A Read
// cut by the peer's clean close of the connection returns an error that
// wraps ErrPeerLeft.
type Stream interface {
	io.ReadWriteCloser
	// CloseWrite says we are done writing; the peer reads io.EOF.
	CloseWrite() error
	// Reset aborts the stream in both directions.
	Reset() error
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
	// RemotePeer is the peer at the other end, authenticated by the
	// transport's handshake.
	RemotePeer() PeerID
}

// StreamHandler serves a stream a peer opened. It owns the stream and must
// close or reset it.
type StreamHandler func(Stream)

// Gate is the admission policy a Host asks before it lets a peer in. The
// mesh implements it from certificates; Host implementations call it.
type Gate interface {
	// Blocked reports a peer that must not connect at all (revoked, or
	// refused admission lately): connections to and from it are refused
	// once its identity is known (but see Teller).
	Blocked(PeerID) bool
	// Admitted reports a peer whose certificate for this mesh was checked:
	// only admitted peers may open streams of protocols other than the
	// open ones (Config.Open), and only they send or receive gossip.
	Admitted(PeerID) bool
}

// Teller is a Gate that lets some of the peers it blocks connect in for a
// moment, to be told why they are refused: a revoked peer is shown its
// revocation. Such a peer may dial this host (it is not dialled), and only
// the open protocols serve it. A Host that finds the Gate is a Teller
// asks it; one that does not refuses blocked peers outright.
type Teller interface {
	MayTell(PeerID) bool
}

// Host is what the mesh's protocol code needs of a peer-to-peer host. The
// real one wraps go-libp2p (mesh/p2p); a simulated one can run the same
// protocol code over a virtual network.
type Host interface {
	// ID is this peer's id.
	ID() PeerID
	// Addrs are the addresses others can reach this peer at, as
	// multiaddrs ending in /p2p/<id>.
	Addrs() []string
	// Connect dials a peer at any of addrs (multiaddrs ending in
	// /p2p/<id>, all of the same peer) and returns its id.
	Connect(ctx context.Context, addrs []string) (PeerID, error)
	// NewStream opens a stream of protocol proto to a peer, connecting if
	// the host knows an address of it. A peer that is not admitted may
	// only be asked for open protocols.
	NewStream(ctx context.Context, p PeerID, proto string) (Stream, error)
	// Handle serves protocol proto. Streams from peers not admitted are
	// refused before the handler sees them, unless proto is open.
	Handle(proto string, h StreamHandler)
	// Connected lists the peers connected now.
	Connected() []PeerID
	// Disconnect closes every connection to p.
	Disconnect(p PeerID) error
	// Notify calls fn whenever a peer connects (up true) or its last
	// connection closes (up false); fn must not block.
	Notify(fn func(p PeerID, up bool))
	// Join joins a gossip topic.
	Join(topic string) (Topic, error)
	Close() error
}

// Topic is a gossip topic. A message is signed by the peer that published
// it, its author, and is identified by its author and content; the data
// need not name anyone (an announcement does not name its device in its
// payload), but every peer that receives a message learns its author.
type Topic interface {
	// Publish sends data to the topic's admitted peers.
	Publish(ctx context.Context, data []byte) error
	// Next returns the next message from another peer, blocking until one
	// arrives or ctx is done.
	Next(ctx context.Context) (Message, error)
	Close() error
}

// Message is one gossip message.
type Message struct {
	Data []byte
	// From is the peer that forwarded it to us, not its author.
	From PeerID
	// Author is the peer that published it, authenticated by its
	// signature (mesh/p2p) or by the network itself (mesh/memnet).
	Author PeerID
}
