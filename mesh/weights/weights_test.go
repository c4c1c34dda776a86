package weights

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

type testPeer struct {
	key ed25519.PrivateKey
	id  mesh.PeerID
}

func newTestPeer(t testing.TB) testPeer {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sk, err := ic.UnmarshalEd25519PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	return testPeer{key: key, id: mesh.PeerID(id.String())}
}

// world is a mesh admin, a certified trainer, and the admin's set of three
// voters (the trainer one of them).
type world struct {
	admin   ed25519.PrivateKey
	trainer testPeer
	cert    *member.Certificate
	meshID  string
	voters  []testPeer
	set     *member.VoterSet
}

func newWorld(t testing.TB) *world {
	t.Helper()
	_, admin, _ := ed25519.GenerateKey(rand.Reader)
	w := &world{admin: admin, trainer: newTestPeer(t)}
	w.cert = w.issue(t, w.trainer, member.RoleTrainer)
	w.meshID = member.MeshIDOf(admin.Public().(ed25519.PublicKey))
	w.voters = []testPeer{w.trainer, newTestPeer(t), newTestPeer(t)}
	w.set = voterSet(t, admin, 1, w.voters...)
	return w
}

// voterSet signs, with the admin's key, the set of voters numbered seq.
func voterSet(t testing.TB, admin ed25519.PrivateKey, seq uint64, voters ...testPeer) *member.VoterSet {
	t.Helper()
	vs := make([]member.Voter, len(voters))
	for i, v := range voters {
		vs[i] = member.Voter{Peer: string(v.id), Key: v.key.Public().(ed25519.PublicKey)}
	}
	s, err := member.NewVoterSet(admin, seq, vs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// certify attaches to m the votes of by under vs, then signs it with the
// trainer's key and certificate; it says whether the votes reach vs's
// quorum.
func certify(t testing.TB, m *chunks.Manifest, vs *member.VoterSet, by []testPeer, key ed25519.PrivateKey, cert *member.Certificate) bool {
	t.Helper()
	var votes []chunks.Vote
	for _, p := range by {
		v, err := m.VoteFor(p.key, string(p.id), vs)
		if err != nil {
			t.Fatal(err)
		}
		votes = append(votes, v)
	}
	ok := m.Certify(vs, votes)
	if err := m.Sign(key, cert, time.Now()); err != nil {
		t.Fatal(err)
	}
	return ok
}

func (w *world) issue(t testing.TB, p testPeer, role member.Role) *member.Certificate {
	t.Helper()
	c, err := member.IssueCertificate(w.admin, nil, member.CertSpec{Subject: string(p.id), SubjectKey: p.key.Public().(ed25519.PublicKey), Role: role}, t0, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// manifest is a manifest for b as version v at term/index, certified by
// the world's voters and signed by its trainer.
func (w *world) manifest(t testing.TB, b []byte, v, term, index uint64) *chunks.Manifest {
	t.Helper()
	m, err := chunks.NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.MeshID, m.Version, m.Parent, m.Base, m.AdapterHash, m.ParentHash, m.Term, m.Index = w.meshID, v, v-1, "tiny", "abc", "parent", term, index
	certify(t, m, w.set, w.voters, w.trainer.key, w.cert)
	return m
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestPackUnpack(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"r":4}`), 0o600)
	os.WriteFile(filepath.Join(dir, WeightsFile), []byte("weights"), 0o600)
	b, err := Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "v1")
	if err := Unpack(b, out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ConfigFile, WeightsFile} {
		a, _ := os.ReadFile(filepath.Join(dir, f))
		c, _ := os.ReadFile(filepath.Join(out, f))
		if !bytes.Equal(a, c) {
			t.Errorf("%s differs after unpacking", f)
		}
	}
	if _, _, err := Split([]byte{0, 0, 1, 0}); !errors.Is(err, ErrBundle) {
		t.Errorf("a config longer than the bundle: %v", err)
	}
}

// gate admits a fixed set of peers.
type gate map[mesh.PeerID]bool

func (g gate) Admitted(p mesh.PeerID) bool { return g[p] }

// holding serves one bundle, counting the chunk bytes it reads; corrupt
// flips a bit of every chunk it serves, stall blocks every read.
type holding struct {
	m       *chunks.Manifest
	b       []byte
	corrupt bool
	stall   chan struct{}
	delay   time.Duration // slept before every read
	reads   atomic.Int64
}

func (h *holding) Open(id [sha256.Size]byte) (*chunks.Manifest, io.ReaderAt, bool) {
	if id != h.m.Bundle && id != ([sha256.Size]byte{}) {
		return nil, nil, false
	}
	return h.m, h, true
}

func (h *holding) ReadAt(p []byte, off int64) (int, error) {
	if h.stall != nil {
		<-h.stall
		return 0, io.ErrUnexpectedEOF
	}
	time.Sleep(h.delay)
	h.reads.Add(int64(len(p)))
	n := copy(p, h.b[off:])
	if h.corrupt && n > 0 {
		p[n/2] ^= 1
	}
	return n, nil
}

// serve starts a server for h on loopback, admitting fetcher.
func serve(t testing.TB, h Holdings, admit ...mesh.PeerID) (Source, *Server) {
	t.Helper()
	return serveWith(t, ServerConfig{Holdings: h}, admit...)
}

// serveWith is serve with the rest of cfg.
func serveWith(t testing.TB, cfg ServerConfig, admit ...mesh.PeerID) (Source, *Server) {
	t.Helper()
	p := newTestPeer(t)
	g := gate{}
	for _, a := range admit {
		g[a] = true
	}
	cfg.Key, cfg.Gate = p.key, g
	s, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return Source{Peer: p.id, Addrs: []string{s.Addr().String()}}, s
}

func newFetcher(t testing.TB, p testPeer, cfg FetcherConfig) *Fetcher {
	t.Helper()
	cfg.Key = p.key
	f, err := NewFetcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func checkBundle(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the fetched bundle differs from the original")
	}
	if _, err := os.Stat(path + ".part"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the partial file is still there: %v", err)
	}
}

func TestFetchFromSeveralSources(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 11*chunks.ChunkSize+123)
	m := w.manifest(t, b, 1, 1, 10)
	me := newTestPeer(t)
	var hs []*holding
	var srcs []Source
	for range 3 {
		h := &holding{m: m, b: b}
		src, _ := serve(t, h, me.id)
		hs, srcs = append(hs, h), append(srcs, src)
	}
	f := newFetcher(t, me, FetcherConfig{PerRequest: 2, Streams: 2})
	ctx := context.Background()

	got, err := f.Manifest(ctx, srcs[0], [32]byte{})
	if err != nil || !bytes.Equal(got.Marshal(), m.Marshal()) {
		t.Fatalf("manifest: %v", err)
	}
	path := filepath.Join(t.TempDir(), "b")
	var last Progress
	backwards := false
	if err := f.Fetch(ctx, m, srcs, path, func(p Progress) {
		// One call at a time (the race detector checks it), the bytes only
		// growing.
		backwards = backwards || p.Bytes <= last.Bytes
		last = p
	}); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, path, b)
	if last.Bytes != int64(len(b)) || last.Total != int64(len(b)) || backwards {
		t.Errorf("last progress %+v, went backwards %v", last, backwards)
	}
	busy := 0
	var total int64
	for _, h := range hs {
		total += h.reads.Load()
		if h.reads.Load() > 0 {
			busy++
		}
	}
	if busy < 2 || total != int64(len(b)) {
		t.Errorf("%d of 3 sources served, %d bytes read for a %d-byte bundle", busy, total, len(b))
	}
	// Fetching what is there already only checks it.
	if err := f.Fetch(ctx, m, nil, path, nil); err != nil {
		t.Fatal(err)
	}
}

func TestFetchRefusesBadChunks(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 6*chunks.ChunkSize)
	m := w.manifest(t, b, 1, 1, 10)
	me := newTestPeer(t)
	bad, _ := serve(t, &holding{m: m, b: b, corrupt: true}, me.id)
	good := &holding{m: m, b: b}
	goodSrc, _ := serve(t, good, me.id)
	f := newFetcher(t, me, FetcherConfig{PerRequest: 1})

	path := filepath.Join(t.TempDir(), "b")
	var left map[mesh.PeerID]string
	err := f.Fetch(context.Background(), m, []Source{bad, goodSrc}, path, func(p Progress) {
		if p.Left != nil {
			left = p.Left
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	checkBundle(t, path, b)
	if left[bad.Peer] == "" {
		t.Errorf("the source that sent bad chunks was not left: %v", left)
	}

	// With only the bad source, the fetch fails and says why.
	path2 := filepath.Join(t.TempDir(), "b")
	err = f.Fetch(context.Background(), m, []Source{bad}, path2, nil)
	if !errors.Is(err, ErrNoSource) {
		t.Fatalf("fetch from a source that only sends bad chunks: %v", err)
	}
	if _, err := os.Stat(path2); err == nil {
		t.Fatal("a bundle was kept from bad chunks")
	}
}

func TestFetchResumes(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 10*chunks.ChunkSize)
	m := w.manifest(t, b, 1, 1, 10)
	me := newTestPeer(t)
	h := &holding{m: m, b: b}
	src, _ := serve(t, h, me.id)
	f := newFetcher(t, me, FetcherConfig{PerRequest: 1, Streams: 1})
	path := filepath.Join(t.TempDir(), "b")

	ctx, cancel := context.WithCancel(context.Background())
	err := f.Fetch(ctx, m, []Source{src}, path, func(p Progress) {
		if p.Bytes >= 4*chunks.ChunkSize {
			cancel()
		}
	})
	if err == nil {
		t.Fatal("a cancelled fetch succeeded")
	}
	if _, err := os.Stat(path + ".part"); err != nil {
		t.Fatalf("no partial file after a stopped fetch: %v", err)
	}
	before := h.reads.Load()

	var first *Progress
	if err := f.Fetch(context.Background(), m, []Source{src}, path, func(p Progress) {
		if first == nil {
			first = &p
		}
	}); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, path, b)
	again := h.reads.Load() - before
	if first == nil || first.Resumed < 4*chunks.ChunkSize || again > int64(len(b))-first.Resumed {
		t.Fatalf("resumed %v, then read %d more bytes of %d", first, again, len(b))
	}
}

func TestFetchLeavesStalledSource(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 4*chunks.ChunkSize)
	m := w.manifest(t, b, 1, 1, 10)
	me := newTestPeer(t)
	stall := make(chan struct{})
	stalled, _ := serve(t, &holding{m: m, b: b, stall: stall}, me.id)
	good, _ := serve(t, &holding{m: m, b: b}, me.id)
	t.Cleanup(func() { close(stall) }) // before the servers close
	// Long enough that the good source, on a loaded machine, never looks
	// stalled (300 ms was not: both sources were left).
	f := newFetcher(t, me, FetcherConfig{StallTimeout: 2 * time.Second, PerRequest: 1})
	path := filepath.Join(t.TempDir(), "b")
	var mu sync.Mutex
	var left map[mesh.PeerID]string
	if err := f.Fetch(context.Background(), m, []Source{stalled, good}, path, func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Left != nil {
			left = p.Left
		}
	}); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, path, b)
	mu.Lock()
	defer mu.Unlock()
	if left[stalled.Peer] == "" {
		t.Errorf("the stalled source was not left: %v", left)
	}
}

func TestServerChecksPeers(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 1000)
	m := w.manifest(t, b, 1, 1, 10)
	me, stranger := newTestPeer(t), newTestPeer(t)
	src, _ := serve(t, &holding{m: m, b: b}, me.id)
	ctx := context.Background()

	// A peer the mesh has not admitted gets nothing.
	if _, err := newFetcher(t, stranger, FetcherConfig{StallTimeout: 2 * time.Second}).Manifest(ctx, src, m.Bundle); err == nil {
		t.Fatal("a peer that is not admitted fetched a manifest")
	}
	// A fetcher dialling a peer id that is not the server's refuses it.
	wrong := Source{Peer: newTestPeer(t).id, Addrs: src.Addrs}
	if _, err := newFetcher(t, me, FetcherConfig{StallTimeout: 2 * time.Second}).Manifest(ctx, wrong, m.Bundle); err == nil {
		t.Fatal("the fetcher accepted a server that is not the peer it dialled")
	}
	if got, err := newFetcher(t, me, FetcherConfig{}).Manifest(ctx, src, m.Bundle); err != nil || got.Version != 1 {
		t.Fatalf("the admitted peer: %v", err)
	}
	// An unknown bundle is not found.
	var other [32]byte
	other[0] = 1
	var re *remoteError
	if _, err := newFetcher(t, me, FetcherConfig{}).Manifest(ctx, src, other); !errors.As(err, &re) || re.status != statusNotFound {
		t.Fatalf("unknown bundle: %v", err)
	}
}

func TestAdvertise(t *testing.T) {
	la := &net.UDPAddr{IP: net.IPv4zero, Port: 4242}
	got := advertise(la, []string{"/ip4/127.0.0.1/tcp/1/p2p/x", "/ip4/192.168.1.7/udp/2/quic-v1/p2p/x", "/ip6/::1/tcp/3", "/dns4/example.org/tcp/4", "/ip4/192.168.1.7/tcp/5",
		"/ip4/203.0.113.9/udp/4001/quic-v1/p2p/relay/p2p-circuit/p2p/x"})
	want := []string{"192.168.1.7:4242", "127.0.0.1:4242", "[::1]:4242"}
	if !slices.Equal(got, want) {
		t.Errorf("advertise on every interface: %v, want %v", got, want)
	}
	if got := advertise(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil); !slices.Equal(got, []string{"127.0.0.1:9"}) {
		t.Errorf("advertise on loopback: %v", got)
	}
}

// TestFetchBusySource: a holder serving as many requests as it will
// answers busy; the fetch does not leave it, takes the chunks from the
// other holder meanwhile, and asks it again later.
func TestFetchBusySource(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 16*chunks.ChunkSize)
	m := w.manifest(t, b, 1, 1, 10)
	me := newTestPeer(t)
	for _, alone := range []bool{true, false} {
		busyH := &holding{m: m, b: b, delay: 50 * time.Millisecond}
		busy, busySrv := serveWith(t, ServerConfig{Holdings: busyH, MaxServing: 1}, me.id)
		sources := []Source{busy}
		otherH := &holding{m: m, b: b, delay: 50 * time.Millisecond}
		if !alone {
			other, _ := serve(t, otherH, me.id)
			sources = append(sources, other)
		}
		f := newFetcher(t, me, FetcherConfig{Streams: 2, PerRequest: 2})
		path := filepath.Join(t.TempDir(), "b")
		var mu sync.Mutex
		var left map[mesh.PeerID]string
		if err := f.Fetch(context.Background(), m, sources, path, func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			left = p.Left
		}); err != nil {
			t.Fatalf("alone %v: %v", alone, err)
		}
		checkBundle(t, path, b)
		if busySrv.busy.Load() == 0 || len(left) != 0 {
			t.Errorf("alone %v: %d busy answers, sources left %v", alone, busySrv.busy.Load(), left)
		}
		if n := busyH.reads.Load() + otherH.reads.Load(); n != int64(len(b)) || busyH.reads.Load() == 0 {
			t.Errorf("alone %v: the busy holder read %d bytes, the other %d, of %d", alone, busyH.reads.Load(), otherH.reads.Load(), len(b))
		}
	}
}
