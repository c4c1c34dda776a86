package p2p

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Every wait in these tests is bounded and polls: generous enough for a
// loaded two-core machine, with no assertion on how long anything took.
const (
	waitFor  = 20 * time.Second        // for something that must happen
	quietFor = 1500 * time.Millisecond // for something that must not
	pollStep = 25 * time.Millisecond
)

// fakeGate is a mesh.Gate the test flips.
type fakeGate struct {
	mu       sync.Mutex
	all      bool // admit every peer not blocked
	admitted map[mesh.PeerID]bool
	blocked  map[mesh.PeerID]bool
}

func newGate(admitAll bool) *fakeGate {
	return &fakeGate{all: admitAll, admitted: map[mesh.PeerID]bool{}, blocked: map[mesh.PeerID]bool{}}
}

func (g *fakeGate) Blocked(p mesh.PeerID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked[p]
}

func (g *fakeGate) Admitted(p mesh.PeerID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.blocked[p] {
		return false
	}
	return g.all || g.admitted[p]
}

func (g *fakeGate) admit(p mesh.PeerID, yes bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.admitted[p] = yes
}

func (g *fakeGate) block(p mesh.PeerID, yes bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.blocked[p] = yes
}

// testLogger logs warnings and errors to the test, and nothing once the
// test is over (libp2p goroutines may still log while they wind down).
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// loopback listens on QUIC and TCP at free ports of 127.0.0.1.
var loopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// testOptions are the options of a test host: loopback, no mDNS, no NAT.
func testOptions(t *testing.T, gate mesh.Gate) Options {
	return Options{
		DataDir: t.TempDir(),
		Listen:  loopback,
		Gate:    gate,
		Open:    []string{openProto},
		Logger:  testLogger(t),
	}
}

const (
	openProto   = "/clawmesh/test/open/1"
	closedProto = "/clawmesh/test/closed/1"
	topicName   = "clawmesh/test/announce"
)

// startHost starts a host and closes it when the test ends.
func startHost(t *testing.T, o Options) *Host {
	t.Helper()
	h, err := New(context.Background(), o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// newTestHost starts a host with testOptions.
func newTestHost(t *testing.T, gate mesh.Gate) *Host {
	t.Helper()
	return startHost(t, testOptions(t, gate))
}

// connect connects a to b through b's addresses and waits until both see
// the connection.
func connect(t *testing.T, a, b *Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	id, err := a.Connect(ctx, b.Addrs())
	if err != nil {
		t.Fatalf("connect %s → %s: %v", a.ID(), b.ID(), err)
	}
	if id != b.ID() {
		t.Fatalf("Connect returned %s, want %s", id, b.ID())
	}
	eventually(t, "both ends see the connection", func() bool {
		return has(a.Connected(), b.ID()) && has(b.Connected(), a.ID())
	})
}

func has(l []mesh.PeerID, p mesh.PeerID) bool {
	for _, x := range l {
		if x == p {
			return true
		}
	}
	return false
}

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(pollStep)
	}
}

// addrsWith returns the addresses of h that contain part.
func addrsWith(t *testing.T, h *Host, part string) []string {
	t.Helper()
	var out []string
	for _, a := range h.Addrs() {
		if strings.Contains(a, part) {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s address among %v", part, h.Addrs())
	}
	return out
}

// echo serves a protocol by writing back what it reads, and counts the
// streams it served.
type echo struct {
	mu    sync.Mutex
	count int
}

func (e *echo) serve(s mesh.Stream) {
	e.mu.Lock()
	e.count++
	e.mu.Unlock()
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(waitFor))
	buf := make([]byte, 1024)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (e *echo) served() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.count
}

// roundTrip opens proto from a to b, writes msg, closes its side and reads
// the answer.
func roundTrip(a *Host, b mesh.PeerID, proto, msg string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := a.NewStream(ctx, b, proto)
	if err != nil {
		return "", err
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(waitFor))
	if _, err := s.Write([]byte(msg)); err != nil {
		_ = s.Reset()
		return "", err
	}
	if err := s.CloseWrite(); err != nil {
		_ = s.Reset()
		return "", err
	}
	var got []byte
	buf := make([]byte, 1024)
	for {
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return string(got), nil
		}
		if err != nil {
			_ = s.Reset()
			return string(got), err
		}
	}
}

// nextWithin returns the next message of t, or ok false if none comes
// within d.
func nextWithin(t mesh.Topic, d time.Duration) (mesh.Message, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	m, err := t.Next(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return mesh.Message{}, false, nil
	}
	if err != nil {
		return mesh.Message{}, false, err
	}
	return m, true, nil
}
