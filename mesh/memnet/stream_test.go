package memnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/memnet"
)

const protoEcho = "/test/echo/1"

// pair makes two connected hosts that admit each other, b serving echo.
func pair(t *testing.T, o memnet.Options) (a, b *memnet.Host) {
	t.Helper()
	n := newNet(t, o)
	a, b = newHost(t, n, nil), newHost(t, n, nil)
	b.Handle(protoEcho, echo)
	connect(t, a, b)
	return a, b
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestStreamEcho: what one end writes the other reads, both ways, and
// CloseWrite gives the peer io.EOF after the data while the writer can
// still read.
func TestStreamEcho(t *testing.T) {
	a, b := pair(t, memnet.Options{Seed: 1, Latency: time.Millisecond, Jitter: time.Millisecond})
	s := open(t, a, b.ID(), protoEcho)
	if s.RemotePeer() != b.ID() {
		t.Errorf("remote peer %s, want %s", s.RemotePeer(), b.ID())
	}
	s.SetDeadline(time.Now().Add(waitFor))
	want := randomBytes(100_000, 1)
	go func() {
		if _, err := s.Write(want); err != nil {
			t.Errorf("write: %v", err)
		}
		if err := s.CloseWrite(); err != nil {
			t.Errorf("close write: %v", err)
		}
	}()
	got, err := io.ReadAll(s) // ends at the echo's Close: io.EOF
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes (want %d), %v", len(got), len(want), err)
	}
	if _, err := s.Write([]byte("more")); !errors.Is(err, memnet.ErrStreamClosed) {
		t.Errorf("write after CloseWrite: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, memnet.ErrStreamClosed) {
		t.Errorf("read after Close: %v", err)
	}
}

// TestStreamCloseKeepsData: Close sends what was written, then io.EOF;
// what is written to an end that closed is dropped without blocking; a
// read pending when its own end closes returns.
func TestStreamCloseKeepsData(t *testing.T) {
	a, b := pair(t, memnet.Options{})
	var got handled
	b.Handle("/test/sink", got.handle)
	s := open(t, a, b.ID(), "/test/sink")
	eventually(t, "the stream at b", func() bool { return got.count() == 1 })
	r := got.get(0)
	r.SetDeadline(time.Now().Add(waitFor))
	s.SetDeadline(time.Now().Add(waitFor))

	if _, err := s.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b1, err := io.ReadAll(r)
	if err != nil || string(b1) != "last words" {
		t.Fatalf("read %q, %v", b1, err)
	}
	// a closed its reading end: b's writes go nowhere, however many.
	big := make([]byte, 4*memnet.DefaultStreamBuffer)
	if n, err := r.Write(big); err != nil || n != len(big) {
		t.Errorf("writing to a closed end: %d, %v", n, err)
	}

	// A read pending on an end that closes returns.
	s2 := open(t, a, b.ID(), "/test/sink")
	done := make(chan error, 1)
	go func() {
		_, err := s2.Read(make([]byte, 1))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block, most likely
	s2.Close()
	select {
	case err := <-done:
		if !errors.Is(err, memnet.ErrStreamClosed) {
			t.Errorf("pending read at Close: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("a pending read did not return at Close")
	}
}

// TestStreamReset: a reset fails reads and writes at both ends, and
// pending ones.
func TestStreamReset(t *testing.T) {
	a, b := pair(t, memnet.Options{})
	var got handled
	b.Handle("/test/hold", got.handle)
	s := open(t, a, b.ID(), "/test/hold")
	eventually(t, "the stream at b", func() bool { return got.count() == 1 })
	r := got.get(0)
	if _, err := s.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	pending := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 10))
		pending <- err
	}()
	if err := r.Reset(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-pending:
		if !errors.Is(err, memnet.ErrReset) {
			t.Errorf("pending read at the other end: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("a pending read did not return at the peer's reset")
	}
	for name, st := range map[string]mesh.Stream{"resetting end": r, "other end": s} {
		if _, err := st.Read(make([]byte, 10)); !errors.Is(err, memnet.ErrReset) {
			t.Errorf("%s: read after reset: %v", name, err)
		}
		if _, err := st.Write([]byte("x")); !errors.Is(err, memnet.ErrReset) {
			t.Errorf("%s: write after reset: %v", name, err)
		}
	}
	if err := s.CloseWrite(); !errors.Is(err, memnet.ErrReset) {
		t.Errorf("CloseWrite after reset: %v", err)
	}
}

// TestStreamDeadlines: reads and writes time out with a net.Error whose
// Timeout is true, pending ones too, and work again once the deadline is
// moved.
func TestStreamDeadlines(t *testing.T) {
	a, b := pair(t, memnet.Options{StreamBuffer: 4096})
	var got handled
	b.Handle("/test/hold", got.handle)
	s := open(t, a, b.ID(), "/test/hold")
	eventually(t, "the stream at b", func() bool { return got.count() == 1 })
	r := got.get(0)

	isTimeout := func(err error) bool {
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout() && errors.Is(err, os.ErrDeadlineExceeded)
	}
	s.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := s.Read(make([]byte, 1)); !isTimeout(err) {
		t.Errorf("read past its deadline: %v", err)
	}
	// Nobody reads at b: a write of more than the buffer blocks, then
	// times out having written what fits.
	s.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	n, err := s.Write(make([]byte, 10_000))
	if !isTimeout(err) || n != 4096 {
		t.Errorf("write past its deadline: %d bytes, %v; want 4096 and a timeout", n, err)
	}
	// A deadline in the past fails at once, writing nothing.
	s.SetDeadline(time.Now().Add(-time.Second))
	if n, err := s.Write([]byte("x")); n != 0 || !isTimeout(err) {
		t.Errorf("write with a past deadline: %d, %v", n, err)
	}
	// Cleared, the stream works again: b reads what was written.
	s.SetDeadline(time.Time{})
	r.SetDeadline(time.Now().Add(waitFor))
	go func() {
		io.Copy(io.Discard, io.LimitReader(r, 4096))
		r.Write([]byte("ok"))
	}()
	buf := make([]byte, 2)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ok" {
		t.Errorf("after clearing the deadline: %q, %v", buf, err)
	}
	// A deadline set while a read is pending ends it.
	pending := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 1))
		pending <- err
	}()
	time.Sleep(10 * time.Millisecond)
	s.SetReadDeadline(time.Now())
	select {
	case err := <-pending:
		if !isTimeout(err) {
			t.Errorf("pending read at a deadline: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("a pending read ignored its new deadline")
	}
}

// TestStreamBackpressure: a write larger than the buffer blocks until the
// reader makes room, and every byte arrives in order.
func TestStreamBackpressure(t *testing.T) {
	const buffer = 8 << 10
	a, b := pair(t, memnet.Options{StreamBuffer: buffer})
	var got handled
	b.Handle("/test/hold", got.handle)
	s := open(t, a, b.ID(), "/test/hold")
	eventually(t, "the stream at b", func() bool { return got.count() == 1 })
	r := got.get(0)
	r.SetDeadline(time.Now().Add(waitFor))
	s.SetDeadline(time.Now().Add(waitFor))

	want := randomBytes(4<<20, 2)
	wrote := make(chan error, 1)
	go func() {
		_, err := s.Write(want)
		if err == nil {
			err = s.CloseWrite()
		}
		wrote <- err
	}()
	// With nobody reading, the write cannot finish.
	select {
	case err := <-wrote:
		t.Fatalf("a 4 MiB write into an 8 KiB buffer finished with nobody reading: %v", err)
	case <-time.After(quietFor):
	}
	var out bytes.Buffer
	if _, err := io.CopyBuffer(&out, r, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("read %d bytes, not the %d written", out.Len(), len(want))
	}
}

// TestStreamIsNetConn runs x/net's net.Conn conformance tests on a
// stream's two ends.
func TestStreamIsNetConn(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		n := memnet.NewNetwork(memnet.Options{Seed: 3})
		a, err := n.NewHost(memnet.HostOptions{})
		if err != nil {
			return nil, nil, nil, err
		}
		b, err := n.NewHost(memnet.HostOptions{})
		if err != nil {
			return nil, nil, nil, err
		}
		ends := make(chan mesh.Stream, 1)
		b.Handle("/test/conn", func(s mesh.Stream) { ends <- s })
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		if _, err := a.Connect(ctx, b.Addrs()); err != nil {
			return nil, nil, nil, err
		}
		s, err := a.NewStream(ctx, b.ID(), "/test/conn")
		if err != nil {
			return nil, nil, nil, err
		}
		r := <-ends
		stop = func() {
			s.Close()
			r.Close()
			n.Close()
		}
		return s.(net.Conn), r.(net.Conn), stop, nil
	})
}
