package raftnet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/p2p"
)

// Every wait in these tests is bounded and polls: generous enough for a
// loaded two-core machine under -race, with no assertion on how long
// anything took.
const (
	waitFor  = 20 * time.Second
	pollStep = 25 * time.Millisecond
)

// openGate is a mesh.Gate that admits every peer: these tests are about
// the Layer's own allow function, not the host's admission.
type openGate struct{}

func (openGate) Blocked(mesh.PeerID) bool  { return false }
func (openGate) Admitted(mesh.PeerID) bool { return true }

// logSink collects what loggers write, passes it to the test (nothing once
// the test is over: libp2p and raft goroutines may still log while they
// wind down) and lets the test look for a line.
type logSink struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
	text strings.Builder
}

func newLogSink(t testing.TB) *logSink {
	s := &logSink{t: t}
	t.Cleanup(func() {
		s.mu.Lock()
		s.done = true
		s.mu.Unlock()
	})
	return s
}

func (s *logSink) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.t.Log(strings.TrimRight(string(b), "\n"))
		s.text.Write(b)
	}
	return len(b), nil
}

// has reports a line that contains every one of parts.
func (s *logSink) has(parts ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for line := range strings.Lines(s.text.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

func (s *logSink) logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(s, &slog.HandlerOptions{Level: level}))
}

// quietLogger logs warnings and errors to the test.
func quietLogger(t testing.TB) *slog.Logger { return newLogSink(t).logger(slog.LevelWarn) }

// newHost starts a p2p host listening on listen (QUIC and TCP on free
// loopback ports if nil), admitting every peer, closed when the test ends.
func newHost(t testing.TB, listen []string) *p2p.Host {
	t.Helper()
	if listen == nil {
		listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}
	}
	h, err := p2p.New(context.Background(), p2p.Options{
		DataDir: t.TempDir(),
		Listen:  listen,
		Gate:    openGate{},
		Logger:  quietLogger(t),
	})
	if err != nil {
		t.Fatalf("p2p.New: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// connectAll connects every pair of hosts, so each knows the others'
// addresses and NewStream by peer id works.
func connectAll(t testing.TB, hosts ...*p2p.Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i, a := range hosts {
		for _, b := range hosts[i+1:] {
			if _, err := a.Connect(ctx, b.Addrs()); err != nil {
				t.Fatalf("connect %s → %s: %v", a.ID(), b.ID(), err)
			}
		}
	}
}

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(pollStep)
	}
}

// acceptWithin accepts from l, failing the test if nothing comes within
// waitFor (it closes l then, to end the Accept).
func acceptWithin(t testing.TB, l *Layer) *conn {
	t.Helper()
	type result struct {
		c   *conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			ch <- result{err: err}
			return
		}
		ch <- result{c: c.(*conn)}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Accept: %v", r.err)
		}
		return r.c
	case <-time.After(waitFor):
		_ = l.Close()
		t.Fatal("Accept: nothing arrived")
		return nil
	}
}

// deadliner is a stream or a conn: what refused needs.
type deadliner interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
}

// refused opens a stream with open, writes and reads: it fails the test
// unless the other end resets the stream. The reset shows as open's error
// if the host negotiates the protocol before it returns, or as the read's
// (or the write's) if it negotiates lazily with the first write.
func refused[S deadliner](t testing.TB, open func() (S, error)) {
	t.Helper()
	s, err := open()
	if err != nil {
		if errors.Is(err, ErrNotAllowed) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("open: %v, want a reset", err)
		}
		return
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(waitFor))
	if _, err := s.Write([]byte("hello")); err != nil {
		return
	}
	_, err = s.Read(make([]byte, 16))
	if err == nil {
		t.Fatal("read data from a stream that should have been refused")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the stream was neither answered nor refused")
	}
	if errors.Is(err, io.EOF) {
		t.Fatal("the stream was closed, not reset: something at the other end took it")
	}
}

// fsm is a raft.FSM that records the commands it applied, in order.
type fsm struct {
	mu      sync.Mutex
	applied []string
}

func (f *fsm) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, string(l.Data))
	return len(f.applied)
}

func (f *fsm) entries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applied)
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) { return fsmSnapshot(f.entries()), nil }

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var l []string
	if err := json.NewDecoder(rc).Decode(&l); err != nil {
		return err
	}
	f.mu.Lock()
	f.applied = l
	f.mu.Unlock()
	return nil
}

type fsmSnapshot []string

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode([]string(s)); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}

