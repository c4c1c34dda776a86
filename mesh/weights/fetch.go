package weights

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/quic-go/quic-go"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// ErrNoSource is a fetch that ran out of sources before it had every
// chunk.
var ErrNoSource = errors.New("weights: no source could give the whole bundle")

// Source is a peer that serves bundles, at UDP addresses for QUIC or, for
// a fetcher with a mesh host, over the host's streams.
type Source struct {
	Peer  mesh.PeerID `json:"peer"`
	Addrs []string    `json:"addrs"` // host:port, tried in order
}

// FetcherConfig configures a Fetcher.
type FetcherConfig struct {
	Key    ed25519.PrivateKey // the fetching peer's identity key
	Logger *slog.Logger
	// StallTimeout is how long a source may send nothing before the
	// fetch leaves it (default 10s).
	StallTimeout time.Duration
	// Streams is how many requests run at once on each source (default 2).
	Streams int
	// PerRequest is how many chunks one request asks for (default 8).
	PerRequest int
	// MaxStrikes is how many bad chunks a source may send before the fetch
	// leaves it (default 2).
	MaxStrikes int
	// Host, if set, is the mesh host: a source the fetcher cannot reach
	// over QUIC (behind NAT, or with no address) is asked over the host's
	// streams (ProtocolID) instead.
	Host mesh.Host
	// FallbackAfter bounds, when Host is set, the time spent dialing a
	// source's QUIC addresses before asking it over the host (default 3s);
	// the source is then asked over the host for a while (viaHostFor)
	// before QUIC is tried again.
	FallbackAfter time.Duration
}

// viaHostFor is how long a fetcher that could not reach a source over QUIC
// asks it over the mesh host before trying QUIC again.
const viaHostFor = 5 * time.Minute

// Fetcher pulls bundles from the peers that hold them, over QUIC (or the
// mesh host's streams), chunk by chunk from several sources at once,
// verifying each chunk.
type Fetcher struct {
	cfg FetcherConfig
	id  *identity
	log *slog.Logger

	mu      sync.Mutex
	conns   map[mesh.PeerID]*quic.Conn
	viaHost map[mesh.PeerID]time.Time // QUIC failed: ask over the host until then
}

// NewFetcher returns a Fetcher.
func NewFetcher(cfg FetcherConfig) (*Fetcher, error) {
	id, err := newIdentity(cfg.Key)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = 10 * time.Second
	}
	if cfg.Streams <= 0 {
		cfg.Streams = 2
	}
	if cfg.PerRequest <= 0 || cfg.PerRequest > chunks.MaxPerRequest {
		cfg.PerRequest = 8
	}
	if cfg.MaxStrikes <= 0 {
		cfg.MaxStrikes = 2
	}
	if cfg.FallbackAfter <= 0 {
		cfg.FallbackAfter = 3 * time.Second
	}
	return &Fetcher{cfg: cfg, id: id, log: cfg.Logger.With("component", "weights"),
		conns: map[mesh.PeerID]*quic.Conn{}, viaHost: map[mesh.PeerID]time.Time{}}, nil
}

// Close ends the fetcher's connections.
func (f *Fetcher) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, c := range f.conns {
		c.CloseWithError(0, "closing")
		delete(f.conns, p)
	}
	return nil
}

// conn returns a connection to src, dialing it if there is none: the
// handshake proves that src.Peer is at the other end.
func (f *Fetcher) conn(ctx context.Context, src Source) (*quic.Conn, error) {
	f.mu.Lock()
	c := f.conns[src.Peer]
	f.mu.Unlock()
	if c != nil && c.Context().Err() == nil {
		return c, nil
	}
	c = nil
	var errs []error
	for _, a := range src.Addrs {
		tc, err := f.id.config(src.Peer) // single use: its check closes a channel
		if err != nil {
			return nil, err
		}
		dctx, cancel := context.WithTimeout(ctx, f.cfg.StallTimeout)
		c, err = quic.DialAddr(dctx, a, tc, quicConfig())
		cancel()
		if err == nil {
			break
		}
		errs = append(errs, err)
	}
	if c == nil {
		return nil, fmt.Errorf("weights: dial %s at %v: %w", src.Peer, src.Addrs, errors.Join(errs...))
	}
	f.mu.Lock()
	if old := f.conns[src.Peer]; old != nil && old.Context().Err() == nil {
		f.mu.Unlock()
		c.CloseWithError(0, "duplicate")
		return old, nil
	}
	f.conns[src.Peer] = c
	f.mu.Unlock()
	return c, nil
}

