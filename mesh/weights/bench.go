package weights

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/quic-go/quic-go"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// BenchOptions configures Bench.
type BenchOptions struct {
	// Size is the bundle's size (default 64 MiB).
	Size int
	// Fetchers is the most fetchers of the fan-out (default 8; runs 1, 2,
	// 4, ... up to it).
	Fetchers int
	// Dir is where bundles are written (default a temporary directory,
	// removed after).
	Dir string
}

// Rate is one transfer's figures.
type Rate struct {
	Seconds  float64 `json:"seconds"`
	MBps     float64 `json:"mb_per_s"`
	CPUPerGB float64 `json:"cpu_s_per_gb"`
}

// FanOut is one size of the fan-out: n fetchers at once from the trainer
// alone, then n fetchers in doubling waves whose sources are the trainer
// and every fetcher done before (re-serving).
type FanOut struct {
	Fetchers         int     `json:"fetchers"`
	DirectSeconds    float64 `json:"direct_s"`
	DirectTrainerMB  float64 `json:"direct_trainer_mb"`
	ReserveSeconds   float64 `json:"reserve_s"`
	ReserveTrainerMB float64 `json:"reserve_trainer_mb"`
	ReserveMaxPeerMB float64 `json:"reserve_max_peer_mb"`
}

// BenchReport is what Bench measured.
type BenchReport struct {
	Bytes int64 `json:"bytes"`
	// Ours fetches a bundle through the protocol (hashing and verifying
	// every chunk, writing to disk, fsync, rename); Bare streams the same
	// bytes over one quic-go stream with the same TLS and windows, to
	// memory; TLS copies them over TLS on TCP. Each is the best of three
	// rounds in which the three take turns.
	Ours   Rate     `json:"ours"`
	Bare   Rate     `json:"bare_quic"`
	TLS    Rate     `json:"tls_tcp"`
	Ratio  float64  `json:"ours_vs_bare"`
	FanOut []FanOut `json:"fan_out"`
	// OverHost is Ours over the mesh host's streams (libp2p over QUIC on
	// loopback), as for a source behind NAT, taking its turn in the same
	// rounds; HostRatio is OverHost / Ours.
	OverHost  Rate    `json:"over_host"`
	HostRatio float64 `json:"host_vs_ours"`
	// Certify is what certification costs.
	Certify CertifyCost `json:"certify"`
}

// CertifyCost is what certifying a version costs: a voter's vote
// (VoteFor), and a device's check of a manifest that carries the votes of
// every voter of a set (VerifyCertified: the admin's signature over the
// set, then each vote), for sets of 1, 3, 5 and 7 voters.
type CertifyCost struct {
	VoteMicros float64      `json:"vote_us"`
	Verify     []VerifyCost `json:"verify"`
}

// VerifyCost is one VerifyCertified's time for a set of Voters.
type VerifyCost struct {
	Voters int     `json:"voters"`
	Micros float64 `json:"us"`
}

// cpu returns the process's user+system CPU time.
func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rate(n int64, wall, c time.Duration) Rate {
	return Rate{Seconds: wall.Seconds(), MBps: float64(n) / (1 << 20) / wall.Seconds(), CPUPerGB: c.Seconds() / (float64(n) / (1 << 30))}
}

// admitAll is the bench's gate: every peer is a member, none blocked.
type admitAll struct{}

func (admitAll) Admitted(mesh.PeerID) bool { return true }
func (admitAll) Blocked(mesh.PeerID) bool  { return false }

// benchHost starts a libp2p host on loopback QUIC with the identity kept
// in dir, and returns it with that identity's key.
func benchHost(ctx context.Context, dir string) (*p2p.Host, ed25519.PrivateKey, mesh.PeerID, error) {
	h, err := p2p.New(ctx, p2p.Options{DataDir: dir, Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, Gate: admitAll{}})
	if err != nil {
		return nil, nil, "", err
	}
	sk, id, err := p2p.LoadIdentity(dir)
	var raw []byte
	if err == nil {
		raw, err = sk.Raw()
	}
	if err != nil {
		h.Close()
		return nil, nil, "", err
	}
	return h, ed25519.PrivateKey(raw), id, nil
}

// counted serves a Holdings, counting the chunk bytes read.
type counted struct {
	h Holdings
	n atomic.Int64
}

