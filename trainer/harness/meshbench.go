package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/trainer/store"
)

// BenchOptions configure BenchMesh; the zero value of each field means its
// default.
type BenchOptions struct {
	// Batches is how many batches are shipped one after another for the
	// latency measure; default 50.
	Batches int
	// Steps is the number of steps in each of those batches, one session
	// whose history grows (pool.StepGen: a 40,000-character system prompt,
	// 12 tools), each step with a tool result and its reply's log-probs;
	// default 16.
	Steps int
	// PullBytes is the size of the batch pulled for the throughput measure
	// (made of as many such steps as it takes; at most the batch format's
	// 32 MiB); default 16 MiB.
	PullBytes int64
	// Rounds is how many times that batch is pulled, and copied over a
	// bare stream, interleaved; default 5.
	Rounds int
}

// Defaults of BenchOptions.
const (
	DefaultBenchBatches   = 50
	DefaultBenchSteps     = 16
	DefaultBenchPullBytes = 16 << 20
	DefaultBenchRounds    = 5
)

// PullGoal is the throughput the pull protocol should reach, as a fraction
// of a bare libp2p stream's between the same two hosts.
const PullGoal = 0.8

// BenchResult is what BenchMesh measured.
type BenchResult struct {
	Batches, Steps int
	// LatencyP50 and LatencyP99 are over the latency batches, each from
	// its appearing in the shipping peer's outbox (visible to Unshipped)
	// to the trainer's Store.Put of it returning: Ship's poll (10 ms),
	// the announcement on gossip, the pull, decoding and verifying every
	// step, and a synced Pebble write.
	LatencyP50, LatencyP99 time.Duration
	// BatchBytes is the size of one latency batch.
	BatchBytes int
	// PullBatchBytes and PullSteps describe the batch of the throughput
	// measure; Rounds is how many times each kind of copy moved it.
	PullBatchBytes, PullSteps, Rounds int
	// PullMBps is the pull protocol's rate (medians over the rounds, in
	// 10^6 bytes a second): a trainer asking the shipping peer's
	// ProtoPull server (Mesh.Ship's) for the batch, from opening the
	// stream to holding the bytes, hash checked (Mesh.Pull), as Collect
	// reads them. BareMBps is a bare libp2p stream between the same two
	// hosts copying the same bytes (one write; the reader reads them all
	// and hashes them), rounds interleaved with the pulls.
	PullMBps, BareMBps float64
	// Ratio is PullMBps/BareMBps; the goal is PullGoal or more.
	Ratio float64
	// Conn is the trainer's connection the copies ran on (the member's
	// multiaddr; libp2p chooses between QUIC and TCP).
	Conn string
	// CollectMBps is the whole trip of the same batch through the public
	// path, once a round: from its appearing in the outbox to the
	// trainer's Mesh.Collect having stored it (Ship's poll, gossip, the
	// pull, decoding and verifying every step, a synced Pebble write).
	CollectMBps float64
	// Repulled counts the batches shipped through Collect (latency
	// batches and Collect rounds, Shipped of them) that the trainer
	// pulled more than once: a pull failed, and the trainer waited for
	// the batch's next announcement (ShipRetry later, doubling). Their
	// waits are in the latency and Collect figures.
	Repulled, Shipped int
}

// ShipRetry is the bench's ShipOptions.Retry: how long Ship waits for an
// ack before announcing a batch again.
const ShipRetry = 500 * time.Millisecond