// forget drops a source's connection after an error on it.
func (f *Fetcher) forget(p mesh.PeerID, c *quic.Conn) {
	f.mu.Lock()
	if f.conns[p] == c {
		delete(f.conns, p)
	}
	f.mu.Unlock()
	c.CloseWithError(0, "leaving")
}

// open sends request q to src and reads the answer's status: over QUIC,
// or over the mesh host when src has no address, QUIC could not reach it
// lately, or it cannot now.
func (f *Fetcher) open(ctx context.Context, src Source, q request) (stream, *bufio.Reader, error) {
	st, err := f.stream(ctx, src)
	if err != nil {
		return nil, nil, err
	}
	st.SetWriteDeadline(time.Now().Add(f.cfg.StallTimeout))
	if _, err := st.Write(q.marshal()); err != nil {
		st.abort()
		return nil, nil, fmt.Errorf("weights: request to %s: %w", src.Peer, err)
	}
	st.closeWrite() // our side is done
	st.SetReadDeadline(time.Now().Add(f.cfg.StallTimeout))
	r := bufio.NewReaderSize(st, 64<<10)
	if err := readStatus(r); err != nil {
		st.abort()
		return nil, nil, err
	}
	return st, r, nil
}

// stream opens a stream to src.
func (f *Fetcher) stream(ctx context.Context, src Source) (stream, error) {
	var quicErr error
	if len(src.Addrs) > 0 && !f.skipQUIC(src.Peer) {
		dctx, cancel := ctx, context.CancelFunc(func() {})
		if f.cfg.Host != nil {
			dctx, cancel = context.WithTimeout(ctx, f.cfg.FallbackAfter)
		}
		c, err := f.conn(dctx, src)
		cancel()
		if err == nil {
			octx, cancel := context.WithTimeout(ctx, f.cfg.StallTimeout)
			st, err := c.OpenStreamSync(octx)
			cancel()
			if err != nil {
				f.forget(src.Peer, c)
				return nil, fmt.Errorf("weights: stream to %s: %w", src.Peer, err)
			}
			return quicStream{st}, nil
		}
		if f.cfg.Host == nil || ctx.Err() != nil {
			return nil, err
		}
		quicErr = err
		f.mu.Lock()
		f.viaHost[src.Peer] = time.Now().Add(viaHostFor)
		f.mu.Unlock()
		f.log.Debug("asking a weights source over the mesh host", "peer", src.Peer, "quic", err)
	}
	if f.cfg.Host == nil {
		return nil, fmt.Errorf("weights: %s has no address to dial", src.Peer)
	}
	octx, cancel := context.WithTimeout(ctx, f.cfg.StallTimeout)
	hs, err := f.cfg.Host.NewStream(octx, src.Peer, ProtocolID)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("weights: stream to %s: %w", src.Peer, errors.Join(quicErr, err))
	}
	return hostStream{hs}, nil
}

// skipQUIC reports whether QUIC failed to reach p lately.
func (f *Fetcher) skipQUIC(p mesh.PeerID) bool {
	if f.cfg.Host == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	until, ok := f.viaHost[p]
	if ok && time.Now().After(until) {
		delete(f.viaHost, p)
		return false
	}
	return ok
}

// Manifest asks src for the manifest of a bundle (zero: of the newest
// version it holds). The caller verifies it.
func (f *Fetcher) Manifest(ctx context.Context, src Source, bundle [sha256.Size]byte) (*chunks.Manifest, error) {
	st, r, err := f.open(ctx, src, request{Op: opManifest, Bundle: bundle})
	if err != nil {
		return nil, err
	}
	b, err := readBlob(r, chunks.MaxManifestSize)
	if err != nil {
		st.abort()
		return nil, err
	}
	st.done()
	m, err := chunks.ParseManifest(b)
	if err != nil {
		return nil, err
	}
	if bundle != ([sha256.Size]byte{}) && m.Bundle != bundle {
		return nil, fmt.Errorf("%w: asked for %x, got %s", chunks.ErrManifest, bundle[:6], m.BundleID()[:12])
	}
	return m, nil
}

