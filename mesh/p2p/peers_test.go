package p2p

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// TestPeerCacheReconnect: a host restarted on the same data dir reaches a
// peer it knew without being given its address.
func TestPeerCacheReconnect(t *testing.T) {
	gateA := newGate(true)
	oa := testOptions(t, gateA)
	a := startHost(t, oa)
	b := newTestHost(t, newGate(true))
	x := newTestHost(t, newGate(true))
	var e echo
	b.Handle(openProto, e.serve)
	connect(t, a, b)
	connect(t, a, x)
	gateA.block(x.ID(), true) // blocked peers are not remembered
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(oa.DataDir, PeersFile))
	if err != nil {
		t.Fatalf("peer cache: %v", err)
	}
	if !strings.Contains(string(data), string(b.ID())) {
		t.Fatalf("peer cache does not name b:\n%s", data)
	}
	if strings.Contains(string(data), string(x.ID())) {
		t.Fatalf("peer cache names a blocked peer:\n%s", data)
	}

	a2 := startHost(t, oa)
	eventually(t, "b sees the old a gone", func() bool { return !has(b.Connected(), a.ID()) })
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if n := a2.ConnectKnown(ctx); n != 1 {
		t.Fatalf("ConnectKnown = %d, want 1", n)
	}
	if !has(a2.Connected(), b.ID()) {
		t.Fatal("ConnectKnown reported b but a2 is not connected to it")
	}
	if has(a2.Connected(), x.ID()) {
		t.Fatal("a2 dialled a blocked peer")
	}

	// By id alone, a stream dials a known peer too.
	if err := a2.Disconnect(b.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a2 disconnected from b", func() bool { return !has(a2.Connected(), b.ID()) })
	if got, err := roundTrip(a2, b.ID(), openProto, "by id"); err != nil || got != "by id" {
		t.Fatalf("stream to a known peer by id = %q, %v", got, err)
	}
}

// TestPeerCacheDamaged: a damaged cache is only a warning.
func TestPeerCacheDamaged(t *testing.T) {
	o := testOptions(t, newGate(true))
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.DataDir, PeersFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if n := h.ConnectKnown(ctx); n != 0 {
		t.Fatalf("ConnectKnown = %d with no usable cache", n)
	}
}

// TestPeerBookBounds: the cache keeps admitted peers first, then the most
// recently seen, up to maxCachedPeers, and drops blocked ones.
func TestPeerBookBounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), PeersFile)
	b, err := loadPeerBook(path)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := ma.NewMultiaddr("/ip4/127.0.0.1/tcp/4001")
	var ids []peer.ID
	for i := 0; i < maxCachedPeers+10; i++ {
		_, id, err := LoadIdentity(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		p := libp2pIDOf(t, id)
		ids = append(ids, p)
		b.seen(p)
		b.setAddrs(p, []ma.Multiaddr{addr})
	}
	oldest, newest, blocked := ids[0], ids[len(ids)-1], ids[len(ids)-2]
	err = b.save(
		func(p peer.ID) bool { return p == blocked },
		func(p peer.ID) bool { return p == oldest },
	)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := loadPeerBook(path)
	if err != nil {
		t.Fatal(err)
	}
	l := b2.list()
	if len(l) != maxCachedPeers {
		t.Fatalf("%d peers kept, want %d", len(l), maxCachedPeers)
	}
	kept := map[peer.ID]bool{}
	for _, info := range l {
		kept[info.ID] = true
	}
	if !kept[oldest] || !kept[newest] || kept[blocked] || kept[ids[1]] {
		t.Fatalf("kept oldest admitted %v, newest %v, blocked %v, second oldest %v; want true, true, false, false",
			kept[oldest], kept[newest], kept[blocked], kept[ids[1]])
	}
}