// BenchMesh measures, on two peers of a mesh made for the purpose on
// 127.0.0.1 in temporary directories (removed at the end): the latency
// from a batch appearing in a member's outbox to the trainer storing it,
// and the pull protocol's throughput against a bare stream copying the
// same bytes between the same hosts, interleaved in the same run. It
// uses the wall clock; every wait is bounded.
func BenchMesh(ctx context.Context, o BenchOptions) (*BenchResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	gen := newBenchGen("lat", o.Steps)
	lat := make([][]byte, o.Batches+1) // the first warms up
	for i := range lat {
		var err error
		if lat[i], err = gen.batch(i*o.Steps, o.Steps, ""); err != nil {
			return nil, err
		}
	}
	pulls, steps, err := pullBatches(o)
	if err != nil {
		return nil, err
	}

	bm, err := newBenchMesh(ctx)
	if err != nil {
		return nil, err
	}
	defer bm.close()
	r := &BenchResult{Batches: o.Batches, Steps: o.Steps, BatchBytes: len(lat[1]), PullBatchBytes: len(pulls[0]), PullSteps: steps, Rounds: o.Rounds}

	// Latency. The first batch is not counted: gossip may not know yet
	// that the trainer listens.
	ds := make([]time.Duration, 0, o.Batches)
	for i, p := range lat {
		d, tries, err := bm.ship(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("peer: bench: latency batch %d: %w", i, err)
		}
		if i > 0 {
			ds = append(ds, d)
			r.count(tries)
		}
	}
	slices.Sort(ds)
	r.LatencyP50, r.LatencyP99 = ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)]

	// Throughput: a pull and a bare copy each round, in turns, then the
	// round's batch through Collect. One of each first, not counted, to
	// warm up.
	for _, p := range pulls {
		bm.out.add(batch.ID(p), p)
	}
	id0 := batch.ID(pulls[0])
	for _, f := range []func(context.Context, core.BatchID, int) (time.Duration, error){bm.pull, bm.bare} {
		if _, err := f(ctx, id0, len(pulls[0])); err != nil {
			return nil, fmt.Errorf("peer: bench: warming up: %w", err)
		}
	}
	var pullR, bareR, collectR []float64
	mbps := func(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
	for i, p := range pulls {
		id := batch.ID(p)
		kinds := []struct {
			f    func(context.Context, core.BatchID, int) (time.Duration, error)
			into *[]float64
		}{{bm.pull, &pullR}, {bm.bare, &bareR}}
		if i%2 == 1 {
			kinds[0], kinds[1] = kinds[1], kinds[0]
		}
		for _, k := range kinds {
			runtime.GC()
			d, err := k.f(ctx, id, len(p))
			if err != nil {
				return nil, fmt.Errorf("peer: bench: round %d: %w", i, err)
			}
			*k.into = append(*k.into, mbps(len(p), d))
		}
		runtime.GC()
		d, tries, err := bm.ship(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("peer: bench: round %d, collecting: %w", i, err)
		}
		r.count(tries)
		collectR = append(collectR, mbps(len(p), d))
	}
	r.PullMBps, r.BareMBps, r.CollectMBps = median(pullR), median(bareR), median(collectR)
	r.Ratio = r.PullMBps / r.BareMBps
	r.Conn = bm.conn
	if err := bm.close(); err != nil {
		return nil, err
	}
	return r, nil
}

// count counts a batch shipped, which the trainer pulled tries times.
func (r *BenchResult) count(tries int) {
	r.Shipped++
	if tries > 1 {
		r.Repulled++
	}
}

func (o BenchOptions) validate() error {
	if o.Batches < 0 || o.Steps < 0 || o.PullBytes < 0 || o.Rounds < 0 {
		return fmt.Errorf("peer: bench: negative options %+v", o)
	}
	if o.PullBytes > maxPullBytes {
		return fmt.Errorf("peer: bench: PullBytes %d is over the %d bytes a batch may have", o.PullBytes, maxPullBytes)
	}
	return nil
}

func (o BenchOptions) withDefaults() BenchOptions {
	if o.Batches == 0 {
		o.Batches = DefaultBenchBatches
	}
	if o.Steps == 0 {
		o.Steps = DefaultBenchSteps
	}
	if o.PullBytes == 0 {
		o.PullBytes = DefaultBenchPullBytes
	}
	if o.Rounds == 0 {
		o.Rounds = DefaultBenchRounds
	}
	return o
}