// Progress is how far a fetch is.
type Progress struct {
	Bytes, Total int64 // verified bytes on disk, bundle size
	Resumed      int64 // bytes found on disk from an earlier fetch
	Sources      int   // sources still in use
	// Left are the sources the fetch left, and why.
	Left map[mesh.PeerID]string
}

// Fetch fetches the bundle m describes from sources into path. Chunks go
// to path+".part" as they are verified, so a fetch that stops (a crash, a
// cancelled context) resumes where it stopped: the next Fetch keeps every
// chunk of the partial file whose hash checks out. A source that sends a
// bad chunk is asked for it no more, and left after MaxStrikes bad chunks;
// a source silent for StallTimeout is left; its chunks go to the others.
// Once every chunk is in, the file is synced and renamed to path (the
// whole bundle's hash is left to whoever reads it whole: the installer).
// If path is there already, its whole hash is checked instead. progress,
// if not nil, is called after every chunk, one call at a time.
func (f *Fetcher) Fetch(ctx context.Context, m *chunks.Manifest, sources []Source, path string, progress func(Progress)) error {
	return f.FetchFrom(ctx, m, func() ([]Source, <-chan struct{}) { return sources, nil }, path, progress)
}

// SourceFeed tells a fetch who holds its bundle: the sources known now,
// and a channel closed when they change (nil: they never do).
type SourceFeed func() ([]Source, <-chan struct{})

// FetchFrom is Fetch from sources that may grow while it runs: each
// source the feed adds is asked as well, so a fetch started when only the
// trainers held a version spreads over the peers that fetched it since. A
// source the fetch left is not asked again. Once no source is left that
// could send the missing chunks, the fetch fails with ErrNoSource, as
// Fetch does; a caller tries again when it learns of another source.
func (f *Fetcher) FetchFrom(ctx context.Context, m *chunks.Manifest, feed SourceFeed, path string, progress func(Progress)) error {
	if _, err := os.Stat(path); err == nil {
		return checkFile(path, m)
	}
	part := path + ".part"
	file, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	if st.Size() != int64(m.Size) {
		if err := file.Truncate(0); err != nil {
			return fmt.Errorf("weights: %w", err)
		}
		if err := file.Truncate(int64(m.Size)); err != nil {
			return fmt.Errorf("weights: %w", err)
		}
	}
	fs := &fetchState{m: m, file: file, f: f, progress: progress,
		changed: make(chan struct{})}
	fs.p.Total = int64(m.Size)
	// Whole chunks go to disk past the page cache where the file system
	// allows it: copying each chunk into fresh cache pages cost more CPU
	// than hashing it where it was measured (a VM, docs/benchmarks.md),
	// and the fetch is CPU-bound on a fast link. The last, partial chunk,
	// and every chunk where direct writes fail, go through the cache; the
	// final fsync makes both durable.
	if d := openDirect(part); d != nil {
		fs.direct = d
		defer d.Close()
	}
	buf := make([]byte, m.ChunkSize)
	var missing []int
	for i := range m.Chunks {
		off, n := m.Chunk(i)
		if st.Size() == int64(m.Size) {
			if _, err := file.ReadAt(buf[:n], off); err == nil && sha256.Sum256(buf[:n]) == m.Chunks[i] {
				fs.p.Bytes += int64(n)
				continue
			}
		}
		missing = append(missing, i)
	}
	fs.plan = chunks.NewPlan(missing, f.cfg.PerRequest, f.cfg.MaxStrikes)
	fs.p.Resumed = fs.p.Bytes
	if fs.p.Resumed > 0 {
		f.log.Info("resuming a fetch", "version", m.Name(), "have", fs.p.Resumed, "of", m.Size)
	}
	if len(missing) > 0 {
		sources, changed := feed()
		if !slices.ContainsFunc(sources, func(s Source) bool { return s.Peer != "" && s.Peer != f.id.id }) {
			return fmt.Errorf("%w: no sources given", ErrNoSource)
		}
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		fs.add(ctx, &wg, sources)
		if changed != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fs.follow(ctx, &wg, feed, changed)
			}()
		}
		wg.Wait()
		cancel()
		if fs.err == nil && !fs.plan.Over() {
			fs.err = ctx.Err()
		}
		if fs.err != nil {
			return fs.err
		}
	}
	// Every chunk on disk matched its signed hash, so the bundle is the
	// one the manifest's chunk list describes; its whole-bundle hash is
	// checked by whoever reads the bundle whole (the installer).
	if err := file.Sync(); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	if err := file.Close(); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	if err := os.Rename(part, path); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	atomicfile.SyncDir(filepath.Dir(path))
	return nil
}

