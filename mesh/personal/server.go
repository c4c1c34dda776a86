package personal

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
)

// Mesh is what the protocol asks of the membership: this peer's id and
// the admitted peers, with the certificates they showed. *mesh.Mesh is
// one.
type Mesh interface {
	ID() mesh.PeerID
	Peer(mesh.PeerID) (*mesh.Peer, bool)
}

// Signer is a Mesh that signs with this peer's identity key, the key its
// certificate names (*mesh.Mesh.Sign).
type Signer interface {
	Mesh
	Sign(msg []byte) []byte
}

// Handler trains one job for the device from: j.Steps and j.HeldBack are
// that device's, j.Prev its adapter so far ("" for a fresh one), j.Out
// the directory to write the new adapter to, j.SharedVersion the shared
// version it is stacked on ("" for the base alone), which the handler
// resolves to its own copy (j.Shared is ""); an error wrapping
// ErrUnknownVersion says it holds no such version.
type Handler func(ctx context.Context, from mesh.PeerID, j core.PersonalJob) (core.PersonalResult, error)

// ServerConfig configures a Server. The zero value of each optional field
// means its default.
type ServerConfig struct {
	// Host serves the protocol; Mesh says who is admitted and signs the
	// replies. Required.
	Host mesh.Host
	Mesh Signer
	// Handler trains a job. Required.
	Handler Handler
	// TempDir holds the jobs while they run, each in a directory of its
	// own, removed once its reply is sent: the steps and the adapters are
	// never kept. Serve removes the jobs' directories a crash left there.
	// Required.
	TempDir string
	// MaxJobs is how many jobs run at once (default 1); PerHour how many
	// one device may start in an hour (default DefaultPerHour). A device
	// runs one job at a time.
	MaxJobs int
	PerHour int
	// JobTimeout bounds one job's training (default DefaultJobTimeout).
	JobTimeout time.Duration
	// Stall is how long a device may send nothing, or take nothing of
	// the reply, before its stream is cut (default DefaultStall).
	Stall  time.Duration
	Limits Limits
	Now    func() time.Time
	Logger *slog.Logger
}

// Defaults of ServerConfig (and the Client's).
const (
	DefaultPerHour    = 12
	DefaultJobTimeout = 30 * time.Minute
	DefaultStall      = 30 * time.Second
	// headerTimeout bounds the reading of a request's header, and the
	// wait for the trainer's first answer.
	headerTimeout = 10 * time.Second
	// jobPrefix names a job's directory in TempDir.
	jobPrefix = "job-"
)

// Server serves the personal adapter protocol: it trains, with its
// Handler, the jobs the mesh's member devices send, and sends each
// adapter back on the stream that asked for it, only there.
type Server struct {
	cfg    ServerConfig
	lim    Limits
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{} // a token per job running
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	active  map[mesh.PeerID]mesh.Stream // devices with a stream in hand, and it
	started map[mesh.PeerID][]time.Time // when each device's jobs of the last hour started
}

