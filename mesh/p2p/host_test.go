package p2p

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/clawmesh/clawmesh/mesh"
)

func TestOptionsValidate(t *testing.T) {
	gate := newGate(true)
	ok := Options{DataDir: "d", Gate: gate}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string // "" for valid
	}{
		{"minimal", func(*Options) {}, ""},
		{"everything", func(o *Options) {
			o.Listen = loopback
			o.Open = []string{"/a/1"}
			o.Relays = []string{"/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWGzBZCbyS6ir6WzZhBwiE6sWVtqN9yN7kMwgNqXBBcwJd"}
			o.MaxMessage, o.MaxConns, o.MaxMemory = 1024, 16, 32<<20
		}, ""},
		{"no data dir", func(o *Options) { o.DataDir = "" }, "DataDir"},
		{"no gate", func(o *Options) { o.Gate = nil }, "Gate"},
		{"bad listen", func(o *Options) { o.Listen = []string{"/ip4/nope"} }, "listen"},
		{"empty protocol", func(o *Options) { o.Open = []string{""} }, "protocol"},
		{"relay without id", func(o *Options) { o.Relays = []string{"/ip4/1.2.3.4/tcp/4001"} }, "relay"},
		{"huge message", func(o *Options) { o.MaxMessage = 64 << 20 }, "MaxMessage"},
		{"negative message", func(o *Options) { o.MaxMessage = -1 }, "MaxMessage"},
		{"too few conns", func(o *Options) { o.MaxConns = 2 }, "MaxConns"},
		{"too little memory", func(o *Options) { o.MaxMemory = 1 << 20 }, "MaxMemory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			err := o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want ErrOptions about %s", err, tc.want)
			}
		})
	}
}

func TestIdentityPersists(t *testing.T) {
	o := testOptions(t, newGate(true))
	h := startHost(t, o)
	first := h.ID()
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	fi, err := os.Stat(filepath.Join(o.DataDir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("identity file mode %v, want 0600", perm)
	}
	_, id, err := LoadIdentity(o.DataDir)
	if err != nil || id != first {
		t.Fatalf("LoadIdentity = %s, %v; want %s", id, err, first)
	}
	h2 := startHost(t, o)
	if h2.ID() != first {
		t.Fatalf("restarted host has id %s, want %s", h2.ID(), first)
	}
}

func TestIdentityHelpers(t *testing.T) {
	key, id, err := LoadIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := PeerIDFromKey(key.GetPublic()); err != nil || got != id {
		t.Fatalf("PeerIDFromKey = %s, %v; want %s", got, err, id)
	}
	pub, err := PublicKey(id)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := PeerIDFromEd25519(pub); err != nil || got != id {
		t.Fatalf("PeerIDFromEd25519(PublicKey(id)) = %s, %v; want %s", got, err, id)
	}
	if _, err := PublicKey("not a peer id"); !errors.Is(err, ErrBadPeer) {
		t.Fatalf("PublicKey(garbage) = %v, want ErrBadPeer", err)
	}
}

func TestIdentityDamaged(t *testing.T) {
	o := testOptions(t, newGate(true))
	path := filepath.Join(o.DataDir, IdentityFile)
	damaged := []byte("not a key at all")
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := New(context.Background(), o)
	if err == nil {
		h.Close()
		t.Fatal("New started with a damaged identity file")
	}
	if !errors.Is(err, ErrIdentity) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("New = %v, want ErrIdentity saying the file is damaged", err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, damaged) {
		t.Fatal("the damaged identity file was replaced")
	}
}

func TestConnectNotifyDisconnect(t *testing.T) {
	a := newTestHost(t, newGate(true))
	b := newTestHost(t, newGate(true))

	type ev struct {
		p  mesh.PeerID
		up bool
	}
	var mu sync.Mutex
	var events []ev
	a.Notify(func(p mesh.PeerID, up bool) {
		mu.Lock()
		events = append(events, ev{p, up})
		mu.Unlock()
	})
	seen := func(want ...ev) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(events) < len(want) {
				return false
			}
			for i := range want {
				if events[i] != want[i] {
					t.Fatalf("events %v, want %v", events, want)
				}
			}
			return true
		}
	}

	for _, a := range b.Addrs() {
		if !strings.HasSuffix(a, "/p2p/"+string(b.ID())) {
			t.Fatalf("address %s does not end in /p2p/<id>", a)
		}
	}
	connect(t, a, b)
	eventually(t, "a is told b is up", seen(ev{b.ID(), true}))

	// A second connection (the other direction, another transport) is no
	// new "up"; closing them all is one "down".
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := b.Connect(ctx, a.Addrs()); err != nil {
		t.Fatal(err)
	}
	if err := a.Disconnect(b.ID()); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	eventually(t, "a is told b is down", seen(ev{b.ID(), true}, ev{b.ID(), false}))
	eventually(t, "b is told the connection closed", func() bool { return !has(b.Connected(), a.ID()) })
	mu.Lock()
	if len(events) != 2 {
		t.Errorf("events %v, want exactly up then down", events)
	}
	mu.Unlock()
}

