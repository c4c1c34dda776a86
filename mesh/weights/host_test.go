package weights

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// newHostPeer starts a libp2p host on loopback (TCP only: the weights'
// own QUIC is what these tests keep out of reach) and returns it with its
// identity key, which the weights use too.
func newHostPeer(t *testing.T) (*p2p.Host, testPeer) {
	t.Helper()
	dir := t.TempDir()
	h, err := p2p.New(context.Background(), p2p.Options{DataDir: dir, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Gate: admitAll{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	sk, id, err := p2p.LoadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sk.Raw()
	if err != nil {
		t.Fatal(err)
	}
	return h, testPeer{key: ed25519.PrivateKey(raw), id: id}
}

// hostHolder starts a holder of h serving over its libp2p host (its
// weights gate admitting the fetcher if admit), and a fetcher's host
// connected to it.
func hostHolder(t *testing.T, h Holdings, admit bool) (holder testPeer, fetchHost *p2p.Host, me testPeer) {
	t.Helper()
	holderHost, holder := newHostPeer(t)
	fetchHost, me = newHostPeer(t)
	g := gate{me.id: admit}
	srv, err := Listen("127.0.0.1:0", ServerConfig{Key: holder.key, Gate: g, Holdings: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	holderHost.Handle(ProtocolID, srv.ServeStream)
	if _, err := fetchHost.Connect(context.Background(), holderHost.Addrs()); err != nil {
		t.Fatal(err)
	}
	return holder, fetchHost, me
}

// silentUDP is an address where nothing answers: a QUIC dial to it waits
// until it gives up, as one to a peer behind NAT does.
func silentUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.LocalAddr().String()
}

// TestFetchOverHost fetches from a holder the fetcher cannot reach over
// QUIC, once with no address at all and once with one where nothing
// answers: both go over the libp2p hosts' streams.
func TestFetchOverHost(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 5*chunks.ChunkSize+77)
	m := w.manifest(t, b, 1, 1, 10)
	h := &holding{m: m, b: b}
	holder, fetchHost, me := hostHolder(t, h, true)
	ctx := context.Background()
	f := newFetcher(t, me, FetcherConfig{Host: fetchHost, FallbackAfter: 300 * time.Millisecond, PerRequest: 2})

	for _, tc := range []struct {
		name  string
		addrs []string
	}{
		{"no address", nil},
		{"unreachable QUIC", []string{silentUDP(t)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.reads.Store(0)
			src := Source{Peer: holder.id, Addrs: tc.addrs}
			got, err := f.Manifest(ctx, src, m.Bundle)
			if err != nil || got.Bundle != m.Bundle {
				t.Fatalf("manifest over the host: %v", err)
			}
			path := filepath.Join(t.TempDir(), "b")
			if err := f.Fetch(ctx, m, []Source{src}, path, nil); err != nil {
				t.Fatal(err)
			}
			checkBundle(t, path, b)
			if h.reads.Load() != int64(len(b)) {
				t.Errorf("the holder read %d bytes for a %d-byte bundle", h.reads.Load(), len(b))
			}
		})
	}

	// Without a host to fall back on, the unreachable address is an error.
	direct := newFetcher(t, me, FetcherConfig{StallTimeout: 300 * time.Millisecond})
	err := direct.Fetch(ctx, m, []Source{{Peer: holder.id, Addrs: []string{silentUDP(t)}}}, filepath.Join(t.TempDir(), "b"), nil)
	if !errors.Is(err, ErrNoSource) {
		t.Errorf("a fetch with no way to the holder: %v, want ErrNoSource", err)
	}
}

// TestHostStreamsAreGated refuses a peer the weights' gate does not
// admit, even when its host let the stream through.
func TestHostStreamsAreGated(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, chunks.ChunkSize)
	m := w.manifest(t, b, 1, 1, 10)
	h := &holding{m: m, b: b}
	holder, fetchHost, me := hostHolder(t, h, false)
	ctx := context.Background()
	f := newFetcher(t, me, FetcherConfig{Host: fetchHost, StallTimeout: 2 * time.Second})
	err := f.Fetch(ctx, m, []Source{{Peer: holder.id}}, filepath.Join(t.TempDir(), "b"), nil)
	if !errors.Is(err, ErrNoSource) || h.reads.Load() != 0 {
		t.Errorf("a peer the gate does not admit: %v, %d bytes read", err, h.reads.Load())
	}
}

// TestFetchLearnsNewSources starts a fetch from one slow holder and adds
// a fast one while it runs: the new one serves part of the bundle.
func TestFetchLearnsNewSources(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 24*chunks.ChunkSize)
	m := w.manifest(t, b, 1, 1, 10)
	me := newTestPeer(t)
	slowH := &holding{m: m, b: b, delay: 100 * time.Millisecond}
	slow, _ := serve(t, slowH, me.id)
	fastH := &holding{m: m, b: b}
	fast, _ := serve(t, fastH, me.id)
	f := newFetcher(t, me, FetcherConfig{PerRequest: 4, Streams: 1})

	// The feed's variables change only before the channel it handed out
	// closes, and are read after.
	sources, changed := []Source{slow}, make(chan struct{})
	feed := func() ([]Source, <-chan struct{}) { return sources, changed }
	path := filepath.Join(t.TempDir(), "b")
	err := f.FetchFrom(context.Background(), m, feed, path, func(p Progress) {
		if len(sources) == 1 { // the first chunk is in: a second holder offers the version
			old := changed
			sources, changed = []Source{slow, fast}, make(chan struct{})
			close(old)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	checkBundle(t, path, b)
	if fastH.reads.Load() == 0 || slowH.reads.Load()+fastH.reads.Load() != int64(len(b)) {
		t.Errorf("the slow holder read %d bytes, the one added later %d, for a %d-byte bundle", slowH.reads.Load(), fastH.reads.Load(), len(b))
	}
}