// checkFile checks a whole bundle file against m.
func checkFile(path string, m *chunks.Manifest) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	defer f.Close()
	return checkReader(f, m)
}

func checkReader(r io.Reader, m *chunks.Manifest) error {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	if n != int64(m.Size) || [sha256.Size]byte(h.Sum(nil)) != m.Bundle {
		return fmt.Errorf("weights: the bundle of %s does not match its manifest", m.Name())
	}
	return nil
}

// fetchState is one fetch's shared state: its plan, under mu, and its
// progress.
type fetchState struct {
	m        *chunks.Manifest
	file     *os.File
	direct   *os.File // file opened for direct writes, or nil
	f        *Fetcher
	progress func(Progress)
	pmu      sync.Mutex // held while progress is called

	mu      sync.Mutex
	plan    *chunks.Plan
	p       Progress
	err     error
	changed chan struct{} // closed and replaced on every change
}

// notifyLocked wakes the workers waiting for a change.
func (fs *fetchState) notifyLocked() {
	close(fs.changed)
	fs.changed = make(chan struct{})
	if fs.err == nil && fs.plan.Stuck() {
		fs.err = fmt.Errorf("%w (%d of %d chunks missing; sources left: %s)", ErrNoSource, fs.plan.Missing(), len(fs.m.Chunks), fs.leftLocked())
	}
}

// add starts asking the sources not asked before, each on Streams
// requests at once.
func (fs *fetchState) add(ctx context.Context, wg *sync.WaitGroup, sources []Source) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, s := range sources {
		if s.Peer == "" || s.Peer == fs.f.id.id || !fs.plan.Add(s.Peer) {
			continue
		}
		for range fs.f.cfg.Streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fs.work(ctx, s)
			}()
		}
	}
	fs.p.Sources = fs.plan.Sources()
	fs.notifyLocked()
}

// follow adds the feed's new sources until the fetch ends.
func (fs *fetchState) follow(ctx context.Context, wg *sync.WaitGroup, feed SourceFeed, changed <-chan struct{}) {
	for {
		fs.mu.Lock()
		over := fs.err != nil || fs.plan.Over()
		wait := fs.changed
		fs.mu.Unlock()
		if over {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-wait:
		case <-changed:
			var sources []Source
			sources, changed = feed()
			fs.add(ctx, wg, sources)
		}
	}
}

func (fs *fetchState) leftLocked() string {
	left := fs.plan.Left()
	if len(left) == 0 {
		return "none"
	}
	var s string
	for p, why := range left {
		if s != "" {
			s += "; "
		}
		s += string(p) + ": " + why
	}
	return s
}

// take hands a source the chunks of its next request (Plan.Take); it
// waits while there are none but other requests are in flight. It returns
// nil when the source should stop.
func (fs *fetchState) take(ctx context.Context, p mesh.PeerID) []int {
	for {
		fs.mu.Lock()
		if ctx.Err() != nil || fs.err != nil || !fs.plan.Live(p) || fs.plan.Over() {
			fs.mu.Unlock()
			return nil
		}
		if got := fs.plan.Take(p); got != nil {
			fs.mu.Unlock()
			return got
		}
		wait := fs.changed
		fs.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-wait:
		}
	}
}

// settle returns the chunks of a request that were not written to the
// plan, and records a bad chunk or the source's departure.
func (fs *fetchState) settle(p mesh.PeerID, rest []int, badChunk int, leave error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if why := fs.plan.Settle(p, rest, badChunk, leave); why != "" {
		fs.p.Sources = fs.plan.Sources()
		fs.f.log.Warn("leaving a weights source", "peer", p, "version", fs.m.Name(), "why", why)
	}
	fs.notifyLocked()
}

