package memnet_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/memnet"
	"github.com/clawmesh/clawmesh/mesh/p2p"
)

// TestIdentity: a host's id is its key's libp2p id, as mesh/p2p derives
// it; keys drawn from a seed are the same for the same seed; ids are
// unique among running hosts and keep their address.
func TestIdentity(t *testing.T) {
	n := newNet(t, memnet.Options{Seed: 9})
	key := n.NewKey()
	h, err := n.NewHost(memnet.HostOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	pub := key.Public().(ed25519.PublicKey)
	want, err := p2p.PeerIDFromEd25519(pub)
	if err != nil {
		t.Fatal(err)
	}
	if h.ID() != want {
		t.Errorf("id %s, mesh/p2p says %s", h.ID(), want)
	}
	if got, err := memnet.KeyOf(h.ID()); err != nil || !bytes.Equal(got, pub) {
		t.Errorf("KeyOf: %x, %v", got, err)
	}
	if got, err := p2p.PublicKey(h.ID()); err != nil || !bytes.Equal(got, pub) {
		t.Errorf("p2p.PublicKey of a memnet id: %x, %v", got, err)
	}
	if addrs := h.Addrs(); len(addrs) != 1 || !strings.HasSuffix(addrs[0], "/p2p/"+string(h.ID())) {
		t.Errorf("addrs %v", addrs)
	}
	if _, err := n.NewHost(memnet.HostOptions{Key: key}); !errors.Is(err, memnet.ErrIDTaken) {
		t.Errorf("a second host of the same key: %v", err)
	}
	if _, err := n.NewHost(memnet.HostOptions{Key: key, ID: "someone-else"}); !errors.Is(err, memnet.ErrBadPeer) {
		t.Errorf("a key and another id: %v", err)
	}
	for _, bad := range []mesh.PeerID{"a/b", "a b"} {
		if _, err := n.NewHost(memnet.HostOptions{ID: bad}); !errors.Is(err, memnet.ErrBadPeer) {
			t.Errorf("id %q: %v", bad, err)
		}
	}
	named, err := n.NewHost(memnet.HostOptions{ID: "trainer-1"})
	if err != nil || named.ID() != "trainer-1" || named.Key() != nil {
		t.Errorf("a host named by id: %v, %v", named, err)
	}
	auto := newHost(t, n, nil)
	if auto.Key() == nil {
		t.Fatal("a host made without key or id has no key")
	}
	if id, _ := memnet.IDFromKey(auto.Key().Public().(ed25519.PublicKey)); id != auto.ID() {
		t.Errorf("the made key's id %s, the host's %s", id, auto.ID())
	}

	// Keys are drawn from the seed: the same seed, the same keys.
	same, other := memnet.NewNetwork(memnet.Options{Seed: 9}), memnet.NewNetwork(memnet.Options{Seed: 10})
	defer same.Close()
	defer other.Close()
	if k := same.NewKey(); !k.Equal(key) {
		t.Error("the first key of another network of the same seed differs")
	}
	if k := other.NewKey(); k.Equal(key) {
		t.Error("the first key of a network of another seed is the same")
	}

	// A host made again after Close has the same address.
	addr := h.Addrs()[0]
	h.Close()
	again, err := n.NewHost(memnet.HostOptions{Key: key})
	if err != nil || again.Addrs()[0] != addr {
		t.Errorf("made again: %v, %v (was %s)", again.Addrs(), err, addr)
	}
}

// TestConnectErrors: addresses that do not name one other running peer
// are refused, each with its own error.
func TestConnectErrors(t *testing.T) {
	n := newNet(t, memnet.Options{})
	a, b := newHost(t, n, nil), newHost(t, n, nil)
	ctx := context.Background()
	if _, err := a.NewStream(ctx, b.ID(), protoEcho); !errors.Is(err, memnet.ErrNoAddr) {
		t.Errorf("a stream to a peer never met: %v", err)
	}
	prefix := strings.TrimSuffix(b.Addrs()[0], "/p2p/"+string(b.ID()))
	for _, c := range []struct {
		addrs []string
		want  error
	}{
		{nil, memnet.ErrBadAddr},
		{[]string{"/ip4/10.0.0.9/tcp/4001"}, memnet.ErrBadAddr},
		{a.Addrs(), memnet.ErrBadAddr},
		{[]string{b.Addrs()[0], a.Addrs()[0]}, memnet.ErrBadAddr},
		{[]string{"/p2p/" + string(b.ID())}, memnet.ErrNoAddr},
		{[]string{"/ip4/10.9.9.9/tcp/4001/p2p/" + string(b.ID())}, memnet.ErrUnreachable},
		{[]string{prefix + "/p2p/nobody"}, memnet.ErrUnreachable},
	} {
		if _, err := a.Connect(ctx, c.addrs); !errors.Is(err, c.want) {
			t.Errorf("connect %v: %v, want %v", c.addrs, err, c.want)
		}
	}
	if len(a.Connected()) != 0 {
		t.Errorf("connected to %v", a.Connected())
	}
	// Once met, a peer is dialled by id alone, as its address is known.
	connect(t, a, b)
	a.Disconnect(b.ID())
	if _, err := a.Connect(ctx, []string{"/p2p/" + string(b.ID())}); err != nil {
		t.Errorf("connect by id to a peer met before: %v", err)
	}
	a.Disconnect(b.ID())
	b.Handle(protoEcho, echo)
	s, err := a.NewStream(ctx, b.ID(), protoEcho)
	if err != nil {
		t.Fatalf("a stream dials a peer met before: %v", err)
	}
	s.Close()
	if _, err := a.NewStream(ctx, b.ID(), "/test/nobody-serves-this"); !errors.Is(err, memnet.ErrNoProtocol) {
		t.Errorf("a protocol the peer does not serve: %v", err)
	}
	b.Close()
	if _, err := a.Connect(ctx, b.Addrs()); !errors.Is(err, memnet.ErrUnreachable) {
		t.Errorf("connect to a closed host: %v", err)
	}
	if _, err := b.Connect(ctx, a.Addrs()); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("connect from a closed host: %v", err)
	}
}

