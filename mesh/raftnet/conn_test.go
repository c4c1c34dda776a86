package raftnet

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// pipeStream is one end of a net.Pipe as a mesh.Stream, counting Closes.
type pipeStream struct {
	net.Conn
	peer   mesh.PeerID
	closes atomic.Int32
}

func (s *pipeStream) Close() error {
	s.closes.Add(1)
	return s.Conn.Close()
}
func (s *pipeStream) CloseWrite() error       { return errors.ErrUnsupported }
func (s *pipeStream) Reset() error            { return s.Conn.Close() }
func (s *pipeStream) RemotePeer() mesh.PeerID { return s.peer }

func pipeConns(t *testing.T) (*conn, *conn, *pipeStream) {
	t.Helper()
	x, y := net.Pipe()
	sx := &pipeStream{Conn: x, peer: "peer-y"}
	sy := &pipeStream{Conn: y, peer: "peer-x"}
	t.Cleanup(func() { _ = x.Close(); _ = y.Close() })
	return newConn(sx, "peer-x", nil), newConn(sy, "peer-y", nil), sx
}

func TestConnAddrs(t *testing.T) {
	cx, _, _ := pipeConns(t)
	for _, tc := range []struct {
		name string
		addr net.Addr
		want string
	}{
		{"local", cx.LocalAddr(), "peer-x"},
		{"remote", cx.RemoteAddr(), "peer-y"},
	} {
		if tc.addr.Network() != "clawmesh" || tc.addr.String() != tc.want {
			t.Errorf("%s addr = %s %s, want clawmesh %s", tc.name, tc.addr.Network(), tc.addr, tc.want)
		}
	}
}

func TestConnDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*conn, time.Time) error
		op   func(*conn) error
	}{
		{"read", (*conn).SetReadDeadline, func(c *conn) error { _, err := c.Read(make([]byte, 1)); return err }},
		{"write", (*conn).SetWriteDeadline, func(c *conn) error { _, err := c.Write([]byte("x")); return err }},
		{"both/read", (*conn).SetDeadline, func(c *conn) error { _, err := c.Read(make([]byte, 1)); return err }},
		{"both/write", (*conn).SetDeadline, func(c *conn) error { _, err := c.Write([]byte("x")); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Nobody reads or writes at the other end of the pipe, so the
			// operation blocks until its deadline.
			cx, _, _ := pipeConns(t)
			if err := tc.set(cx, time.Now().Add(-time.Second)); err != nil {
				t.Fatalf("set deadline: %v", err)
			}
			if err := tc.op(cx); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("past deadline: %v, want os.ErrDeadlineExceeded", err)
			}
			// Clearing it lets the operation through again.
			if err := tc.set(cx, time.Time{}); err != nil {
				t.Fatalf("clear deadline: %v", err)
			}
		})
	}
}

func TestConnClose(t *testing.T) {
	cx, cy, sx := pipeConns(t)
	done := make(chan error, 1)
	go func() {
		_, err := cy.Read(make([]byte, 1))
		done <- err
	}()
	if err := cx.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("the other end read %v, want io.EOF", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the other end's read did not end")
	}
	if err := cx.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := sx.closes.Load(); n != 1 {
		t.Fatalf("the stream was closed %d times, want once", n)
	}
	if _, err := cx.Write([]byte("x")); err == nil {
		t.Fatal("Write after Close succeeded")
	}
}

// TestConnShutdownReadsEOF: a read that fails because this end closed its
// Layer (the host then tearing the stream down) reads io.EOF, which raft's
// transport takes as a clean end; before the Layer closes, the failure is
// the stream's.
func TestConnShutdownReadsEOF(t *testing.T) {
	x, y := net.Pipe()
	t.Cleanup(func() { _ = x.Close(); _ = y.Close() })
	done := make(chan struct{})
	c := newConn(&pipeStream{Conn: x, peer: "peer-y"}, "peer-x", done)
	_ = x.Close() // the stream torn down under the reader
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("before the Layer closed: read %v, want the stream's error", err)
	}
	close(done)
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the Layer closed: read %v, want io.EOF", err)
	}
}