func (c *counted) Open(id [32]byte) (*chunks.Manifest, io.ReaderAt, bool) {
	m, r, ok := c.h.Open(id)
	if !ok {
		return nil, nil, false
	}
	return m, countingReader{r, &c.n}, true
}

type countingReader struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// Bytes passes on the reader's in-memory bytes, if it has them.
func (c countingReader) Bytes(off int64, n int) ([]byte, bool) {
	m, ok := c.r.(inMemory)
	if !ok {
		return nil, false
	}
	b, ok := m.Bytes(off, n)
	if ok {
		c.n.Add(int64(n))
	}
	return b, ok
}

// Close closes the reader, if it is an io.Closer.
func (c countingReader) Close() error {
	if cl, ok := c.r.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

func benchKey() (ed25519.PrivateKey, mesh.PeerID, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	sk, _ := ic.UnmarshalEd25519PrivateKey(key)
	id, err := peer.IDFromPrivateKey(sk)
	return key, mesh.PeerID(id.String()), err
}

// Bench measures the weight service on loopback: one bundle fetched
// through the protocol against bare quic-go and TLS over TCP moving the
// same bytes, then the fan-out.
func Bench(ctx context.Context, o BenchOptions) (*BenchReport, error) {
	if o.Size <= 0 {
		o.Size = 64 << 20
	}
	if o.Fetchers <= 0 {
		o.Fetchers = 8
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "clawmesh-bench-weights-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	b := make([]byte, o.Size)
	rand.Read(b)
	// A mesh of one trainer to sign the manifest, its libp2p host and a
	// fetcher's.
	_, admin, _ := ed25519.GenerateKey(rand.Reader)
	thost, tkey, tid, err := benchHost(ctx, filepath.Join(o.Dir, "host-trainer"))
	if err != nil {
		return nil, err
	}
	defer thost.Close()
	fhost, fkey, _, err := benchHost(ctx, filepath.Join(o.Dir, "host-fetcher"))
	if err != nil {
		return nil, err
	}
	defer fhost.Close()
	if _, err := fhost.Connect(ctx, thost.Addrs()); err != nil {
		return nil, err
	}
	cert, err := member.IssueCertificate(admin, nil, member.CertSpec{Subject: string(tid), SubjectKey: tkey.Public().(ed25519.PublicKey), Role: member.RoleTrainer}, time.Now(), rand.Reader)
	if err != nil {
		return nil, err
	}
	m, err := chunks.NewManifest(b)
	if err != nil {
		return nil, err
	}
	m.MeshID, m.Version, m.Term, m.Index = cert.MeshID(), 1, 1, 1
	// The trainer is the mesh's one voter: the manifest carries its vote,
	// and is checked as a device checks it before fetching.
	vs, err := member.NewVoterSet(admin, 1, []member.Voter{{Peer: string(tid), Key: tkey.Public().(ed25519.PublicKey)}}, time.Now())
	if err != nil {
		return nil, err
	}
	vote, err := m.VoteFor(tkey, string(tid), vs)
	if err != nil {
		return nil, err
	}
	m.Certify(vs, []chunks.Vote{vote})
	if err := m.Sign(tkey, cert, time.Now()); err != nil {
		return nil, err
	}
	if err := m.VerifyCertified(admin.Public().(ed25519.PublicKey), vs); err != nil {
		return nil, err
	}
	src, err := OpenDir(filepath.Join(o.Dir, "trainer"))
	if err != nil {
		return nil, err
	}
	defer src.Close()
	if err := src.Add(m, b); err != nil {
		return nil, err
	}
	trainer := &counted{h: src}
	srv, err := Listen("127.0.0.1:0", ServerConfig{Key: tkey, Gate: admitAll{}, Holdings: trainer})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	thost.Handle(ProtocolID, srv.ServeStream)
	tsrc := Source{Peer: tid, Addrs: []string{srv.Addr().String()}}
	r := &BenchReport{Bytes: int64(len(b))}

	// Ours, bare quic-go and TLS take turns, three rounds, and each keeps
	// its best: on a shared machine, the load changes from one second to
	// the next, and turns give each the same share of it.
	bare, err := newBareQUIC(tkey, b)
	if err != nil {
		return nil, err
	}
	defer bare.close()
	tcp, err := newTLSCopy(b)
	if err != nil {
		return nil, err
	}
	defer tcp.close()
	best := func(to *Rate, rr Rate, i int) {
		if i == 0 || rr.MBps > to.MBps {
			*to = rr
		}
	}
	for i := range 3 {
		key, _, _ := benchKey()
		f, err := NewFetcher(FetcherConfig{Key: key})
		if err != nil {
			return nil, err
		}
		path := filepath.Join(o.Dir, fmt.Sprintf("ours-%d", i))
		c0, t0 := cpu(), time.Now()
		err = f.Fetch(ctx, m, []Source{tsrc}, path, nil)
		wall, c := time.Since(t0), cpu()-c0
		f.Close()
		os.Remove(path)
		if err != nil {
			return nil, err
		}
		best(&r.Ours, rate(r.Bytes, wall, c), i)
		hf, err := NewFetcher(FetcherConfig{Key: fkey, Host: fhost})
		if err != nil {
			return nil, err
		}
		path = filepath.Join(o.Dir, fmt.Sprintf("host-%d", i))
		c0, t0 = cpu(), time.Now()
		err = hf.Fetch(ctx, m, []Source{{Peer: tid}}, path, nil)
		wall, c = time.Since(t0), cpu()-c0
		hf.Close()
		os.Remove(path)
		if err != nil {
			return nil, fmt.Errorf("over the mesh host: %w", err)
		}
		best(&r.OverHost, rate(r.Bytes, wall, c), i)
		rr, err := bare.run(ctx)
		if err != nil {
			return nil, err
		}
		best(&r.Bare, rr, i)
		if rr, err = tcp.run(); err != nil {
			return nil, err
		}
		best(&r.TLS, rr, i)
	}
	r.Ratio = r.Ours.MBps / r.Bare.MBps
	r.HostRatio = r.OverHost.MBps / r.Ours.MBps
	if r.Certify, err = benchCertify(admin, m); err != nil {
		return nil, err
	}

	for n := 1; n <= o.Fetchers; n *= 2 {
		fo, err := benchFanOut(ctx, o.Dir, m, tsrc, trainer, n)
		if err != nil {
			return nil, err
		}
		r.FanOut = append(r.FanOut, fo)
	}
	return r, nil
}

// bareQUIC serves b over one quic-go stream to each connection, with the
// same TLS identities and windows as the weight service.
type bareQUIC struct {
	id *identity
	ln *quic.Listener
	n  int
}

func newBareQUIC(key ed25519.PrivateKey, b []byte) (*bareQUIC, error) {
	id, err := newIdentity(key)
	if err != nil {
		return nil, err
	}
	tc, _ := id.config("")
	tc.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return id.config("") }
	ln, err := quic.ListenAddr("127.0.0.1:0", tc, quicConfig())
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				st, err := c.AcceptStream(context.Background())
				if err != nil {
					return
				}
				var one [1]byte
				io.ReadFull(st, one[:])
				st.Write(b)
				st.Close()
			}()
		}
	}()
	return &bareQUIC{id: id, ln: ln, n: len(b)}, nil
}