// maxPullBytes and maxPullSteps are the batch format's default limits
// (batch.Limits), which Encode enforces.
const (
	maxPullBytes = 32 << 20
	maxPullSteps = 4096
)

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Print writes r for people.
func (r *BenchResult) Print(w io.Writer) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
	fmt.Fprintln(w, "mesh: two peers of a mesh on 127.0.0.1 (libp2p; QUIC and TCP listening), a member shipping, a trainer collecting")
	fmt.Fprintf(w, "\nlatency, from a batch appearing in the member's outbox to the trainer's store holding it (%d batches, one at a time):\n", r.Batches)
	fmt.Fprintf(w, "  p50 %s, p99 %s\n", ms(r.LatencyP50), ms(r.LatencyP99))
	fmt.Fprintf(w, "  a batch: %d steps of one agent session (40,000-character system prompt, 12 tools, a growing history, a tool result, log-probs), %d KB\n", r.Steps, r.BatchBytes/1000)
	fmt.Fprintln(w, "  includes Ship's outbox poll (every 10 ms), the gossip announcement, the pull, decoding and verifying every step, a synced Pebble write")
	fmt.Fprintf(w, "\nthroughput, a batch of %d such steps, %.1f MB, moved %d times by each kind of copy, interleaved (medians; MB = 10^6 bytes),\n",
		r.PullSteps, float64(r.PullBatchBytes)/1e6, r.Rounds)
	fmt.Fprintf(w, "over the connection to %s:\n", r.Conn)
	verdict := "met"
	if r.Ratio < PullGoal {
		verdict = "NOT MET"
	}
	const row = "  %-33s %8.1f MB/s  %s\n"
	fmt.Fprintf(w, row, "bare libp2p stream (baseline)", r.BareMBps, "one write; the reader reads it all and checks its sha256")
	fmt.Fprintf(w, row, "pull protocol ("+mesh.ProtoPull+")", r.PullMBps, fmt.Sprintf("%.2fx the bare stream; goal >= %.2fx: %s", r.Ratio, PullGoal, verdict))
	fmt.Fprintf(w, row, "Collect, outbox to stored", r.CollectMBps, "the public path, a new batch of the same size each round")
	fmt.Fprintln(w, "  the pull: the trainer's Mesh.Pull, as Collect pulls: a stream to the member, the request, the reply and the bytes,")
	fmt.Fprintln(w, "  their sha256 checked; Ship serves them in 256 KiB chunks, a deadline each. Both it and the bare copy include")
	fmt.Fprintln(w, "  opening the stream. Collect adds Ship's poll, gossip, decoding and verifying every step and a synced Pebble write.")
	if r.Repulled > 0 {
		fmt.Fprintf(w, "\n%d of %d batches shipped were pulled more than once: a pull failed and the trainer waited for the next announcement\n", r.Repulled, r.Shipped)
		fmt.Fprintf(w, "(after %s, doubling); those waits are in the latency and Collect figures\n", ShipRetry)
	}
}

// ---- the mesh of two peers

var benchListen = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// benchWait bounds every wait of the bench.
const benchWait = time.Minute

// protoBare is the bench's bare stream: the dialler writes a batch id,
// the listener writes the batch's bytes and closes.
const protoBare = "/clawmesh/bench/bare/1"

// benchMesh is a mesh of two peers on loopback: node ships out, trainer
// collects into st.
type benchMesh struct {
	dir           string
	conn          string // the multiaddr the last pull ran to
	node, trainer *peer.Peer
	out           *benchOutbox
	st            *timedStore
	cancel        context.CancelFunc
	wg            sync.WaitGroup
	closeOnce     sync.Once
	closeErr      error
}