// TestNewAddr: a host made again at a fresh address cannot be dialled at
// the old one; its peers learn the new one when it connects to them, or
// when given it.
func TestNewAddr(t *testing.T) {
	n := newNet(t, memnet.Options{})
	a := newHost(t, n, nil)
	key := n.NewKey()
	b, err := n.NewHost(memnet.HostOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	connect(t, a, b)
	b.Close()
	b2, err := n.NewHost(memnet.HostOptions{Key: key, NewAddr: true})
	if err != nil {
		t.Fatal(err)
	}
	if b2.ID() != b.ID() || b2.Addrs()[0] == b.Addrs()[0] {
		t.Fatalf("made again at %v, was at %v", b2.Addrs(), b.Addrs())
	}
	ctx := context.Background()
	if _, err := a.Connect(ctx, []string{"/p2p/" + string(b.ID())}); !errors.Is(err, memnet.ErrUnreachable) {
		t.Errorf("dial by id at the old address: %v", err)
	}
	if _, err := a.Connect(ctx, b.Addrs()); !errors.Is(err, memnet.ErrUnreachable) {
		t.Errorf("dial at the old address: %v", err)
	}
	connect(t, b2, a) // a learns b2's address
	a.Disconnect(b2.ID())
	if _, err := a.Connect(ctx, []string{"/p2p/" + string(b.ID())}); err != nil {
		t.Errorf("dial by id once the new address is known: %v", err)
	}

	// Made again at its usual address, it is reachable there.
	b2.Close()
	b3, err := n.NewHost(memnet.HostOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if b3.Addrs()[0] != b.Addrs()[0] {
		t.Errorf("made again at %v, its usual address is %v", b3.Addrs(), b.Addrs())
	}
	if _, err := a.Connect(ctx, []string{"/p2p/" + string(b.ID())}); err != nil {
		t.Errorf("dial by id at the usual address: %v", err)
	}
}

// TestAdmission: a peer not admitted may open only the open protocols;
// its streams of others are reset before the handler sees them; a blocked
// peer can neither connect nor be connected to, and a peer blocked while
// connected gets no stream at all.
func TestAdmission(t *testing.T) {
	const openProto, closedProto = "/test/open", "/test/members"
	n := newNet(t, memnet.Options{Latency: time.Millisecond})
	ga, gb := newGate(false), newGate(false)
	a := newHost(t, n, ga, openProto)
	b := newHost(t, n, gb, openProto)
	var gotOpen, gotClosed handled
	b.Handle(openProto, gotOpen.handle)
	b.Handle(closedProto, gotClosed.handle)
	connect(t, a, b)
	ctx := context.Background()

	// Neither admits the other: only the open protocol.
	if _, err := a.NewStream(ctx, b.ID(), closedProto); !errors.Is(err, memnet.ErrNotAdmitted) {
		t.Errorf("a closed protocol to a peer not admitted: %v", err)
	}
	s := open(t, a, b.ID(), openProto)
	s.Close()
	eventually(t, "b's handler to get the open stream", func() bool { return gotOpen.count() == 1 })

	// a admits b, b does not admit a: b resets a's stream before its
	// handler sees it.
	ga.admit(b.ID(), true)
	s = open(t, a, b.ID(), closedProto)
	s.SetDeadline(time.Now().Add(waitFor))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, memnet.ErrReset) {
		t.Errorf("a stream b does not admit: read %v", err)
	}
	never(t, "b's handler got a stream from a peer it does not admit", func() bool { return gotClosed.count() > 0 })

	// Both admit: it goes through.
	gb.admit(a.ID(), true)
	s = open(t, a, b.ID(), closedProto)
	s.Close()
	eventually(t, "b's handler to get the members' stream", func() bool { return gotClosed.count() == 1 })

	// b blocks a while connected: no stream of a reaches b's handlers,
	// not even open ones.
	gb.block(a.ID(), true)
	s = open(t, a, b.ID(), openProto)
	s.SetDeadline(time.Now().Add(waitFor))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, memnet.ErrReset) {
		t.Errorf("an open stream to a peer that blocks us: read %v", err)
	}
	never(t, "a blocked peer's stream reached a handler", func() bool { return gotOpen.count() > 1 })

	// Blocked peers do not connect, either way.
	a.Disconnect(b.ID())
	if _, err := a.Connect(ctx, b.Addrs()); !errors.Is(err, memnet.ErrRefused) {
		t.Errorf("connect to a peer that blocks us: %v", err)
	}
	if _, err := b.Connect(ctx, a.Addrs()); !errors.Is(err, memnet.ErrBlocked) {
		t.Errorf("connect to a peer we block: %v", err)
	}
	if _, err := b.NewStream(ctx, a.ID(), openProto); !errors.Is(err, memnet.ErrBlocked) {
		t.Errorf("a stream to a peer we block: %v", err)
	}
	if len(a.Connected()) != 0 || len(b.Connected()) != 0 {
		t.Errorf("connected: %v, %v", a.Connected(), b.Connected())
	}
}