// Back-off after a busy answer: from busyBackoff, doubling up to
// maxBusyBackoff, plus up to as much again at random.
const (
	busyBackoff    = 100 * time.Millisecond
	maxBusyBackoff = 2 * time.Second
)

// work fetches chunks from one source until none are left for it. A busy
// source keeps its place: its chunks go back for the other sources, and it
// is asked again after a back-off.
func (fs *fetchState) work(ctx context.Context, src Source) {
	buf := alignedBuffer(int(fs.m.ChunkSize))
	direct := fs.direct != nil
	var backoff time.Duration
	for {
		got := fs.take(ctx, src.Peer)
		if got == nil {
			return
		}
		done, bad, err := fs.request(ctx, src, got, buf, &direct)
		if ctx.Err() != nil {
			fs.settle(src.Peer, got[done:], -1, nil) // not the source's fault
			return
		}
		var re *remoteError
		if errors.As(err, &re) && re.status == statusBusy {
			fs.settle(src.Peer, got[done:], -1, nil)
			backoff = min(max(2*backoff, busyBackoff), maxBusyBackoff)
			t := time.NewTimer(backoff + rand.N(backoff))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		fs.settle(src.Peer, got[done:], bad, err)
	}
}

// request fetches got from src. It returns how many chunks (a prefix of
// got) it wrote, the index of a chunk that failed its hash (or -1), and
// an error that should make the fetch leave the source.
func (fs *fetchState) request(ctx context.Context, src Source, got []int, buf []byte, direct *bool) (done, bad int, err error) {
	st, r, err := fs.f.open(ctx, src, request{Op: opChunks, Bundle: fs.m.Bundle, First: uint32(got[0]), Count: uint32(len(got))})
	if err != nil {
		return 0, -1, err
	}
	defer func() {
		if done == len(got) && err == nil {
			st.done()
		} else {
			st.abort() // the rest of the answer is not wanted
		}
	}()
	stop := context.AfterFunc(ctx, st.abort)
	defer stop()
	for k, i := range got {
		st.SetReadDeadline(time.Now().Add(fs.f.cfg.StallTimeout))
		if err := readChunkHeader(r, fs.m, i); err != nil {
			return k, -1, err
		}
		off, n := fs.m.Chunk(i)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return k, -1, fmt.Errorf("weights: chunk %d: %w", i, err)
		}
		if sha256.Sum256(buf[:n]) != fs.m.Chunks[i] {
			return k, i, nil
		}
		if err := fs.write(buf[:n], off, direct); err != nil {
			fs.mu.Lock()
			if fs.err == nil {
				fs.err = fmt.Errorf("weights: writing %s: %w", fs.file.Name(), err)
			}
			fs.mu.Unlock()
			return k, -1, nil
		}
		fs.report(n)
	}
	return len(got), -1, nil
}

// report counts a chunk of n bytes in and calls progress, one call at a
// time and in order, so that it sees the bytes only grow.
func (fs *fetchState) report(n int) {
	fs.pmu.Lock()
	defer fs.pmu.Unlock()
	fs.mu.Lock()
	fs.plan.Got()
	fs.p.Bytes += int64(n)
	p := fs.p
	p.Left = fs.plan.Left()
	fs.mu.Unlock()
	if fs.progress != nil {
		fs.progress(p)
	}
}

// write writes a verified chunk at off: directly if *direct and the
// chunk is a whole number of blocks, else through the page cache,
// starting its writeback. A direct write that fails turns *direct off
// and goes through the cache instead.
func (fs *fetchState) write(b []byte, off int64, direct *bool) error {
	if *direct && len(b)%directAlign == 0 && off%directAlign == 0 {
		if _, err := fs.direct.WriteAt(b, off); err == nil {
			return nil
		}
		*direct = false
	}
	if _, err := fs.file.WriteAt(b, off); err != nil {
		return err
	}
	startWriteback(fs.file, off, len(b))
	return nil
}

// directAlign is the alignment of direct writes: their memory, offset and
// length (a page, a multiple of any block size).
const directAlign = 4096

// alignedBuffer returns n bytes whose start is aligned for direct writes.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := 0
	if a := int(uintptr(unsafe.Pointer(&b[0])) % directAlign); a != 0 {
		skip = directAlign - a
	}
	return b[skip : skip+n : skip+n]
}