func newBenchMesh(ctx context.Context) (_ *benchMesh, err error) {
	dir, err := os.MkdirTemp("", "clawmesh-bench-mesh-")
	if err != nil {
		return nil, fmt.Errorf("peer: bench: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	bm := &benchMesh{dir: dir, cancel: cancel, out: newBenchOutbox()}
	defer func() {
		if err != nil {
			bm.close()
		}
	}()
	nodeData, trainerData := filepath.Join(dir, "node"), filepath.Join(dir, "trainer")
	key, id, err := peer.Identity(nodeData)
	if err != nil {
		return nil, err
	}
	if _, err := mesh.Init(nodeData, "bench", key, id, time.Now(), rand.Reader); err != nil {
		return nil, err
	}
	if bm.node, err = bm.start(runCtx, nodeData); err != nil {
		return nil, err
	}
	tok, err := mesh.Invite(nodeData, key, member.RoleTrainer, time.Hour, 1, bm.node.Host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		return nil, err
	}
	jctx, jcancel := context.WithTimeout(ctx, benchWait)
	_, err = peer.Join(jctx, trainerData, tok.String(), benchListen, nil)
	jcancel()
	if err != nil {
		return nil, err
	}
	if bm.trainer, err = bm.start(runCtx, trainerData, bm.node.Host.Addrs()...); err != nil {
		return nil, err
	}
	if err := waitUntil(ctx, "the peers to admit each other", func() bool {
		return bm.node.Mesh.Admitted(bm.trainer.Mesh.ID()) && bm.trainer.Mesh.Admitted(bm.node.Mesh.ID())
	}); err != nil {
		return nil, err
	}

	bm.node.Host.Handle(protoBare, bm.serveBare)
	st, err := store.Open(filepath.Join(trainerData, "batches"), nil)
	if err != nil {
		return nil, err
	}
	bm.st = newTimedStore(st)
	bm.goRun(func() {
		bm.node.Mesh.Ship(runCtx, bm.out, mesh.ShipOptions{Poll: 10 * time.Millisecond, Retry: ShipRetry, MaxRetry: 5 * ShipRetry})
	})
	bm.goRun(func() { bm.trainer.Mesh.Collect(runCtx, bm.st, mesh.PullOptions{}) })
	return bm, nil
}

// start starts and runs the peer of dataDir.
func (bm *benchMesh) start(ctx context.Context, dataDir string, bootstrap ...string) (*peer.Peer, error) {
	p, err := peer.Start(ctx, peer.Options{DataDir: dataDir, Listen: benchListen, Bootstrap: bootstrap})
	if err != nil {
		return nil, err
	}
	bm.goRun(func() { p.Run(ctx) })
	return p, nil
}

func (bm *benchMesh) goRun(fn func()) {
	bm.wg.Add(1)
	go func() { defer bm.wg.Done(); fn() }()
}

// close stops the peers and removes the directory; it waits at most
// benchWait for the peers' goroutines.
func (bm *benchMesh) close() error {
	bm.closeOnce.Do(func() {
		bm.cancel()
		done := make(chan struct{})
		go func() { bm.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(benchWait):
			bm.closeErr = errors.New("peer: bench: the peers did not stop")
		}
		// The store first: a pull still under way then fails rather than
		// writing to a closed store.
		if bm.st != nil {
			bm.closeErr = errors.Join(bm.closeErr, bm.st.close())
		}
		for _, p := range []*peer.Peer{bm.trainer, bm.node} {
			if p != nil {
				bm.closeErr = errors.Join(bm.closeErr, p.Close())
			}
		}
		bm.closeErr = errors.Join(bm.closeErr, os.RemoveAll(bm.dir))
	})
	return bm.closeErr
}

// ship puts payload in the outbox and returns the time from its
// appearing there to the trainer's store holding it; it then waits for
// the trainer's ack to ship it, and returns how many times the trainer
// pulled it meanwhile.
func (bm *benchMesh) ship(ctx context.Context, payload []byte) (time.Duration, int, error) {
	id := batch.ID(payload)
	stored := bm.st.expect(id)
	acked := bm.out.add(id, payload)
	served := bm.out.served(id)
	t0 := bm.out.show(id)
	var d time.Duration
	select {
	case p := <-stored:
		if p.err != nil {
			return 0, 0, p.err
		}
		d = p.at.Sub(t0)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(benchWait):
		return 0, 0, fmt.Errorf("not stored by the trainer within %s", benchWait)
	}
	select {
	case <-acked:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(benchWait):
		return 0, 0, fmt.Errorf("stored, but not acked within %s", benchWait)
	}
	return d, bm.out.served(id) - served, nil
}

// pull pulls batch id from the node, as the trainer's Collect does
// (Mesh.Pull), without decoding it.
func (bm *benchMesh) pull(ctx context.Context, id core.BatchID, size int) (time.Duration, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	if _, err := bm.trainer.Mesh.Pull(ctx, bm.node.Mesh.ID(), id, int64(size)); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// bare copies batch id from the node to the trainer over protoBare.
func (bm *benchMesh) bare(ctx context.Context, id core.BatchID, size int) (time.Duration, error) {
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	s, err := bm.trainer.Host.NewStream(sctx, bm.node.Mesh.ID(), protoBare)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if c, ok := s.(interface{ Conn() network.Conn }); ok {
		bm.conn = c.Conn().RemoteMultiaddr().String()
	}
	s.SetDeadline(time.Now().Add(benchWait))
	if _, err := io.WriteString(s, string(id)); err != nil {
		s.Reset()
		return 0, err
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(s, buf); err != nil {
		s.Reset()
		return 0, fmt.Errorf("bare: %w", err)
	}
	if batch.ID(buf) != id {
		return 0, fmt.Errorf("bare: %w", batch.ErrHashMismatch)
	}
	return time.Since(t0), nil
}

func (bm *benchMesh) serveBare(s mesh.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(benchWait))
	id := make([]byte, 64)
	if _, err := io.ReadFull(s, id); err != nil {
		s.Reset()
		return
	}
	p, err := bm.out.Payload(context.Background(), core.BatchID(id))
	if err != nil {
		s.Reset()
		return
	}
	if _, err := s.Write(p); err != nil {
		s.Reset()
	}
}

// waitUntil polls cond until it holds, for at most benchWait.
func waitUntil(ctx context.Context, what string, cond func() bool) error {
	return waitFor(ctx, benchWait, "peer: bench: no "+what, cond)
}

// benchOutbox is a node's outbox in memory whose batches appear one at a
// time: each is served once added, and announced once shown.
type benchOutbox struct {
	mu       sync.Mutex
	payloads map[core.BatchID][]byte
	visible  map[core.BatchID]bool
	acked    map[core.BatchID]chan struct{}
	serves   map[core.BatchID]int
}

func newBenchOutbox() *benchOutbox {
	return &benchOutbox{payloads: map[core.BatchID][]byte{}, visible: map[core.BatchID]bool{}, acked: map[core.BatchID]chan struct{}{}, serves: map[core.BatchID]int{}}
}

// add holds a batch (again), not yet shown; the channel is closed when it
// is acked.
func (o *benchOutbox) add(id core.BatchID, payload []byte) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.payloads[id] = payload
	c, ok := o.acked[id]
	if !ok {
		c = make(chan struct{})
		o.acked[id] = c
	}
	return c
}

// ship holds a batch and shows it at once.
func (o *benchOutbox) ship(payload []byte) core.BatchID {
	id := batch.ID(payload)
	o.add(id, payload)
	o.show(id)
	return id
}

// show makes a batch visible to Unshipped, and says when.
func (o *benchOutbox) show(id core.BatchID) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.visible[id] = true
	return time.Now()
}

func (o *benchOutbox) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if p, ok := o.payloads[id]; ok {
		return p, nil
	}
	return nil, mesh.ErrNoBatch
}

