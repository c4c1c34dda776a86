package raftnet

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Network is the network name of an Addr.
const Network = "clawmesh"

// Addr is a peer's address as net.Addr: its peer id. It is also the raft
// ServerAddress of the raft server on that peer.
type Addr mesh.PeerID

var _ net.Addr = Addr("")

// Network is "clawmesh".
func (Addr) Network() string { return Network }

// String is the peer id.
func (a Addr) String() string { return string(a) }

// conn is a mesh.Stream as a net.Conn. Reads, writes and deadlines go to
// the stream; Close closes it once. A read that fails once this end has
// closed the conn or its Layer, or that the peer cut by closing its host
// cleanly (mesh.ErrPeerLeft), reads io.EOF: raft's transport logs every
// other read error as a failure, and a stream torn down by a clean stop,
// ours or the peer's, is none.
type conn struct {
	s             mesh.Stream
	local, remote Addr
	done          <-chan struct{} // the Layer's; nil for none

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ net.Conn = (*conn)(nil)

func newConn(s mesh.Stream, local Addr, done <-chan struct{}) *conn {
	return &conn{s: s, local: local, remote: Addr(s.RemotePeer()), done: done}
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.s.Read(b)
	if err != nil && err != io.EOF && (c.shutDown() || errors.Is(err, mesh.ErrPeerLeft)) {
		err = io.EOF
	}
	return n, err
}

// shutDown reports that this end closed the conn or its Layer.
func (c *conn) shutDown() bool {
	if c.closed.Load() {
		return true
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
func (c *conn) Write(b []byte) (int, error) { return c.s.Write(b) }

// Close closes the stream in both directions. Later calls return what the
// first returned.
func (c *conn) Close() error {
	c.closed.Store(true)
	c.closeOnce.Do(func() { c.closeErr = c.s.Close() })
	return c.closeErr
}

// LocalAddr is this host's peer id.
func (c *conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the peer id at the other end, as the host authenticated it.
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) SetDeadline(t time.Time) error      { return c.s.SetDeadline(t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.s.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.s.SetWriteDeadline(t) }
