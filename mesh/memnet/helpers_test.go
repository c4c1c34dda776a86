package memnet_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/memnet"
)

// Every wait in these tests is bounded and polls: generous enough for a
// loaded two-core machine under -race, with no assertion on how long
// anything took.
const (
	waitFor  = 20 * time.Second       // for something that must happen
	quietFor = 300 * time.Millisecond // for something that must not
	pollStep = 5 * time.Millisecond
)

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, waitFor)
		}
		time.Sleep(pollStep)
	}
}

// never checks that cond stays false for quietFor.
func never(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(quietFor)
	for time.Now().Before(deadline) {
		if cond() {
			t.Fatalf("%s", what)
		}
		time.Sleep(pollStep)
	}
}

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
	return !g.blocked[p] && (g.all || g.admitted[p])
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

// testLogger logs warnings and errors to the test while it runs.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(b))
	}
	return len(b), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// newNet makes a network closed at the end of the test.
func newNet(t testing.TB, o memnet.Options) *memnet.Network {
	t.Helper()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	n := memnet.NewNetwork(o)
	t.Cleanup(func() { n.Close() })
	return n
}

// newHost makes a host with a key drawn from the network's seed.
func newHost(t testing.TB, n *memnet.Network, gate mesh.Gate, open ...string) *memnet.Host {
	t.Helper()
	h, err := n.NewHost(memnet.HostOptions{Gate: gate, Open: open})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func connect(t testing.TB, from, to *memnet.Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	id, err := from.Connect(ctx, to.Addrs())
	if err != nil {
		t.Fatalf("connect %s to %s: %v", from.ID(), to.ID(), err)
	}
	if id != to.ID() {
		t.Fatalf("connected to %s, want %s", id, to.ID())
	}
}

func open(t testing.TB, from *memnet.Host, to mesh.PeerID, proto string) mesh.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := from.NewStream(ctx, to, proto)
	if err != nil {
		t.Fatalf("open %s from %s to %s: %v", proto, from.ID(), to, err)
	}
	return s
}

// echo serves a protocol by copying what it reads back, then closing.
func echo(s mesh.Stream) {
	s.SetDeadline(time.Now().Add(waitFor))
	if _, err := io.Copy(s, s); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// handled counts the streams a handler got and keeps them.
type handled struct {
	mu      sync.Mutex
	streams []mesh.Stream
}

func (h *handled) handle(s mesh.Stream) {
	h.mu.Lock()
	h.streams = append(h.streams, s)
	h.mu.Unlock()
}

func (h *handled) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

func (h *handled) get(i int) mesh.Stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.streams[i]
}

// notes records Notify calls.
type notes struct {
	mu sync.Mutex
	up map[mesh.PeerID]bool
	n  map[mesh.PeerID]int // calls
}

func watch(h *memnet.Host) *notes {
	w := &notes{up: map[mesh.PeerID]bool{}, n: map[mesh.PeerID]int{}}
	h.Notify(func(p mesh.PeerID, up bool) {
		w.mu.Lock()
		w.up[p] = up
		w.n[p]++
		w.mu.Unlock()
	})
	return w
}

func (w *notes) isUp(p mesh.PeerID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.up[p]
}

func (w *notes) calls(p mesh.PeerID) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[p]
}

// isErr reports whether err is one of targets.
func isErr(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