// OpenPayload makes the outbox a mesh.StreamSource, which the pull
// server prefers to Payload (which announcing uses): so it counts pulls.
func (o *benchOutbox) OpenPayload(ctx context.Context, id core.BatchID) (io.ReadCloser, int64, error) {
	p, err := o.Payload(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	o.mu.Lock()
	o.serves[id]++
	o.mu.Unlock()
	return io.NopCloser(bytes.NewReader(p)), int64(len(p)), nil
}

// served says how many times batch id was pulled.
func (o *benchOutbox) served(id core.BatchID) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.serves[id]
}

func (o *benchOutbox) Unshipped(ctx context.Context) ([]core.BatchID, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := make([]core.BatchID, 0, len(o.visible))
	for id := range o.visible {
		ids = append(ids, id)
	}
	return ids, nil
}

func (o *benchOutbox) Shipped(ctx context.Context, id core.BatchID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.visible, id)
	if c, ok := o.acked[id]; ok {
		close(c)
		delete(o.acked, id)
	}
	return nil
}

// timedStore is the trainer's store, telling when each Put returned. Once
// closed it refuses everything, so that a pull still under way at the end
// does not touch a closed Pebble.
type timedStore struct {
	mu sync.RWMutex
	st *store.Store // nil once closed

	wmu     sync.Mutex
	waiters map[core.BatchID]chan putResult
}

type putResult struct {
	at  time.Time
	err error
}

var errBenchClosed = errors.New("peer: bench: store closed")

func newTimedStore(st *store.Store) *timedStore {
	return &timedStore{st: st, waiters: map[core.BatchID]chan putResult{}}
}

// expect returns a channel that gets the outcome of the next Put of id.
func (s *timedStore) expect(id core.BatchID) <-chan putResult {
	c := make(chan putResult, 1)
	s.wmu.Lock()
	s.waiters[id] = c
	s.wmu.Unlock()
	return c
}

func (s *timedStore) Put(ctx context.Context, id core.BatchID, payload []byte, b *batch.Batch) error {
	s.mu.RLock()
	err := errBenchClosed
	if s.st != nil {
		err = s.st.Put(ctx, id, payload, b)
	}
	at := time.Now()
	s.mu.RUnlock()
	s.wmu.Lock()
	c, ok := s.waiters[id]
	delete(s.waiters, id)
	s.wmu.Unlock()
	if ok {
		c <- putResult{at: at, err: err}
	}
	return err
}

func (s *timedStore) Has(ctx context.Context, id core.BatchID) (bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.st == nil {
		return false, errBenchClosed
	}
	return s.st.Has(ctx, id)
}

func (s *timedStore) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.st == nil {
		return nil, fmt.Errorf("%w: %w", mesh.ErrNoBatch, errBenchClosed)
	}
	return s.st.Payload(ctx, id)
}

func (s *timedStore) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		return nil
	}
	err := s.st.Close()
	s.st = nil
	return err
}

// ---- batches