func (q *bareQUIC) close() { q.ln.Close() }

// run dials, reads the bytes to memory and measures it.
func (q *bareQUIC) run(ctx context.Context) (Rate, error) {
	ckey, _, _ := benchKey()
	cid, err := newIdentity(ckey)
	if err != nil {
		return Rate{}, err
	}
	cc, err := cid.config(q.id.id)
	if err != nil {
		return Rate{}, err
	}
	c0, t0 := cpu(), time.Now()
	conn, err := quic.DialAddr(ctx, q.ln.Addr().String(), cc, quicConfig())
	if err != nil {
		return Rate{}, err
	}
	defer conn.CloseWithError(0, "")
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return Rate{}, err
	}
	st.Write([]byte{1})
	n, err := io.Copy(io.Discard, st)
	wall, c := time.Since(t0), cpu()-c0
	if err != nil || n != int64(q.n) {
		return Rate{}, fmt.Errorf("bare quic: %d bytes: %v", n, err)
	}
	return rate(n, wall, c), nil
}

// tlsCopy serves b over TLS 1.3 on TCP to each connection.
type tlsCopy struct {
	id *identity
	ln net.Listener
	n  int
}

func newTLSCopy(b []byte) (*tlsCopy, error) {
	key, _, _ := benchKey()
	id, err := newIdentity(key)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc, _ := id.config("")
			tc.NextProtos = nil
			go func() {
				s := tls.Server(c, tc)
				s.Write(b)
				s.Close()
			}()
		}
	}()
	return &tlsCopy{id: id, ln: ln, n: len(b)}, nil
}