func TestConnectErrors(t *testing.T) {
	a := newTestHost(t, newGate(true))
	b := newTestHost(t, newGate(true))
	c := newTestHost(t, newGate(true))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	noID := strings.Split(b.Addrs()[0], "/p2p/")[0]
	for _, tc := range []struct {
		name  string
		addrs []string
		want  string
	}{
		{"none", nil, "no address"},
		{"unparsable", []string{"/ip4/nope"}, "nope"},
		{"no peer id", []string{noID}, "/p2p/"},
		{"two peers", []string{b.Addrs()[0], c.Addrs()[0]}, "2 different peers"},
		{"own address", a.Addrs(), "own address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Connect(ctx, tc.addrs)
			if !errors.Is(err, ErrBadAddr) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Connect = %v, want ErrBadAddr mentioning %q", err, tc.want)
			}
		})
	}
}

// TestTransports connects once with only a QUIC address and once with only
// a TCP address, and checks a stream over each.
func TestTransports(t *testing.T) {
	for _, tc := range []struct{ name, part string }{
		{"quic", "/quic-v1"},
		{"tcp", "/tcp/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestHost(t, newGate(true))
			b := newTestHost(t, newGate(true))
			var e echo
			b.Handle(closedProto, e.serve)

			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			if _, err := a.Connect(ctx, addrsWith(t, b, tc.part)); err != nil {
				t.Fatalf("connect over %s: %v", tc.name, err)
			}
			pid, _ := peer.Decode(string(b.ID()))
			conns := a.host.Network().ConnsToPeer(pid)
			if len(conns) == 0 {
				t.Fatal("no connection")
			}
			for _, c := range conns {
				if !strings.Contains(c.RemoteMultiaddr().String(), tc.part) {
					t.Fatalf("connection over %s, want %s", c.RemoteMultiaddr(), tc.part)
				}
			}
			got, err := roundTrip(a, b.ID(), closedProto, "over "+tc.name)
			if err != nil || got != "over "+tc.name {
				t.Fatalf("round trip = %q, %v", got, err)
			}
		})
	}
}