// Serve starts serving Protocol on cfg.Host.
func Serve(cfg ServerConfig) (*Server, error) {
	if cfg.Host == nil || cfg.Mesh == nil || cfg.Handler == nil || cfg.TempDir == "" {
		return nil, errors.New("personal: a server needs a Host, a Mesh, a Handler and a TempDir")
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = 1
	}
	if cfg.PerHour <= 0 {
		cfg.PerHour = DefaultPerHour
	}
	if cfg.JobTimeout <= 0 {
		cfg.JobTimeout = DefaultJobTimeout
	}
	if cfg.Stall <= 0 {
		cfg.Stall = DefaultStall
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.TempDir, 0o700); err != nil {
		return nil, err
	}
	// A crash mid-job leaves a device's steps here: they go now.
	left, err := filepath.Glob(filepath.Join(cfg.TempDir, jobPrefix+"*"))
	if err != nil {
		return nil, err
	}
	for _, d := range left {
		if err := os.RemoveAll(d); err != nil {
			return nil, fmt.Errorf("personal: clearing a job a crash left: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, lim: cfg.Limits.withDefaults(), log: cfg.Logger.With("component", "personal"), ctx: ctx, cancel: cancel,
		slots: make(chan struct{}, cfg.MaxJobs), active: map[mesh.PeerID]mesh.Stream{}, started: map[mesh.PeerID][]time.Time{}}
	cfg.Host.Handle(Protocol, s.handle)
	return s, nil
}

// Close stops serving, cancels the jobs running, cuts their streams and
// waits for them.
func (s *Server) Close() error {
	s.cfg.Host.Handle(Protocol, nil)
	s.mu.Lock()
	s.closed = true
	for _, st := range s.active {
		st.Reset()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// enter takes the device's one stream; false when it has one already, or
// the server is closed.
func (s *Server) enter(p mesh.PeerID, st mesh.Stream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.active[p] != nil {
		return false
	}
	s.active[p] = st
	s.wg.Add(1)
	return true
}

func (s *Server) leave(p mesh.PeerID) {
	s.mu.Lock()
	delete(s.active, p)
	s.mu.Unlock()
	s.wg.Done()
}

// start takes a job slot for device p, within its hourly budget; the
// caller gives the slot back with <-s.slots.
func (s *Server) start(p mesh.PeerID) error {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Forget what is older than an hour, for every device: the map holds
	// only the devices of the last hour.
	for d, ts := range s.started {
		i := 0
		for i < len(ts) && now.Sub(ts[i]) >= time.Hour {
			i++
		}
		if i == len(ts) {
			delete(s.started, d)
		} else {
			s.started[d] = ts[i:]
		}
	}
	if n := len(s.started[p]); n >= s.cfg.PerHour {
		return fmt.Errorf("%w: %d jobs of this device in the last hour, limit %d", ErrBusy, n, s.cfg.PerHour)
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return fmt.Errorf("%w: %d jobs running, limit %d", ErrBusy, len(s.slots), cap(s.slots))
	}
	s.started[p] = append(s.started[p], now)
	return nil
}

// refund gives back the hourly budget the latest job of device p took.
func (s *Server) refund(p mesh.PeerID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ts := s.started[p]; len(ts) > 0 {
		s.started[p] = ts[:len(ts)-1]
	}
}

// maxDrain bounds what a device may still send once its stream is
// answered: the rest of a header, or of parts the trainer no longer reads.
const maxDrain = 64 << 10

// finish ends an exchange: the reply is complete, and, when drain, what
// the device still sends is read (a little of it, for a little while: the
// device reads the answer, not a reset) before the stream is closed.
// Without drain a watcher of the job reads the stream, and it alone.
func finish(st mesh.Stream, drain bool) {
	st.CloseWrite()
	if drain {
		st.SetReadDeadline(time.Now().Add(headerTimeout))
		io.CopyN(io.Discard, st, maxDrain)
	}
	st.Close()
}

// answer writes a reply that ends the exchange (handle closes the stream
// once the job is cleared away).
func answer(st mesh.Stream, status, msg string) {
	b, err := encodeMsg(reply{Status: status, Error: clip(msg, maxError)})
	if err == nil {
		st.SetWriteDeadline(time.Now().Add(headerTimeout))
		st.Write(b)
	}
}

func (s *Server) handle(st mesh.Stream) {
	p := st.RemotePeer()
	// Ended last: the device reads the end of the reply only once the
	// job's directory is gone and its slot given back.
	drain := true
	defer func() { finish(st, drain) }()
	// The host lets only admitted peers open the protocol; only devices
	// (members) have personal adapters, and the certificate is checked
	// again now.
	if pe, ok := s.cfg.Mesh.Peer(p); !ok || pe.Cert.Role() != member.RoleMember {
		s.log.Debug("refused a personal job: not a member device", "peer", p)
		answer(st, statusRefused, "only the mesh's member devices have personal adapters trained")
		return
	}
	if !s.enter(p, st) {
		answer(st, statusBusy, "this device has a job here already")
		return
	}
	defer s.leave(p)
	if err := s.serve(st, p, &drain); err != nil {
		s.log.Info("personal job refused or failed", "device", p, "err", err)
	}
}

// serve runs one exchange with device p; it clears *drain once a job's
// watcher reads the stream.
func (s *Server) serve(st mesh.Stream, p mesh.PeerID, drain *bool) error {
	rd := &deadlineReader{s: st, stall: s.cfg.Stall, hard: time.Now().Add(headerTimeout)}
	br := bufio.NewReaderSize(rd, 64<<10)
	var req request
	frame, err := readMsg(br, &req)
	if err == nil {
		err = req.check(s.lim)
	}
	if err != nil {
		// Answered before the rest is read: what follows is never read.
		if errors.Is(err, ErrTooLarge) {
			answer(st, statusTooLarge, err.Error())
		} else {
			answer(st, statusBad, err.Error())
		}
		return err
	}
	if req.Device != string(p) {
		answer(st, statusRefused, "a device asks for its own adapter only: the request names another peer than the one that sent it")
		return fmt.Errorf("%w: the request names %s", ErrRefused, clip(req.Device, maxPeerID))
	}
	if err := s.start(p); err != nil {
		answer(st, statusBusy, err.Error())
		return err
	}
	defer func() { <-s.slots }()
	b, _ := encodeMsg(reply{Status: statusAccepted})
	st.SetWriteDeadline(time.Now().Add(headerTimeout))
	if _, err := st.Write(b); err != nil {
		st.Reset()
		return err
	}

	dir, err := os.MkdirTemp(s.cfg.TempDir, jobPrefix)
	if err != nil {
		answer(st, statusFailed, "the trainer cannot make room for the job")
		return err
	}
	defer os.RemoveAll(dir)
	digest := sha256.New()
	digest.Write(frame)
	rd.hard = time.Time{}
	j, err := readJob(io.TeeReader(br, digest), &req, s.lim, dir)
	if err == nil && br.Buffered() > 0 {
		err = fmt.Errorf("%w: bytes after the request", ErrMessage)
	}
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			answer(st, statusTooLarge, err.Error())
		} else {
			answer(st, statusBad, err.Error())
		}
		return err
	}
	var reqSum [sha256.Size]byte
	digest.Sum(reqSum[:0])

	// The device sends nothing more: a read that ends (it gave up and
	// reset the stream) or returns data cancels the job.
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.JobTimeout)
	defer cancel()
	st.SetReadDeadline(time.Time{})
	*drain = false
	go func() {
		var one [1]byte
		st.Read(one[:])
		cancel()
	}()
	began := time.Now()
	res, err := s.cfg.Handler(ctx, p, j)
	if err == nil && !validResult(res) {
		err = fmt.Errorf("the trainer made an impossible result %+v", res)
	}
	if err != nil {
		if ctx.Err() != nil && s.ctx.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w (the trainer's limit is %s)", err, s.cfg.JobTimeout)
		}
		if errors.Is(err, ErrBusy) {
			// The trainer could not take the job (not ready yet): it is
			// not counted against the device's hour.
			s.refund(p)
		}
		answer(st, errStatus(err), err.Error())
		return err
	}
	if err := s.send(st, p, &req, reqSum, j.Out, res); err != nil {
		st.Reset()
		return err
	}
	s.log.Info("personal adapter trained and sent", "device", p, "steps", len(j.Steps), "held_back", len(j.HeldBack),
		"score_before", res.ScoreBefore, "score_after", res.ScoreAfter, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// readJob reads a request's four parts, whose sizes req gives and lim
// bounds, writing the previous adapter (if any) into dir/prev, and
// returns the job, with Out set to dir/out.
func readJob(r io.Reader, req *request, lim Limits, dir string) (core.PersonalJob, error) {
	lim = lim.withDefaults()
	j := core.PersonalJob{SharedVersion: req.SharedVersion, Seed: req.Seed, Out: filepath.Join(dir, "out")}
	var err error
	if j.Steps, err = readSteps(r, req.Steps, lim); err != nil {
		return j, fmt.Errorf("the steps: %w", err)
	}
	if j.HeldBack, err = readSteps(r, req.HeldBack, lim); err != nil {
		return j, fmt.Errorf("the held-back steps: %w", err)
	}
	if req.Config == 0 {
		return j, nil
	}
	prev := filepath.Join(dir, "prev")
	if err := os.Mkdir(prev, 0o700); err != nil {
		return j, err
	}
	if err := readAdapter(r, req.Config, req.Weights, prev); err != nil {
		return j, fmt.Errorf("the previous adapter: %w", err)
	}
	j.Prev = prev
	return j, nil
}

// readSteps reads n bytes of steps (none when n is 0), growing its buffer
// as they arrive.
func readSteps(r io.Reader, n int64, lim Limits) ([]*core.Step, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := readN(r, n)
	if err != nil {
		return nil, err
	}
	bt, err := batch.Decode(b, batch.Limits{MaxBytes: lim.MaxStepBytes, MaxSteps: lim.MaxSteps})
	switch {
	case errors.Is(err, batch.ErrTooLarge):
		return nil, fmt.Errorf("%w: %v", ErrTooLarge, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrMessage, err)
	}
	return bt.Steps, nil
}

// readN reads exactly n bytes, the buffer growing as they arrive (never
// made from the declared size).
func readN(r io.Reader, n int64) ([]byte, error) {
	var buf []byte
	var chunk [32 << 10]byte
	for int64(len(buf)) < n {
		k, err := r.Read(chunk[:min(int64(len(chunk)), n-int64(len(buf)))])
		buf = append(buf, chunk[:k]...)
		if err != nil {
			if int64(len(buf)) == n {
				break
			}
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("%w: cut after %d of %d bytes", ErrMessage, len(buf), n)
			}
			return nil, err
		}
	}
	return buf, nil
}

// readAdapter reads an adapter's config (cfgSize bytes) and weights
// (weightsSize bytes) into dir, and checks them.
func readAdapter(r io.Reader, cfgSize, weightsSize int64, dir string) error {
	cfg, err := readN(r, cfgSize)
	if err != nil {
		return err
	}
	if err := checkConfig(cfg); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), cfg, 0o600); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, WeightsFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	got, err := io.CopyN(f, r, weightsSize)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: weights cut after %d of %d bytes", ErrMessage, got, weightsSize)
		}
		return err
	}
	rf, err := os.Open(f.Name())
	if err != nil {
		return err
	}
	defer rf.Close()
	return checkWeights(rf, weightsSize)
}

