// Package raftnet carries hashicorp/raft's network transport over the
// mesh's streams. A Layer is a raft.StreamLayer written against mesh.Host
// only, so the same raft code runs on the libp2p host (mesh/p2p) and on a
// simulated one: each raft connection is one stream of Protocol, a raft
// ServerAddress is the peer id of the server's host, and an allow function
// decides which peers may take part (the trainer admits only peers holding
// a trainer-role certificate of its mesh). NewTransport builds raft's own
// NetworkTransport on a Layer, and HCLog sends raft's logs to a
// *slog.Logger.
//
// The Layer adds nothing to the stream: no handshake, no framing. A peer
// refused at the other end sees its stream reset, in Dial if the host
// negotiates the protocol before NewStream returns, else at its first read,
// as with a TCP connection the other end resets; raft treats it as any
// failed RPC. A handshake would cost a round trip on every new connection
// to report what the dialler's own allow function already knows in the
// common case (both ends hold the same membership).
package raftnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/mesh"
)

// Protocol is the stream protocol that carries raft's connections.
const Protocol = "/clawmesh/raft/1"

// AcceptBacklog bounds the streams that have arrived and that raft has not
// accepted yet. raft accepts in a loop that does nothing else, so the queue
// only fills when raft has stopped accepting or a peer floods us; a stream
// that finds it full is reset rather than blocking the host's handler.
const AcceptBacklog = 64

// ErrNotAllowed is returned by Dial for a peer the Layer's allow function
// refuses.
var ErrNotAllowed = errors.New("raftnet: peer not allowed")

// Layer is a raft.StreamLayer over a mesh.Host's streams of Protocol. Its
// addresses are peer ids: Addr is the host's own, and Dial takes the peer
// id of the server to reach.
type Layer struct {
	host  mesh.Host
	allow func(mesh.PeerID) bool
	addr  Addr

	queue chan *conn
	done  chan struct{} // closed by Close

	mu     sync.Mutex // orders enqueueing against Close
	closed bool
}

var _ raft.StreamLayer = (*Layer)(nil)

// New serves Protocol on h and returns the Layer that hands its streams to
// raft. allow decides which peers may take part, in both directions: a
// stream from a peer it refuses is reset before raft sees it, and Dial to
// such a peer fails with ErrNotAllowed. A nil allow admits every peer the
// host lets open the protocol. allow is called on the host's handler
// goroutines and must not block.
//
// The handler stays registered after Close (mesh.Host has no way to remove
// one) and resets every stream that arrives, until a later New on the same
// host replaces it.
func New(h mesh.Host, allow func(mesh.PeerID) bool) *Layer {
	return newLayer(h, allow, AcceptBacklog)
}

func newLayer(h mesh.Host, allow func(mesh.PeerID) bool, backlog int) *Layer {
	if allow == nil {
		allow = func(mesh.PeerID) bool { return true }
	}
	l := &Layer{
		host:  h,
		allow: allow,
		addr:  Addr(h.ID()),
		queue: make(chan *conn, backlog),
		done:  make(chan struct{}),
	}
	h.Handle(Protocol, l.handle)
	return l
}

// handle takes a stream a peer opened: it queues it for Accept, or resets it
// if the peer is refused, the Layer is closed or the queue is full. It never
// blocks.
func (l *Layer) handle(s mesh.Stream) {
	if !l.allow(s.RemotePeer()) {
		_ = s.Reset()
		return
	}
	c := newConn(s, l.addr, l.done)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = s.Reset()
		return
	}
	select {
	case l.queue <- c:
	default:
		_ = s.Reset()
	}
}

// Accept waits for the next stream a peer opened and returns it as a
// net.Conn whose RemoteAddr is the peer's Addr. After Close it returns an
// error wrapping net.ErrClosed.
func (l *Layer) Accept() (net.Conn, error) {
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("raftnet: accept: %w", net.ErrClosed)
	}
}

// Close stops accepting: Accept returns an error, streams waiting to be
// accepted and streams that arrive later are reset. Connections already
// accepted or dialled are left to their owners, as net.Listener's Close
// does. Later calls do nothing.
func (l *Layer) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.done)
	for {
		select {
		case c := <-l.queue:
			_ = c.s.Reset()
		default:
			return nil
		}
	}
}

// Addr is the host's peer id, the ServerAddress other servers reach this
// one at.
func (l *Layer) Addr() net.Addr { return l.addr }

// Dial opens a stream of Protocol to the peer whose id is address. timeout
// bounds opening the stream (connecting to the peer if needed); zero means
// no bound. Dial fails with ErrNotAllowed for a peer allow refuses, and
// with an error wrapping net.ErrClosed once the Layer is closed, which also
// cancels dials in progress.
func (l *Layer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	p := mesh.PeerID(address)
	if p == "" {
		return nil, errors.New("raftnet: dial: empty address")
	}
	select {
	case <-l.done:
		return nil, fmt.Errorf("raftnet: dial %s: %w", p, net.ErrClosed)
	default:
	}
	if !l.allow(p) {
		return nil, fmt.Errorf("%w: %s", ErrNotAllowed, p)
	}

	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), timeout)
	} else {
		ctx, cancel = context.WithCancel(context.Background())
	}
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()

	s, err := l.host.NewStream(ctx, p, Protocol)
	if err != nil {
		select {
		case <-l.done:
			return nil, fmt.Errorf("raftnet: dial %s: %w", p, net.ErrClosed)
		default:
		}
		return nil, fmt.Errorf("raftnet: dial %s: %w", p, err)
	}
	return newConn(s, l.addr, l.done), nil
}