func (t *tlsCopy) close() { t.ln.Close() }

// run dials, reads the bytes to memory and measures it.
func (t *tlsCopy) run() (Rate, error) {
	ckey, _, _ := benchKey()
	cid, err := newIdentity(ckey)
	if err != nil {
		return Rate{}, err
	}
	cc, err := cid.config(t.id.id)
	if err != nil {
		return Rate{}, err
	}
	cc.NextProtos = nil
	c0, t0 := cpu(), time.Now()
	conn, err := tls.Dial("tcp", t.ln.Addr().String(), cc)
	if err != nil {
		return Rate{}, err
	}
	defer conn.Close()
	n, err := io.Copy(io.Discard, conn)
	wall, c := time.Since(t0), cpu()-c0
	if n != int64(t.n) {
		return Rate{}, fmt.Errorf("tls: %d bytes: %v", n, err)
	}
	return rate(n, wall, c), nil
}

// benchFanOut fetches m to n fetchers, first all from the trainer, then
// in doubling waves with every finished fetcher serving the later ones.
func benchFanOut(ctx context.Context, root string, m *chunks.Manifest, tsrc Source, trainer *counted, n int) (FanOut, error) {
	fo := FanOut{Fetchers: n}
	type fetcher struct {
		f    *Fetcher
		key  ed25519.PrivateKey
		id   mesh.PeerID
		dir  *Dir
		srv  *Server
		hold *counted
	}
	mk := func(tag string, i int) (*fetcher, error) {
		key, id, err := benchKey()
		if err != nil {
			return nil, err
		}
		f, err := NewFetcher(FetcherConfig{Key: key})
		if err != nil {
			return nil, err
		}
		d, err := OpenDir(filepath.Join(root, fmt.Sprintf("%s-%d-%d", tag, n, i)))
		if err != nil {
			return nil, err
		}
		return &fetcher{f: f, key: key, id: id, dir: d}, nil
	}
	run := func(fs []*fetcher, sources []Source) error {
		var wg sync.WaitGroup
		errs := make([]error, len(fs))
		for i, x := range fs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = x.dir.Fetch(ctx, x.f, m, sources, nil)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	var all []*fetcher
	defer func() {
		for _, x := range all {
			x.f.Close()
			if x.srv != nil {
				x.srv.Close()
			}
			x.dir.Close()
			os.RemoveAll(x.dir.Path())
		}
	}()

	// Direct: n at once from the trainer.
	var direct []*fetcher
	for i := range n {
		x, err := mk("direct", i)
		if err != nil {
			return fo, err
		}
		direct, all = append(direct, x), append(all, x)
	}
	before, t0 := trainer.n.Load(), time.Now()
	if err := run(direct, []Source{tsrc}); err != nil {
		return fo, err
	}
	fo.DirectSeconds, fo.DirectTrainerMB = time.Since(t0).Seconds(), float64(trainer.n.Load()-before)/(1<<20)

	// Re-serving: waves of 1, 2, 4, ...; each fetcher that is done serves.
	sources := []Source{tsrc}
	var done []*fetcher
	before, t0 = trainer.n.Load(), time.Now()
	for left, wave := n, 1; left > 0; wave *= 2 {
		k := min(wave, left)
		var ws []*fetcher
		for i := range k {
			x, err := mk("reserve", n-left+i)
			if err != nil {
				return fo, err
			}
			ws, all = append(ws, x), append(all, x)
		}
		if err := run(ws, sources); err != nil {
			return fo, err
		}
		for _, x := range ws {
			x.hold = &counted{h: x.dir}
			srv, err := Listen("127.0.0.1:0", ServerConfig{Key: x.key, Gate: admitAll{}, Holdings: x.hold})
			if err != nil {
				return fo, err
			}
			x.srv = srv
			sources = append(sources, Source{Peer: x.id, Addrs: []string{srv.Addr().String()}})
			done = append(done, x)
		}
		left -= k
	}
	fo.ReserveSeconds, fo.ReserveTrainerMB = time.Since(t0).Seconds(), float64(trainer.n.Load()-before)/(1<<20)
	for _, x := range done {
		fo.ReserveMaxPeerMB = max(fo.ReserveMaxPeerMB, float64(x.hold.n.Load())/(1<<20))
	}
	return fo, nil
}

// benchCertify measures a vote and VerifyCertified for m under sets of 1,
// 3, 5 and 7 voters, every voter voting.
func benchCertify(admin ed25519.PrivateKey, m *chunks.Manifest) (CertifyCost, error) {
	var c CertifyCost
	var keys []ed25519.PrivateKey
	var voters []member.Voter
	for len(voters) < 7 {
		key, id, err := benchKey()
		if err != nil {
			return c, err
		}
		keys, voters = append(keys, key), append(voters, member.Voter{Peer: string(id), Key: key.Public().(ed25519.PublicKey)})
	}
	for _, n := range []int{1, 3, 5, 7} {
		vs, err := member.NewVoterSet(admin, uint64(n), voters[:n], time.Now())
		if err != nil {
			return c, err
		}
		votes := make([]chunks.Vote, n)
		for i := range n {
			if votes[i], err = m.VoteFor(keys[i], voters[i].Peer, vs); err != nil {
				return c, err
			}
		}
		cm := *m
		if !cm.Certify(vs, votes) {
			return c, fmt.Errorf("weights: %d votes of %d voters are no quorum", n, n)
		}
		pub := admin.Public().(ed25519.PublicKey)
		var verr error
		d := timeEach(func() {
			if err := cm.VerifyCertified(pub, vs); err != nil {
				verr = err
			}
		})
		if verr != nil {
			return c, verr
		}
		c.Verify = append(c.Verify, VerifyCost{Voters: n, Micros: d.Seconds() * 1e6})
		if n == 1 {
			d := timeEach(func() { m.VoteFor(keys[0], voters[0].Peer, vs) })
			c.VoteMicros = d.Seconds() * 1e6
		}
	}
	return c, nil
}

// timeEach is the mean time of one call of f, called for at least 100 ms
// and 10 times.
func timeEach(f func()) time.Duration {
	start := time.Now()
	n := 0
	for n < 10 || time.Since(start) < 100*time.Millisecond {
		f()
		n++
	}
	return time.Since(start) / time.Duration(n)
}

// Print writes the report for people.
func (r *BenchReport) Print(w io.Writer) {
	fmt.Fprintf(w, "weights over QUIC on loopback, a %.0f MiB bundle (best of 3 each):\n", float64(r.Bytes)/(1<<20))
	row := func(name string, x Rate) {
		fmt.Fprintf(w, "  %-46s %7.1f MiB/s  %5.2f s  %5.2f CPU s/GB\n", name, x.MBps, x.Seconds, x.CPUPerGB)
	}
	row("clawmesh fetch (verify, write, fsync, rename)", r.Ours)
	row("bare quic-go stream (to memory)", r.Bare)
	row("TLS 1.3 over TCP (to memory)", r.TLS)
	fmt.Fprintf(w, "  ours / bare quic-go: %.2fx (goal >= 0.8x)\n", r.Ratio)
	row("clawmesh fetch over the mesh host (libp2p)", r.OverHost)
	fmt.Fprintf(w, "  over the host / ours: %.2fx (a source QUIC cannot reach, behind NAT)\n", r.HostRatio)
	fmt.Fprintln(w, "fan-out: n fetchers from the trainer alone, then in doubling waves that re-serve:")
	fmt.Fprintln(w, "  fetchers  direct s  trainer MiB  |  re-served s  trainer MiB  busiest peer MiB")
	for _, f := range r.FanOut {
		fmt.Fprintf(w, "  %8d  %8.2f  %11.0f  |  %11.2f  %11.0f  %16.0f\n", f.Fetchers, f.DirectSeconds, f.DirectTrainerMB, f.ReserveSeconds, f.ReserveTrainerMB, f.ReserveMaxPeerMB)
	}
	fmt.Fprintf(w, "certification: a voter's vote %.0f us; a device's check of a version, every voter's vote (VerifyCertified):\n", r.Certify.VoteMicros)
	for _, v := range r.Certify.Verify {
		fmt.Fprintf(w, "  a set of %d  %7.0f us\n", v.Voters, v.Micros)
	}
}