// TestNotify: both ends hear of a connection and of its end, once each.
func TestNotify(t *testing.T) {
	n := newNet(t, memnet.Options{})
	a, b := newHost(t, n, nil), newHost(t, n, nil)
	wa, wb := watch(a), watch(b)
	connect(t, a, b)
	eventually(t, "both ends notified up", func() bool { return wa.isUp(b.ID()) && wb.isUp(a.ID()) })
	connect(t, a, b) // already connected: nothing
	connect(t, b, a)
	if err := b.Disconnect(a.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both ends notified down", func() bool { return !wa.isUp(b.ID()) && !wb.isUp(a.ID()) })
	never(t, "more than one call per change", func() bool { return wa.calls(b.ID()) > 2 || wb.calls(a.ID()) > 2 })
	if got := a.Connected(); len(got) != 0 {
		t.Errorf("still connected to %v", got)
	}
}

// TestPartition: a partition cuts the connections across it at once
// (streams reset, both ends notified) and refuses new ones with a clear
// error; within a group all goes on; Heal lets hosts connect again;
// isolation works the same for one host.
func TestPartition(t *testing.T) {
	n := newNet(t, memnet.Options{})
	a, b, c := newHost(t, n, nil), newHost(t, n, nil), newHost(t, n, nil)
	for _, h := range []*memnet.Host{a, b, c} {
		h.Handle(protoEcho, echo)
	}
	wa, wc := watch(a), watch(c)
	connect(t, a, b)
	connect(t, a, c)
	connect(t, b, c)
	eventually(t, "a and c connected", func() bool { return wa.isUp(c.ID()) && wc.isUp(a.ID()) })
	across := open(t, a, c.ID(), protoEcho)
	within := open(t, a, b.ID(), protoEcho)

	n.Partition([]mesh.PeerID{a.ID(), b.ID()}, []mesh.PeerID{c.ID()})
	across.SetDeadline(time.Now().Add(waitFor))
	if _, err := across.Write([]byte("x")); !errors.Is(err, memnet.ErrReset) {
		t.Errorf("a stream across the partition: write %v", err)
	}
	eventually(t, "both ends notified down", func() bool { return !wa.isUp(c.ID()) && !wc.isUp(a.ID()) })
	if got := a.Connected(); len(got) != 1 || got[0] != b.ID() {
		t.Errorf("a connected to %v, want only b", got)
	}
	ctx := context.Background()
	if _, err := a.Connect(ctx, c.Addrs()); !errors.Is(err, memnet.ErrPartitioned) || !strings.Contains(err.Error(), "partition") {
		t.Errorf("connect across the partition: %v", err)
	}
	if _, err := c.NewStream(ctx, b.ID(), protoEcho); !errors.Is(err, memnet.ErrPartitioned) {
		t.Errorf("a stream across the partition: %v", err)
	}
	within.SetDeadline(time.Now().Add(waitFor))
	if _, err := within.Write([]byte("ping")); err != nil {
		t.Fatalf("a stream within a group: %v", err)
	}
	within.CloseWrite()
	if got, err := io.ReadAll(within); err != nil || string(got) != "ping" {
		t.Errorf("a stream within a group: %q, %v", got, err)
	}

	n.Heal()
	if len(a.Connected()) != 1 {
		t.Error("Heal reconnected hosts by itself")
	}
	connect(t, a, c)
	eventually(t, "a and c notified up again", func() bool { return wa.isUp(c.ID()) && wc.isUp(a.ID()) })
	s := open(t, c, a.ID(), protoEcho)
	s.Close()

	n.Isolate(b.ID())
	eventually(t, "b cut off", func() bool { return len(b.Connected()) == 0 })
	if _, err := b.Connect(ctx, a.Addrs()); !errors.Is(err, memnet.ErrPartitioned) || !strings.Contains(err.Error(), "isolated") {
		t.Errorf("connect from an isolated host: %v", err)
	}
	if got := a.Connected(); len(got) != 1 || got[0] != c.ID() {
		t.Errorf("a connected to %v, want only c", got)
	}
	n.Heal()
	connect(t, b, a)
}

// TestCrash: a crashed host vanishes: its streams reset, its peers hear
// it go, it hears nothing, its handlers are not called, its calls and
// topics fail; a host made again with its key takes its place.
func TestCrash(t *testing.T) {
	n := newNet(t, memnet.Options{})
	a := newHost(t, n, nil)
	key := n.NewKey()
	b, err := n.NewHost(memnet.HostOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	var served handled
	b.Handle("/test/hold", served.handle)
	wa, wb := watch(a), watch(b)
	topic, err := b.Join("news")
	if err != nil {
		t.Fatal(err)
	}
	connect(t, a, b)
	eventually(t, "both ends notified up", func() bool { return wa.isUp(b.ID()) && wb.isUp(a.ID()) })
	s := open(t, a, b.ID(), "/test/hold")
	eventually(t, "b to get the stream", func() bool { return served.count() == 1 })
	r := served.get(0)

	if err := n.Crash(b.ID()); err != nil {
		t.Fatal(err)
	}
	if err := n.Crash(b.ID()); !errors.Is(err, memnet.ErrUnreachable) {
		t.Errorf("crash a crashed host: %v", err)
	}
	s.SetDeadline(time.Now().Add(waitFor))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, memnet.ErrReset) {
		t.Errorf("the survivor's end: %v", err)
	}
	if _, err := r.Write([]byte("x")); !errors.Is(err, memnet.ErrReset) {
		t.Errorf("the crashed host's end: %v", err)
	}
	eventually(t, "a notified down", func() bool { return !wa.isUp(b.ID()) })
	if wb.calls(a.ID()) != 1 {
		t.Errorf("the crashed host was notified %d times, want once (up)", wb.calls(a.ID()))
	}
	ctx := context.Background()
	if _, err := topic.Next(ctx); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("the crashed host's topic: %v", err)
	}
	if _, err := b.NewStream(ctx, a.ID(), "/test/hold"); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("a stream from the crashed host: %v", err)
	}
	if _, err := b.Join("other"); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("join on the crashed host: %v", err)
	}
	if _, err := a.NewStream(ctx, b.ID(), "/test/hold"); !errors.Is(err, memnet.ErrUnreachable) {
		t.Errorf("a stream to the crashed host: %v", err)
	}
	never(t, "the crashed host's handler called again", func() bool { return served.count() > 1 })

	// Restarted: same key, same id and address; a reaches it again.
	b2, err := n.NewHost(memnet.HostOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if b2.ID() != b.ID() || b2.Addrs()[0] != b.Addrs()[0] {
		t.Errorf("restarted as %s at %v, was %s at %v", b2.ID(), b2.Addrs(), b.ID(), b.Addrs())
	}
	var served2 handled
	b2.Handle("/test/hold", served2.handle)
	s = open(t, a, b2.ID(), "/test/hold") // a knows the address: it dials
	s.Close()
	eventually(t, "the restarted host to get a stream", func() bool { return served2.count() == 1 })
	eventually(t, "a notified up again", func() bool { return wa.isUp(b.ID()) })
	if served.count() != 1 {
		t.Error("the crashed host's handler got the restarted host's stream")
	}
}