// node is one raft server, on a p2p host or (for the baseline) on raft's
// TCP transport.
type node struct {
	host  *p2p.Host // nil on TCP
	id    raft.ServerID
	addr  raft.ServerAddress
	raft  *raft.Raft
	fsm   *fsm
	store *raft.InmemStore
	trans *raft.NetworkTransport // nil unless started by startNode
}

// testConfig is raft's configuration tuned for a quick election on
// loopback; nothing asserts on how long anything takes. Benchmarks keep
// raft's default timeouts: a loaded two-core machine pushing entries flat
// out can miss a short heartbeat, and a benchmark measures the steady
// state, not elections.
func testConfig(t testing.TB, id raft.ServerID, log *slog.Logger) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = id
	if _, bench := t.(*testing.B); !bench {
		c.HeartbeatTimeout = 400 * time.Millisecond
		c.ElectionTimeout = 400 * time.Millisecond
		c.LeaderLeaseTimeout = 200 * time.Millisecond
		c.CommitTimeout = 20 * time.Millisecond
	}
	c.Logger = HCLog(log.With("server", id))
	return c
}

// startNode starts a raft server over a Layer on h. It is shut down, then
// its host closed, when the test ends.
func startNode(t testing.TB, h *p2p.Host, allow func(mesh.PeerID) bool, log *slog.Logger) *node {
	t.Helper()
	trans := NewTransport(New(h, allow), TransportOptions{Logger: log})
	n := startRaft(t, raft.ServerID(h.ID()), trans, log)
	n.host, n.trans = h, trans
	return n
}

// startRaft starts a raft server with id on trans, shut down when the test
// ends.
func startRaft(t testing.TB, id raft.ServerID, trans raft.Transport, log *slog.Logger) *node {
	t.Helper()
	n := &node{id: id, addr: trans.LocalAddr(), fsm: &fsm{}, store: raft.NewInmemStore()}
	r, err := raft.NewRaft(testConfig(t, id, log), n.fsm, n.store, n.store, raft.NewInmemSnapshotStore(), trans)
	if err != nil {
		t.Fatalf("NewRaft: %v", err)
	}
	n.raft = r
	t.Cleanup(func() { _ = r.Shutdown().Error() })
	return n
}

// bootstrap gives every node the configuration of all of them as voters.
func bootstrap(t testing.TB, nodes []*node) {
	t.Helper()
	var cfg raft.Configuration
	for _, n := range nodes {
		cfg.Servers = append(cfg.Servers, raft.Server{
			Suffrage: raft.Voter, ID: n.id, Address: n.addr,
		})
	}
	for _, n := range nodes {
		if err := n.raft.BootstrapCluster(cfg).Error(); err != nil {
			t.Fatalf("bootstrap %s: %v", n.id, err)
		}
	}
}

// cluster starts n connected hosts, each with a raft server that admits
// exactly the others, and bootstraps them as one group.
func cluster(t testing.TB, n int, log *slog.Logger, listen []string) []*node {
	t.Helper()
	hosts := make([]*p2p.Host, n)
	members := make(map[mesh.PeerID]bool, n)
	for i := range hosts {
		hosts[i] = newHost(t, listen)
		members[hosts[i].ID()] = true
	}
	connectAll(t, hosts...)
	allow := func(p mesh.PeerID) bool { return members[p] }
	nodes := make([]*node, n)
	for i, h := range hosts {
		nodes[i] = startNode(t, h, allow, log)
	}
	bootstrap(t, nodes)
	return nodes
}

// waitLeader waits until one of nodes is leader and all of them name it,
// and returns it.
func waitLeader(t testing.TB, nodes []*node) *node {
	t.Helper()
	var leader *node
	eventually(t, "the nodes agree on a leader", func() bool {
		leader = nil
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range nodes {
			if _, id := n.raft.LeaderWithID(); id != leader.id {
				return false
			}
		}
		return true
	})
	return leader
}

// apply applies cmd on whichever of nodes leads, retrying while
// leadership moves, until it is committed. A retried command may be
// committed twice; see dedup.
func apply(t testing.TB, nodes []*node, cmd string) {
	t.Helper()
	var last error
	eventually(t, "apply "+cmd, func() bool {
		for _, n := range nodes {
			if n.raft.State() != raft.Leader {
				continue
			}
			last = n.raft.Apply([]byte(cmd), waitFor).Error()
			return last == nil
		}
		return false
	})
	if last != nil {
		t.Fatalf("apply %s: %v", cmd, last)
	}
}

// dedup drops repeats of a command right after itself: the one form a
// retried apply can leave in the log, since apply sends the next command
// only once the last is committed.
func dedup(l []string) []string { return slices.Compact(slices.Clone(l)) }