func TestStreamAdmission(t *testing.T) {
	gateA, gateB := newGate(false), newGate(false)
	a := newTestHost(t, gateA)
	b := newTestHost(t, gateB)
	var open, closed echo
	b.Handle(openProto, open.serve)
	b.Handle(closedProto, closed.serve)
	connect(t, a, b)

	// Open protocols work between peers that admit nobody.
	if got, err := roundTrip(a, b.ID(), openProto, "hello"); err != nil || got != "hello" {
		t.Fatalf("open protocol round trip = %q, %v", got, err)
	}

	// a does not admit b: a refuses to ask b for a closed protocol.
	if _, err := roundTrip(a, b.ID(), closedProto, "x"); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("NewStream of a closed protocol to a peer not admitted = %v, want ErrNotAdmitted", err)
	}

	// a admits b, b does not admit a: b resets the stream before its
	// handler sees it.
	gateA.admit(b.ID(), true)
	if got, err := roundTrip(a, b.ID(), closedProto, "x"); err == nil {
		t.Fatalf("b served a closed protocol to a peer it does not admit (answer %q)", got)
	}
	if n := closed.served(); n != 0 {
		t.Fatalf("closed handler saw %d streams from a peer not admitted", n)
	}

	// b admits a: it works.
	gateB.admit(a.ID(), true)
	if got, err := roundTrip(a, b.ID(), closedProto, "admitted"); err != nil || got != "admitted" {
		t.Fatalf("closed protocol round trip once admitted = %q, %v", got, err)
	}

	// Handle(proto, nil) stops serving.
	b.Handle(closedProto, nil)
	if _, err := roundTrip(a, b.ID(), closedProto, "x"); err == nil {
		t.Fatal("a protocol no longer handled still answered")
	}
}