// send reads the adapter the handler wrote in out, bounded as a device
// bounds it, and sends it with the result, signed for this device and
// this job.
func (s *Server) send(st mesh.Stream, p mesh.PeerID, req *request, reqSum [sha256.Size]byte, out string, res core.PersonalResult) error {
	cfg, err := os.ReadFile(filepath.Join(out, ConfigFile))
	if err == nil && int64(len(cfg)) > s.lim.MaxConfig {
		err = fmt.Errorf("%w: the adapter's config is %d bytes, limit %d", ErrTooLarge, len(cfg), s.lim.MaxConfig)
	}
	if err == nil {
		err = checkConfig(cfg)
	}
	var wf *os.File
	var size int64
	if err == nil {
		wf, err = os.Open(filepath.Join(out, WeightsFile))
	}
	if err == nil {
		defer wf.Close()
		var fi os.FileInfo
		if fi, err = wf.Stat(); err == nil {
			size = fi.Size()
			if size > s.lim.MaxWeights {
				err = fmt.Errorf("%w: the adapter's weights are %d bytes, limit %d", ErrTooLarge, size, s.lim.MaxWeights)
			} else {
				err = checkWeights(wf, size)
			}
		}
	}
	var wsum [sha256.Size]byte
	if err == nil {
		wsum, err = sumFile(wf)
	}
	if err != nil {
		answer(st, statusFailed, "the trainer made no usable adapter: "+err.Error())
		return err
	}
	csum := sha256.Sum256(cfg)
	sig := s.cfg.Mesh.Sign(signedReply(s.cfg.Mesh.ID(), p, req.Nonce, reqSum, csum, wsum, res))
	head, err := encodeMsg(reply{Status: statusOK, Result: &res, Config: int64(len(cfg)), Weights: size, Sig: hexSig(sig)})
	if err != nil {
		return err
	}
	w := &deadlineWriter{s: st, stall: s.cfg.Stall}
	if _, err := w.Write(append(head, cfg...)); err != nil {
		return err
	}
	if _, err := wf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err = io.CopyN(w, wf, size)
	return err
}

// sumFile returns the SHA-256 of f's content.
func sumFile(f *os.File) (sum [sha256.Size]byte, err error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return sum, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	return sum, nil
}

// deadlineReader reads a stream, giving each read stall to make progress
// (when set) and all of them until hard (when set).
type deadlineReader struct {
	s     mesh.Stream
	stall time.Duration
	hard  time.Time
}

func (r *deadlineReader) Read(p []byte) (int, error) {
	var d time.Time // none, when neither is set
	if r.stall > 0 {
		d = time.Now().Add(r.stall)
	}
	if !r.hard.IsZero() && (d.IsZero() || r.hard.Before(d)) {
		d = r.hard
	}
	r.s.SetReadDeadline(d)
	return r.s.Read(p)
}

// deadlineWriter writes to a stream in chunks, giving each stall to be
// taken.
type deadlineWriter struct {
	s     mesh.Stream
	stall time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		k := min(len(p), 256<<10)
		w.s.SetWriteDeadline(time.Now().Add(w.stall))
		m, err := w.s.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}
