package raftnet

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/mesh"
)

// only admits the peers given.
func only(peers ...mesh.PeerID) func(mesh.PeerID) bool {
	return func(p mesh.PeerID) bool {
		for _, q := range peers {
			if p == q {
				return true
			}
		}
		return false
	}
}

func TestDialAccept(t *testing.T) {
	a, b := newHost(t, nil), newHost(t, nil)
	connectAll(t, a, b)
	la, lb := New(a, nil), New(b, nil)
	t.Cleanup(func() { _ = la.Close(); _ = lb.Close() })

	if got := la.Addr(); got.Network() != "clawmesh" || got.String() != string(a.ID()) {
		t.Fatalf("Addr = %s %s, want clawmesh %s", got.Network(), got, a.ID())
	}

	c, err := lb.Dial(raft.ServerAddress(a.ID()), waitFor)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	if c.LocalAddr() != Addr(b.ID()) || c.RemoteAddr() != Addr(a.ID()) {
		t.Fatalf("dialled conn: local %s remote %s, want %s %s", c.LocalAddr(), c.RemoteAddr(), b.ID(), a.ID())
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatalf("Write: %v", err)
	}

	s := acceptWithin(t, la)
	defer s.Close()
	if s.LocalAddr() != Addr(a.ID()) || s.RemoteAddr() != Addr(b.ID()) {
		t.Fatalf("accepted conn: local %s remote %s, want %s %s", s.LocalAddr(), s.RemoteAddr(), a.ID(), b.ID())
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("accepted conn read %q, %v", buf, err)
	}
	if _, err := s.Write([]byte("pong")); err != nil {
		t.Fatalf("Write back: %v", err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("dialled conn read %q, %v", buf, err)
	}

	// Closing one end ends the other's reads.
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n, err := c.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the peer closed: %d, %v, want io.EOF", n, err)
	}
}

// A stream from a peer allow refuses is reset before Accept returns it,
// and Dial refuses such a peer itself.
func TestRefusedPeer(t *testing.T) {
	a, member, outsider := newHost(t, nil), newHost(t, nil), newHost(t, nil)
	connectAll(t, a, member, outsider)
	la := New(a, only(member.ID()))
	lm := New(member, nil)
	lo := New(outsider, nil) // the outsider would admit anyone
	t.Cleanup(func() { _ = la.Close(); _ = lm.Close(); _ = lo.Close() })

	refused(t, func() (net.Conn, error) { return lo.Dial(raft.ServerAddress(a.ID()), waitFor) })

	if _, err := la.Dial(raft.ServerAddress(outsider.ID()), waitFor); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("Dial to the outsider: %v, want ErrNotAllowed", err)
	}

	// The member's stream, opened after the outsider's was refused, is the
	// first Accept returns.
	mc, err := lm.Dial(raft.ServerAddress(a.ID()), waitFor)
	if err != nil {
		t.Fatalf("member's Dial: %v", err)
	}
	defer mc.Close()
	if _, err := mc.Write([]byte("hi")); err != nil {
		t.Fatalf("Write: %v", err)
	}
	s := acceptWithin(t, la)
	defer s.Close()
	if s.RemoteAddr() != Addr(member.ID()) {
		t.Fatalf("accepted a stream from %s, want the member %s", s.RemoteAddr(), member.ID())
	}
}

func TestCloseUnblocksAccept(t *testing.T) {
	a, b := newHost(t, nil), newHost(t, nil)
	connectAll(t, a, b)
	la, lb := New(a, nil), New(b, nil)
	t.Cleanup(func() { _ = lb.Close() })

	errs := make(chan error, 1)
	go func() {
		_, err := la.Accept()
		errs <- err
	}()
	if err := la.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var err error
	eventually(t, "Accept returns", func() bool {
		select {
		case err = <-errs:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if err := la.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := la.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed Layer: %v, want net.ErrClosed", err)
	}
	if _, err := la.Dial(raft.ServerAddress(b.ID()), waitFor); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Dial on a closed Layer: %v, want net.ErrClosed", err)
	}

	// A stream that arrives after Close is reset.
	refused(t, func() (net.Conn, error) { return lb.Dial(raft.ServerAddress(a.ID()), waitFor) })
}

// Streams beyond the backlog are reset, not queued, and do not block the
// host; the queued ones are still accepted.
func TestBacklogFull(t *testing.T) {
	a, b := newHost(t, nil), newHost(t, nil)
	connectAll(t, a, b)
	const backlog = 2
	la, lb := newLayer(a, nil, backlog), New(b, nil)
	t.Cleanup(func() { _ = la.Close(); _ = lb.Close() })

	var queued []net.Conn
	for range backlog {
		c, err := lb.Dial(raft.ServerAddress(a.ID()), waitFor)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("Write: %v", err)
		}
		queued = append(queued, c)
	}
	eventually(t, "the backlog fills", func() bool { return len(la.queue) == backlog })

	refused(t, func() (net.Conn, error) { return lb.Dial(raft.ServerAddress(a.ID()), waitFor) })

	for range queued {
		s := acceptWithin(t, la)
		_ = s.Close()
	}

	// Close resets what is still queued.
	c2, err := lb.Dial(raft.ServerAddress(a.ID()), waitFor)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c2.Close()
	if _, err := c2.Write([]byte("x")); err != nil {
		t.Fatalf("Write: %v", err)
	}
	eventually(t, "a stream is queued", func() bool { return len(la.queue) == 1 })
	if err := la.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	refused(t, func() (net.Conn, error) { return c2, nil })
}