// TestBlocked: a blocked peer gets no connection, whichever side dials, and
// over either transport.
func TestBlocked(t *testing.T) {
	for _, tc := range []struct{ name, part string }{
		{"quic", "/quic-v1"},
		{"tcp", "/tcp/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gateA := newGate(true)
			a := newTestHost(t, gateA)
			b := newTestHost(t, newGate(true))
			gateA.block(b.ID(), true)
			var ups []mesh.PeerID
			var mu sync.Mutex
			a.Notify(func(p mesh.PeerID, up bool) {
				mu.Lock()
				defer mu.Unlock()
				if up {
					ups = append(ups, p)
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()

			// a dials b: refused by a's own check, and by its gater.
			if _, err := a.Connect(ctx, addrsWith(t, b, tc.part)); !errors.Is(err, ErrBlocked) {
				t.Fatalf("a.Connect(blocked b) = %v, want ErrBlocked", err)
			}
			if _, err := a.NewStream(ctx, b.ID(), openProto); !errors.Is(err, ErrBlocked) {
				t.Fatalf("a.NewStream(blocked b) = %v, want ErrBlocked", err)
			}
			bInfo := peer.AddrInfo{ID: libp2pIDOf(t, b.ID())}
			for _, s := range addrsWith(t, b, tc.part) {
				m, _ := ma.NewMultiaddr(s)
				tr, _ := peer.SplitAddr(m)
				bInfo.Addrs = append(bInfo.Addrs, tr)
			}
			if err := a.host.Connect(ctx, bInfo); err == nil {
				t.Fatal("the gater let a dial a blocked peer")
			}

			// b dials a: a's gater refuses it once the handshake names b.
			// Over QUIC, b may see its handshake complete before a closes
			// the connection; either way it must not last, nor carry a
			// stream.
			_, err := b.Connect(ctx, addrsWith(t, a, tc.part))
			if err == nil {
				eventually(t, "a closes the blocked peer's connection", func() bool {
					return !has(b.Connected(), a.ID())
				})
			}
			if _, err := roundTrip(b, a.ID(), openProto, "x"); err == nil {
				t.Fatal("a blocked peer opened a stream")
			}
			if has(a.Connected(), b.ID()) {
				t.Fatal("a lists a blocked peer as connected")
			}
			time.Sleep(quietFor) // give a stray notification time to show up
			mu.Lock()
			defer mu.Unlock()
			if len(ups) != 0 {
				t.Fatalf("a was told %v came up", ups)
			}
		})
	}
}

func libp2pIDOf(t *testing.T, p mesh.PeerID) peer.ID {
	t.Helper()
	id, err := libp2pID(p)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestDefaultListen starts two hosts with the default listen addresses:
// the second finds port 4001 taken (by the first, or by something else on
// the machine) and falls back to free ports.
func TestDefaultListen(t *testing.T) {
	o1 := testOptions(t, newGate(true))
	o1.Listen = nil
	o2 := testOptions(t, newGate(true))
	o2.Listen = nil
	a := startHost(t, o1)
	b := startHost(t, o2)
	ports := func(h *Host) map[string]bool {
		m := map[string]bool{}
		for _, l := range h.host.Network().ListenAddresses() {
			for _, p := range []int{ma.P_TCP, ma.P_UDP} {
				if v, err := l.ValueForProtocol(p); err == nil {
					m[ma.ProtocolWithCode(p).Name+"/"+v] = true
				}
			}
		}
		return m
	}
	pa, pb := ports(a), ports(b)
	t.Logf("first host on %v, second on %v", pa, pb)
	if len(pa) == 0 || len(pb) == 0 {
		t.Fatalf("listening on %v and %v", pa, pb)
	}
	for _, p := range []string{"tcp/4001", "udp/4001"} {
		if pa[p] && pb[p] {
			t.Fatalf("both hosts listen on %s", p)
		}
	}
	connect(t, a, b)
}

// TestNATAndMDNS starts hosts with NAT traversal and mDNS on (port
// mapping, AutoNAT, hole punching, relay client and service, autorelay
// from connected peers or from a static relay) and checks they work as
// hosts and close cleanly. Whether a NAT is crossed cannot be tested on
// loopback.
func TestNATAndMDNS(t *testing.T) {
	oa := testOptions(t, newGate(true))
	oa.NAT, oa.MDNS = true, true
	a := startHost(t, oa)
	ob := testOptions(t, newGate(true))
	ob.NAT, ob.MDNS = true, true
	ob.Relays = addrsWith(t, a, "/tcp/")
	b := startHost(t, ob)
	var e echo
	b.Handle(closedProto, e.serve)
	connect(t, a, b)
	if got, err := roundTrip(a, b.ID(), closedProto, "nat"); err != nil || got != "nat" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	candidates := 0
	for range a.relayCandidates(context.Background(), 4) {
		candidates++
	}
	if candidates != 1 {
		t.Fatalf("relay candidates: %d, want b", candidates)
	}
	for _, h := range []*Host{a, b} {
		if err := h.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
}

func TestRelayACL(t *testing.T) {
	g := newGate(false)
	ids := make([]peer.ID, 3)
	for i := range ids {
		_, id, err := LoadIdentity(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = libp2pIDOf(t, id)
	}
	member, stranger, blocked := ids[0], ids[1], ids[2]
	g.admit(meshID(member), true)
	g.block(meshID(blocked), true)
	acl := relayACL{gate: g}
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"member reserves", acl.AllowReserve(member, nil), true},
		{"stranger reserves", acl.AllowReserve(stranger, nil), false},
		{"stranger reaches member", acl.AllowConnect(stranger, nil, member), true},
		{"member reaches stranger", acl.AllowConnect(member, nil, stranger), false},
		{"blocked reaches member", acl.AllowConnect(blocked, nil, member), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestMDNSDiscovery: two hosts with mDNS on find and connect to each other
// without being given an address.
func TestMDNSDiscovery(t *testing.T) {
	if !haveMulticast() {
		t.Skip("no network interface here carries multicast: mDNS cannot work")
	}
	oa := testOptions(t, newGate(true))
	oa.MDNS = true
	a := startHost(t, oa)
	ob := testOptions(t, newGate(true))
	ob.MDNS = true
	b := startHost(t, ob)
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(a.Connected(), b.ID()) {
		if time.Now().After(deadline) {
			t.Fatal("the hosts did not find each other by mDNS in 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func haveMulticast() bool {
	ifs, err := net.Interfaces()
	if err != nil {
		return false
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagMulticast != 0 {
			return true
		}
	}
	return false
}