// benchGen makes agent-sized steps: pool.StepGen's (a 40,000-character
// system prompt, 12 tools, sessions whose history grows), each with what
// a real step carries beside its prompt that compresses poorly and is
// its own: a tool call and its result (a file read, benchToolChars of
// text) and the reply's log-probs (benchTokens tokens).
type benchGen struct {
	steps *pool.StepGen
	vocab []string
}

const (
	benchToolChars = 8000
	benchTokens    = 120
)

func newBenchGen(prefix string, perSession int) *benchGen {
	rng := mrand.New(mrand.NewPCG(1, 2))
	vocab := make([]string, 2000)
	for i := range vocab {
		w := make([]byte, 2+rng.IntN(9))
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		vocab[i] = string(w)
	}
	return &benchGen{steps: pool.NewStepGen(prefix, perSession), vocab: vocab}
}

// step returns step i, the same for the same i.
func (g *benchGen) step(i int) *core.Step {
	rng := mrand.New(mrand.NewPCG(uint64(i), 3))
	s := g.steps.Step(i)
	s.State = core.StateScored
	v := rng.Float64()*2 - 1
	s.Reward = &core.Reward{Value: &v, Scores: []core.Score{{Plugin: "rubric", Hash: "bench", Value: &v, Weight: 1}}}
	var text strings.Builder
	for text.Len() < benchToolChars {
		text.WriteString(g.vocab[rng.IntN(len(g.vocab))])
		text.WriteByte(' ')
	}
	call := fmt.Sprintf("call_%d", i)
	s.Request.Messages = append(s.Request.Messages,
		core.Message{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: call, Type: "function", Name: "tool_00", Arguments: fmt.Sprintf(`{"path":"src/module_%d.go"}`, i%17)}}},
		core.Message{Role: core.RoleTool, ToolCallID: call, Content: text.String()})
	tokens := make([]core.TokenLogprob, benchTokens)
	for j := range tokens {
		tokens[j] = core.TokenLogprob{Token: g.vocab[rng.IntN(len(g.vocab))], ID: rng.IntN(150_000), Logprob: -rng.Float64() * 3}
	}
	s.Response.Choices[0].Tokens = tokens
	s.Response.Choices[0].Fidelity = core.FidelityExact
	return s
}

// batch encodes steps from..from+n-1.
func (g *benchGen) batch(from, n int, policy string) ([]byte, error) {
	steps := make([]*core.Step, n)
	for i := range steps {
		steps[i] = g.step(from + i)
	}
	b, err := batch.Encode(batch.Meta{Created: g.steps.Base, Policy: policy}, steps)
	if err != nil {
		return nil, fmt.Errorf("peer: bench: %w", err)
	}
	return b, nil
}

// pullBatches makes o.Rounds batches of about o.PullBytes each, the same
// steps with another policy each, so that each round's is a batch the
// trainer does not hold yet; it returns them and their number of steps.
// The number of steps comes from the size of a sample session, corrected
// once from the size of the first batch.
func pullBatches(o BenchOptions) ([][]byte, int, error) {
	gen := newBenchGen("pull", o.Steps)
	sample, err := gen.batch(0, o.Steps, "")
	if err != nil {
		return nil, 0, err
	}
	var steps []*core.Step
	encode := func(n int, r int) ([]byte, error) {
		if n > maxPullSteps {
			return nil, fmt.Errorf("peer: bench: a batch of %d bytes takes about %d steps, over the %d a batch may have", o.PullBytes, n, maxPullSteps)
		}
		for i := len(steps); i < n; i++ {
			steps = append(steps, gen.step(i))
		}
		b, err := batch.Encode(batch.Meta{Created: gen.steps.Base, Policy: fmt.Sprintf("bench-%d", r)}, steps[:n])
		if err != nil {
			return nil, fmt.Errorf("peer: bench: %w", err)
		}
		return b, nil
	}
	n := max(1, int(float64(o.PullBytes)*float64(o.Steps)/float64(len(sample))+0.5))
	first, err := encode(n, 0)
	if err != nil {
		return nil, 0, err
	}
	if off := float64(len(first)) / float64(o.PullBytes); off < 0.98 || off > 1.02 {
		n = max(1, int(float64(n)/off+0.5))
		if first, err = encode(n, 0); err != nil {
			return nil, 0, err
		}
	}
	out := [][]byte{first}
	for r := 1; r < o.Rounds; r++ {
		b, err := encode(n, r)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, b)
	}
	return out, n, nil
}
