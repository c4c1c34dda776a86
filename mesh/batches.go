package mesh

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
)

// Manifest announces a batch on the mesh: enough to decide whether to pull
// it, and nothing that names the device it came from (the gossip message
// that carries it is signed by that device: Message.Author).
type Manifest struct {
	ID       core.BatchID        `json:"id"`
	Size     int64               `json:"size"`
	Steps    int                 `json:"steps"`
	Sessions int                 `json:"sessions"`
	Rewards  batch.RewardSummary `json:"rewards"`
	Plugins  []string            `json:"plugins,omitempty"`
	Adapters []string            `json:"adapters,omitempty"`
	Policy   string              `json:"policy,omitempty"`
	Created  time.Time           `json:"created"`
	// Round counts the announcements of the batch: gossip identifies a
	// message by its content and forgets none for minutes, so a repeated
	// announcement must differ from the last.
	Round int `json:"round"`
}

// MaxManifest bounds an announcement.
const MaxManifest = 16 << 10

// ManifestOf makes the manifest of a batch's bytes.
func ManifestOf(payload []byte) (Manifest, error) {
	h, err := batch.DecodeHeader(payload, batch.Limits{})
	if err != nil {
		return Manifest{}, err
	}
	return Manifest{
		ID: batch.ID(payload), Size: int64(len(payload)), Steps: h.Steps, Sessions: h.Sessions, Rewards: h.Rewards,
		Plugins: h.Plugins, Adapters: h.Adapters, Policy: h.Policy, Created: h.Created,
	}, nil
}

// ParseManifest reads an announcement from a peer.
func ParseManifest(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) > MaxManifest {
		return m, fmt.Errorf("%w: manifest of %d bytes", ErrMessage, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: manifest: %v", ErrMessage, err)
	}
	if dec.More() {
		return m, fmt.Errorf("%w: manifest: trailing data", ErrMessage)
	}
	if !validBatchID(m.ID) || m.Size <= 0 || m.Steps <= 0 || m.Sessions <= 0 || m.Sessions > m.Steps || m.Round < 0 {
		return m, fmt.Errorf("%w: manifest: id %q, size %d, %d steps in %d sessions", ErrMessage, m.ID, m.Size, m.Steps, m.Sessions)
	}
	return m, nil
}

func validBatchID(id core.BatchID) bool {
	if len(id) != 64 {
		return false
	}
	_, err := hex.DecodeString(string(id))
	return err == nil && string(id) == hexLower(string(id))
}

func hexLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'F' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// ---- acks

// Ack says a trainer has stored a batch. It travels on gossip (which
// carries no author), so it is signed by the trainer and carries its
// certificate.
type Ack struct {
	ID      core.BatchID `json:"id"`
	Trainer PeerID       `json:"trainer"`
	// At is when it was made (Unix seconds), so that an ack repeated for a
	// repeated announcement is not taken by gossip for the same message.
	At   int64  `json:"at"`
	Cert string `json:"cert"` // hex
	Sig  string `json:"sig"`  // hex, over ackBody
}

func ackBody(meshID string, id core.BatchID, at int64) []byte {
	return fmt.Appendf(nil, "clawmesh/ack\n%s\n%s\n%d", meshID, id, at)
}

func (m *Mesh) newAck(id core.BatchID) Ack {
	at := m.now().UnixNano()
	sig := ed25519.Sign(m.cfg.Key, ackBody(m.state.MeshID, id, at))
	return Ack{ID: id, Trainer: m.self, At: at, Cert: hex.EncodeToString(m.Cert().Marshal()), Sig: hex.EncodeToString(sig)}
}

// verifyAck checks an ack: a trainer of this mesh signed it.
func (m *Mesh) verifyAck(b []byte) (Ack, error) {
	var a Ack
	if len(b) > maxMsg {
		return a, fmt.Errorf("%w: ack of %d bytes", ErrMessage, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil || !validBatchID(a.ID) {
		return a, fmt.Errorf("%w: ack", ErrMessage)
	}
	cert, err := m.verifyPeerCert(a.Trainer, a.Cert)
	if err != nil {
		return a, err
	}
	if cert.Role() != member.RoleTrainer {
		return a, fmt.Errorf("%w: an ack from %s, a %s, not a trainer", member.ErrNotAllowed, a.Trainer, cert.Role())
	}
	sig, err := hex.DecodeString(a.Sig)
	if err != nil || !ed25519.Verify(cert.SubjectKey(), ackBody(m.state.MeshID, a.ID, a.At), sig) {
		return a, fmt.Errorf("%w: ack signature", member.ErrTampered)
	}
	return a, nil
}

// ---- pull

// Source serves batch bytes by id: a node's outbox, a trainer's store.
type Source interface {
	// Payload returns the bytes of a batch, or an error wrapping
	// ErrNoBatch.
	Payload(ctx context.Context, id core.BatchID) ([]byte, error)
}

// ErrNoBatch reports a batch a source does not hold.
var ErrNoBatch = errors.New("mesh: no such batch")

type pullRequest struct {
	ID core.BatchID `json:"id"`
}

type pullReply struct {
	Status string `json:"status"` // "ok", "not_found", "refused"
	Size   int64  `json:"size,omitempty"`
	Error  string `json:"error,omitempty"`
}

// servePull answers pull requests from trainers with src's batches, at
// most ServesPerPeer streams of one peer at a time (more are reset).
func (m *Mesh) servePull(src Source) {
	var mu sync.Mutex
	serving := map[PeerID]int{}
	m.host.Handle(ProtoPull, func(s Stream) {
		defer s.Close()
		p := s.RemotePeer()
		mu.Lock()
		if serving[p] >= ServesPerPeer {
			mu.Unlock()
			m.log.Debug("a pull refused: too many from one peer at once", "peer", p)
			s.Reset()
			return
		}
		serving[p]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			if serving[p]--; serving[p] == 0 {
				delete(serving, p)
			}
			mu.Unlock()
		}()
		s.SetDeadline(time.Now().Add(exchangeTimeout))
		var req pullRequest
		if err := readMsg(bufio.NewReader(s), &req, maxMsg); err != nil || !validBatchID(req.ID) {
			s.Reset()
			return
		}
		pe, ok := m.Peer(p)
		if !ok || pe.Cert.Role() != member.RoleTrainer {
			writeMsg(s, pullReply{Status: "refused", Error: "only trainers pull batches"})
			return
		}
		r, size, err := openPayload(src, req.ID)
		if err != nil {
			writeMsg(s, pullReply{Status: "not_found"})
			return
		}
		defer r.Close()
		if err := writeMsg(s, pullReply{Status: "ok", Size: size}); err != nil {
			return
		}
		// The bytes go in chunks, each with its own deadline: a slow
		// reader is fine, a stalled one is cut.
		buf := make([]byte, 256<<10)
		for sent := int64(0); sent < size; {
			n, err := r.Read(buf[:min(int64(len(buf)), size-sent)])
			if n > 0 {
				s.SetWriteDeadline(time.Now().Add(m.stall()))
				if _, werr := s.Write(buf[:n]); werr != nil {
					s.Reset()
					return
				}
				sent += int64(n)
			}
			if err != nil && sent < size {
				s.Reset()
				return
			}
		}
	})
}

// StreamSource is a Source that can stream a batch rather than hold it
// whole in memory.
type StreamSource interface {
	OpenPayload(ctx context.Context, id core.BatchID) (io.ReadCloser, int64, error)
}

func openPayload(src Source, id core.BatchID) (io.ReadCloser, int64, error) {
	if ss, ok := src.(StreamSource); ok {
		return ss.OpenPayload(context.Background(), id)
	}
	b, err := src.Payload(context.Background(), id)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

// DefaultStall is how long a pull may make no progress before it is given
// up (and tried again at the batch's next announcement).
const DefaultStall = 10 * time.Second

func (m *Mesh) stall() time.Duration {
	if m.cfg.Stall > 0 {
		return m.cfg.Stall
	}
	return DefaultStall
}

// ErrStalled reports a pull that made no progress for the stall timeout.
var ErrStalled = errors.New("mesh: pull stalled")

// Pull pulls batch id, of size bytes, from peer p as Collect does (but
// outside Collect's bounds), and checks its size and hash (not its
// contents: batch.Verify does).
func (m *Mesh) Pull(ctx context.Context, p PeerID, id core.BatchID, size int64) ([]byte, error) {
	return m.pullFrom(ctx, p, Manifest{ID: id, Size: size}, size, nil)
}

// pullFrom pulls batch id from peer p and checks its size and hash. The
// memory it takes is counted in stats, if not nil.
func (m *Mesh) pullFrom(ctx context.Context, p PeerID, man Manifest, maxSize int64, stats *PullStats) ([]byte, error) {
	sctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	s, err := m.host.NewStream(sctx, p, ProtoPull)
	cancel()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if s.RemotePeer() != p {
		s.Reset()
		return nil, fmt.Errorf("mesh: a pull from %s answered by %s", p, s.RemotePeer())
	}
	s.SetDeadline(time.Now().Add(m.stall()))
	if err := writeMsg(s, pullRequest{ID: man.ID}); err != nil {
		s.Reset()
		return nil, err
	}
	br := bufio.NewReaderSize(s, 64<<10)
	size, err := readPullReply(br, man, maxSize)
	if err != nil {
		s.Reset()
		return nil, err
	}
	buf, err := m.readBody(s, br, size, stats)
	if err == nil && batch.ID(buf) != man.ID {
		err = fmt.Errorf("%w: pulled bytes do not hash to %s", batch.ErrHashMismatch, man.ID)
	}
	if err != nil {
		stats.release(buf)
	}
	switch {
	case errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: cut after %d of %d bytes", ErrMessage, len(buf), size)
	case isTimeout(err):
		return nil, fmt.Errorf("%w after %d of %d bytes", ErrStalled, len(buf), size)
	case err != nil:
		return nil, err
	}
	return buf, nil
}

// readPullReply reads the reply to a pull of man and returns the size of
// the body that follows: exactly the size announced, at most maxSize.
func readPullReply(br *bufio.Reader, man Manifest, maxSize int64) (int64, error) {
	var rep pullReply
	if err := readMsg(br, &rep, maxMsg); err != nil {
		return 0, err
	}
	switch {
	case rep.Status == "not_found":
		return 0, ErrNoBatch
	case rep.Status != "ok":
		return 0, fmt.Errorf("mesh: pull refused: %.200q", rep.Error)
	case rep.Size <= 0 || rep.Size > maxSize || rep.Size != man.Size:
		return 0, fmt.Errorf("%w: a batch of %d bytes (announced %d, limit %d)", ErrMessage, rep.Size, man.Size, maxSize)
	}
	return rep.Size, nil
}

// firstRead is the buffer a pull's body starts in; it doubles as the bytes
// arrive, up to the size of the batch.
const firstRead = 64 << 10

// readBody reads a reply's body of size bytes, giving the peer the stall
// time for each read. Memory is taken as the bytes arrive, never more than
// size, whatever size says: a peer that promises 32 MiB and sends 1 KiB
// costs 64 KiB. On an error the stream is reset, and the bytes read so
// far are returned; io.EOF means the peer ended the stream early.
func (m *Mesh) readBody(s Stream, br io.Reader, size int64, stats *PullStats) (buf []byte, err error) {
	buf = stats.grow(nil, min(size, firstRead))
	for int64(len(buf)) < size {
		if len(buf) == cap(buf) {
			buf = stats.grow(buf, min(2*int64(cap(buf)), size))
		}
		s.SetReadDeadline(time.Now().Add(m.stall()))
		var n int
		n, err = br.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil && !(errors.Is(err, io.EOF) && int64(len(buf)) == size) {
			s.Reset()
			return buf, err
		}
	}
	return buf, nil
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// ---- the node's side: announce, serve, take acks

// Outbox is what a node ships: sealed batches until a trainer acks them.
type Outbox interface {
	Source
	// Unshipped lists the sealed batches no trainer has acked yet.
	Unshipped(ctx context.Context) ([]core.BatchID, error)
	// Shipped records the first ack of a batch.
	Shipped(ctx context.Context, id core.BatchID) error
}

// ShipOptions time the announcements of unshipped batches: the first at
// once (at most AnnounceBurst/2 at once, then AnnounceRate/2 a second:
// well within what a trainer takes from one device), then again after
// Retry, doubling up to MaxRetry, until acked; and
// again whenever a trainer is admitted (after Settle, at most once per
// ArrivalGap), so that a batch sealed before any trainer was in the mesh
// does not wait out its backoff.
type ShipOptions struct {
	Retry, MaxRetry time.Duration // defaults 30s and 30m
	// Poll is how often the outbox is looked at for new batches; default 2s.
	Poll time.Duration
	// Settle is how long after a trainer's admission the batches are
	// announced again (its gossip subscription settles meanwhile); default
	// 1s. ArrivalGap bounds how often arrivals do it; default 10s.
	Settle, ArrivalGap time.Duration
}

// schedule is when each unshipped batch is announced next.
type schedule struct {
	mu   sync.Mutex
	next map[core.BatchID]*announcement
}

// announcement is when a batch is announced next, and how.
type announcement struct {
	at    time.Time
	delay time.Duration
	round int
	man   *Manifest // read from the batch once
}

// NextAnnounce is when Ship announces batch id again, if it is shipping
// it (and this peer was not removed from the mesh).
func (m *Mesh) NextAnnounce(id core.BatchID) (time.Time, bool) {
	if m.Revoked() != nil {
		return time.Time{}, false
	}
	m.ship.mu.Lock()
	defer m.ship.mu.Unlock()
	n, ok := m.ship.next[id]
	if !ok {
		return time.Time{}, false
	}
	return n.at, true
}

// Ship announces out's unshipped batches to the mesh, serves them to the
// trainers that pull them, and marks each shipped at its first valid ack,
// until ctx is done. A peer removed from the mesh announces nothing.
func (m *Mesh) Ship(ctx context.Context, out Outbox, o ShipOptions) error {
	if o.Retry <= 0 {
		o.Retry = 30 * time.Second
	}
	if o.MaxRetry < o.Retry {
		o.MaxRetry = max(o.Retry, 30*time.Minute)
	}
	if o.Poll <= 0 {
		o.Poll = 2 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = time.Second
	}
	if o.ArrivalGap <= 0 {
		o.ArrivalGap = 10 * time.Second
	}
	topic, acks, err := m.joinBatchTopics()
	if err != nil {
		return err
	}
	defer topic.Close()
	defer acks.Close()
	m.servePull(out)

	// Announcements go at half the rate, and half the burst, that a
	// trainer takes from one device (AnnounceRate, AnnounceBurst), so that
	// one with many batches waiting is never over it.
	pace := rate.NewLimiter(AnnounceRate/2, AnnounceBurst/2)
	sched := &m.ship
	sched.mu.Lock()
	sched.next = map[core.BatchID]*announcement{}
	sched.mu.Unlock()
	go func() {
		for {
			msg, err := acks.Next(ctx)
			if err != nil {
				return
			}
			a, err := m.verifyAck(msg.Data)
			if err != nil {
				m.log.Debug("an ack refused", "err", err)
				continue
			}
			sched.mu.Lock()
			_, ours := sched.next[a.ID]
			delete(sched.next, a.ID)
			sched.mu.Unlock()
			if !ours {
				continue
			}
			if err := out.Shipped(ctx, a.ID); err != nil {
				m.log.Warn("marking a batch shipped", "batch", a.ID, "err", err)
				continue
			}
			m.log.Info("batch shipped", "batch", a.ID, "trainer", a.Trainer)
		}
	}()
	var arrival, lastArrival time.Time // when to announce for a trainer's arrival; when it was last done
	for {
		now := time.Now()
		if !arrival.IsZero() && !now.Before(arrival) {
			// A trainer arrived: every unshipped batch is due now, its
			// backoff kept.
			arrival, lastArrival = time.Time{}, now
			sched.mu.Lock()
			for _, n := range sched.next {
				n.at = now
			}
			sched.mu.Unlock()
		}
		ids, err := out.Unshipped(ctx)
		if err != nil && ctx.Err() == nil {
			m.log.Warn("listing unshipped batches", "err", err)
		}
		if m.Revoked() != nil {
			ids = nil // removed from the mesh: no one would take them
		}
		if err == nil {
			// Forget the batches the outbox no longer lists as unshipped.
			listed := make(map[core.BatchID]bool, len(ids))
			for _, id := range ids {
				listed[id] = true
			}
			sched.mu.Lock()
			for id := range sched.next {
				if !listed[id] {
					delete(sched.next, id)
				}
			}
			sched.mu.Unlock()
		}
		for _, id := range ids {
			sched.mu.Lock()
			n, ok := sched.next[id]
			if !ok {
				n = &announcement{at: now, delay: o.Retry}
				sched.next[id] = n
			}
			due := !now.Before(n.at)
			round, man := n.round, n.man
			if due && !pace.AllowN(now, 1) {
				// Over the pace the trainers allow: it stays due, for the
				// next turn of the loop.
				sched.mu.Unlock()
				continue
			}
			if due {
				n.at = now.Add(n.delay)
				n.delay = min(2*n.delay, o.MaxRetry)
				n.round++
			}
			sched.mu.Unlock()
			if !due {
				continue
			}
			if man == nil {
				if man = m.manifest(ctx, out, id); man == nil {
					continue
				}
				sched.mu.Lock()
				n.man = man
				sched.mu.Unlock()
			}
			m.announce(ctx, topic, *man, round)
		}
		wait := o.Poll
		if !arrival.IsZero() {
			wait = min(wait, max(time.Until(arrival), 0))
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-m.trainerIn:
			if arrival.IsZero() {
				arrival = time.Now().Add(o.Settle)
				if gap := lastArrival.Add(o.ArrivalGap); gap.After(arrival) {
					arrival = gap
				}
			}
		case <-timer.C:
		}
		timer.Stop()
	}
}

// manifest reads a batch of out and makes its manifest, or logs why not.
func (m *Mesh) manifest(ctx context.Context, out Outbox, id core.BatchID) *Manifest {
	payload, err := out.Payload(ctx, id)
	if err != nil {
		m.log.Warn("reading a batch to announce", "batch", id, "err", err)
		return nil
	}
	man, err := ManifestOf(payload)
	if err != nil {
		m.log.Warn("a sealed batch does not decode", "batch", id, "err", err)
		return nil
	}
	return &man
}

func (m *Mesh) announce(ctx context.Context, topic Topic, man Manifest, round int) {
	man.Round = round
	b, _ := json.Marshal(man)
	if err := topic.Publish(ctx, b); err != nil {
		m.log.Debug("announcing a batch", "batch", man.ID, "err", err)
		return
	}
	m.log.Debug("batch announced", "batch", man.ID, "steps", man.Steps)
}

// joinBatchTopics joins the topics of announcements and acks.
func (m *Mesh) joinBatchTopics() (batches, acks Topic, err error) {
	batches, err = m.host.Join(topicBatches(m.state.MeshID))
	if err != nil {
		return nil, nil, err
	}
	acks, err = m.host.Join(topicAcks(m.state.MeshID))
	if err != nil {
		batches.Close()
		return nil, nil, err
	}
	return batches, acks, nil
}

// ---- the trainer's side: pull, verify, store, ack

// Store is where a trainer keeps the batches it pulled.
type Store interface {
	Source
	Has(ctx context.Context, id core.BatchID) (bool, error)
	// Put stores a verified batch durably before it returns.
	Put(ctx context.Context, id core.BatchID, payload []byte, b *batch.Batch) error
}

// OriginStore is a Store that also keeps the device each batch is
// credited to: the author of its announcement, authenticated by the
// announcement's signature, from whom it was pulled over a stream its
// handshake authenticated. Collect calls PutFrom instead of Put when the
// store has it.
type OriginStore interface {
	Store
	PutFrom(ctx context.Context, id core.BatchID, from PeerID, payload []byte, b *batch.Batch) error
}

// Bounds on the work one peer can make another do. A peer past one is
// slowed (its work waits) or its work is dropped; what only a faulty or
// hostile peer does (announcements over its rate, malformed ones, batches
// announced and not served, bytes that do not match, stalls) earns it a
// strike, and MaxStrikes strikes within their decay (one is forgotten
// every StrikeDecay) disconnect it.
const (
	// PullsPerPeer is how many pulls from one device a trainer runs at
	// once; PullQueue more of its announcements may wait for a turn, and
	// the rest are dropped.
	PullsPerPeer = 2
	PullQueue    = 8
	// ServesPerPeer is how many pull streams of one trainer a peer serves
	// at once; more are reset.
	ServesPerPeer = 2
	// AnnounceRate and AnnounceBurst are the token bucket of the
	// announcements a trainer takes from one device: a burst of 128, then
	// 8 a second. The rest are dropped, each with a strike. Ship keeps to
	// half of both.
	AnnounceRate  rate.Limit = 8
	AnnounceBurst            = 128
	// MaxStrikes and StrikeDecay: see above.
	MaxStrikes  = 16
	StrikeDecay = 5 * time.Second
	// DefaultPullBudget bounds the bytes of the batches a trainer pulls at
	// once, from every peer together.
	DefaultPullBudget = 512 << 20
)

// PullOptions bound what a trainer accepts.
type PullOptions struct {
	Limits batch.Limits
	// Budget bounds the bytes of the batches being pulled at once, all
	// peers together (each pull holds its announced size until its batch
	// is stored or refused, and waits for room); default
	// DefaultPullBudget. It must hold the largest batch accepted
	// (Limits.MaxBytes).
	Budget int64
	// Stats, if not nil, counts what Collect does and refuses.
	Stats *PullStats
}

// DefaultMaxBatch is the largest batch a trainer accepts by default (the
// default batch.Limits.MaxBytes).
const DefaultMaxBatch = 32 << 20

func maxBatch(lim batch.Limits) int64 {
	if lim.MaxBytes <= 0 {
		return DefaultMaxBatch
	}
	return lim.MaxBytes
}

// CheckBudget says whether a pull budget (0: the default) holds the
// largest batch lim accepts.
func CheckBudget(budget int64, lim batch.Limits) error {
	if budget == 0 {
		budget = DefaultPullBudget
	}
	if max := maxBatch(lim); budget < max {
		return fmt.Errorf("mesh: a pull budget of %d bytes holds no batch of the %d bytes accepted; it must be at least that", budget, max)
	}
	return nil
}

// PullStats counts the announcements a trainer took and dropped, its
// pulls, the strikes and disconnections of the peers that overstep, and
// the memory its pulls take. Its owner reads it at any time (a trainer's
// metrics).
type PullStats struct {
	// Announcements received; Dropped of them: over the author's rate or
	// queue, from a peer that is not an admitted device, or malformed.
	Announcements, Dropped atomic.Int64
	// Pulls started, Failed of them (including batches refused once
	// pulled).
	Pulls, Failed atomic.Int64
	// Strikes given, and Disconnects of the peers that had too many.
	Strikes, Disconnects atomic.Int64
	// Allocated counts the bytes allocated for batch bodies, in all;
	// Held those held now, HeldPeak the most held at once. Reserved is
	// the part of the budget the pulls in progress hold.
	Allocated, Held, HeldPeak, Reserved atomic.Int64
}

// grow returns a buffer of capacity n holding buf's bytes, counting the
// memory. A nil PullStats counts nothing.
func (st *PullStats) grow(buf []byte, n int64) []byte {
	nb := make([]byte, len(buf), n)
	copy(nb, buf)
	if st != nil {
		st.Allocated.Add(n)
		held := st.Held.Add(n - int64(cap(buf)))
		for peak := st.HeldPeak.Load(); held > peak && !st.HeldPeak.CompareAndSwap(peak, held); peak = st.HeldPeak.Load() {
		}
	}
	return nb
}

// release counts buf's memory as no longer held.
func (st *PullStats) release(buf []byte) {
	if st != nil {
		st.Held.Add(-int64(cap(buf)))
	}
}

// Collect pulls every batch announced on the mesh that st does not hold,
// from the device that announced it: the author the announcement's
// signature names (never the peer that forwarded it, nor another peer
// that holds the batch), over a stream authenticated as that device's, so
// that the batch is credited to the device that holds it and to no other.
// It checks the batch's hash and decodes it whole; stores it, credited to
// its author (OriginStore); and acks it. A batch already held is acked
// again (its announcer may have missed the ack). Announcements from a
// trainer are dropped: devices announce their own batches. It also serves
// st's batches to other trainers. It runs until ctx is done.
//
// Each device's work is bounded: AnnounceRate and AnnounceBurst of its
// announcements are taken, PullsPerPeer of its pulls run at once and
// PullQueue wait (more are dropped, to be announced again), the memory a
// pull takes grows as its bytes arrive, and all pulls together hold at
// most o.Budget bytes. A device that oversteps (floods announcements,
// announces batches it does not serve, serves bytes that do not match,
// stalls) collects strikes, and is disconnected at MaxStrikes.
func (m *Mesh) Collect(ctx context.Context, st Store, o PullOptions) error {
	if !m.isTrainer() {
		return fmt.Errorf("%w: only a trainer's certificate lets a peer pull batches", member.ErrNotAllowed)
	}
	maxSize := maxBatch(o.Limits)
	if err := CheckBudget(o.Budget, o.Limits); err != nil {
		return err
	}
	if o.Budget <= 0 {
		o.Budget = DefaultPullBudget
	}
	if o.Stats == nil {
		o.Stats = new(PullStats)
	}
	topic, acks, err := m.joinBatchTopics()
	if err != nil {
		return err
	}
	defer topic.Close()
	defer acks.Close()
	go func() { // an ack topic this peer only publishes to: drain it
		for {
			if _, err := acks.Next(ctx); err != nil {
				return
			}
		}
	}()
	m.servePull(st)
	pl := &puller{m: m, st: st, acks: acks, lim: o.Limits, maxSize: maxSize, stats: o.Stats,
		budget: semaphore.NewWeighted(o.Budget), peers: map[PeerID]*peerWork{}, busy: map[busyKey]bool{}}
	for {
		msg, err := topic.Next(ctx)
		if err != nil {
			return nil
		}
		pl.take(ctx, msg)
	}
}

func (m *Mesh) isTrainer() bool { return m.Cert().Role() == member.RoleTrainer }

// puller is Collect at work: the bounds of each peer, the budget.
type puller struct {
	m       *Mesh
	st      Store
	acks    Topic
	lim     batch.Limits
	maxSize int64
	stats   *PullStats
	budget  *semaphore.Weighted

	mu    sync.Mutex
	peers map[PeerID]*peerWork
	busy  map[busyKey]bool // the announcements being pulled or waiting
}

type busyKey struct {
	id     core.BatchID
	author PeerID
}

// peerWork is one device's share of a trainer's work.
type peerWork struct {
	ann     *rate.Limiter
	slots   chan struct{} // a token per pull running
	queued  int           // pulls running or waiting
	strikes float64
	struck  time.Time // when strikes was last brought up to date
}

// take acts on one announcement: drops it, or starts its pull.
func (pl *puller) take(ctx context.Context, msg Message) {
	m, stats := pl.m, pl.stats
	stats.Announcements.Add(1)
	author := msg.Author
	pe, ok := m.Peer(author)
	switch {
	case !ok:
		stats.Dropped.Add(1)
		m.log.Debug("an announcement from a peer not admitted dropped", "author", author, "from", msg.From)
		return
	case pe.Cert.Role() == member.RoleTrainer:
		stats.Dropped.Add(1)
		m.log.Debug("an announcement from a trainer dropped", "author", author)
		return
	}
	now := m.now()
	pl.mu.Lock()
	w := pl.peers[author]
	if w == nil {
		w = &peerWork{ann: rate.NewLimiter(AnnounceRate, AnnounceBurst), slots: make(chan struct{}, PullsPerPeer), struck: now}
		pl.peers[author] = w
	}
	allowed := w.ann.AllowN(now, 1)
	pl.mu.Unlock()
	if !allowed {
		stats.Dropped.Add(1)
		pl.strike(author, "announcements over its rate")
		return
	}
	man, err := ParseManifest(msg.Data)
	if err != nil {
		stats.Dropped.Add(1)
		pl.strike(author, "a malformed announcement")
		m.log.Debug("a malformed announcement", "author", author, "err", err)
		return
	}
	key := busyKey{man.ID, author}
	pl.mu.Lock()
	if pl.busy[key] {
		pl.mu.Unlock()
		return // a repeat of one being pulled
	}
	if w.queued >= PullsPerPeer+PullQueue {
		// No strike: a device with many batches waiting announces them
		// all, and announces again later those not acked.
		pl.mu.Unlock()
		stats.Dropped.Add(1)
		return
	}
	pl.busy[key] = true
	w.queued++
	pl.mu.Unlock()
	go func() {
		defer func() {
			pl.mu.Lock()
			delete(pl.busy, key)
			w.queued--
			pl.mu.Unlock()
		}()
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-w.slots }()
		err := pl.collect(ctx, man, author)
		if err != nil && ctx.Err() == nil {
			m.log.Warn("batch not collected; waiting for its next announcement", "batch", man.ID, "device", author, "err", err)
		}
	}()
}

// strike counts a strike against p, and disconnects it at MaxStrikes.
func (pl *puller) strike(p PeerID, why string) {
	now := pl.m.now()
	pl.mu.Lock()
	w := pl.peers[p]
	if w == nil {
		pl.mu.Unlock()
		return
	}
	w.strikes = max(0, w.strikes-float64(now.Sub(w.struck))/float64(StrikeDecay)) + 1
	w.struck = now
	out := w.strikes >= MaxStrikes
	if out {
		w.strikes = 0
	}
	pl.mu.Unlock()
	pl.stats.Strikes.Add(1)
	if !out {
		pl.m.log.Debug("a strike", "peer", p, "why", why)
		return
	}
	pl.stats.Disconnects.Add(1)
	pl.m.log.Warn("peer disconnected: too many strikes", "peer", p, "last", why)
	pl.m.host.Disconnect(p)
}

// collect pulls, verifies, stores and acks the batch man, announced by
// author. A failure that is the author's fault earns it a strike.
func (pl *puller) collect(ctx context.Context, man Manifest, author PeerID) error {
	m, stats := pl.m, pl.stats
	has, err := pl.st.Has(ctx, man.ID)
	if err != nil {
		return err
	}
	if !has {
		if man.Size > pl.maxSize {
			return fmt.Errorf("%w: announced %d bytes, limit %d", batch.ErrTooLarge, man.Size, pl.maxSize)
		}
		if !m.Admitted(author) {
			return fmt.Errorf("%w: %s, its author, is not admitted", ErrNoBatch, author)
		}
		if err := pl.budget.Acquire(ctx, man.Size); err != nil {
			return err
		}
		stats.Reserved.Add(man.Size)
		defer func() { pl.budget.Release(man.Size); stats.Reserved.Add(-man.Size) }()
		stats.Pulls.Add(1)
		payload, err := m.pullFrom(ctx, author, man, pl.maxSize, stats)
		if err != nil {
			stats.Failed.Add(1)
			if peerFault(err) {
				pl.strike(author, "a pull failed: "+err.Error())
			}
			return fmt.Errorf("from %s: %w", author, err)
		}
		defer stats.release(payload)
		b, err := batch.Verify(payload, man.ID, pl.lim)
		if err != nil {
			stats.Failed.Add(1)
			pl.strike(author, "a batch that does not verify")
			return err
		}
		if os, ok := pl.st.(OriginStore); ok {
			err = os.PutFrom(ctx, man.ID, author, payload, b)
		} else {
			err = pl.st.Put(ctx, man.ID, payload, b)
		}
		if err != nil {
			return err
		}
		m.log.Info("batch stored", "batch", man.ID, "device", author, "steps", len(b.Steps), "bytes", len(payload))
	}
	a, _ := json.Marshal(m.newAck(man.ID))
	return pl.acks.Publish(ctx, a)
}

// peerFault reports a failed pull that is its peer's doing: it announced
// a batch it does not serve, or served one that does not match, or
// stalled.
func peerFault(err error) bool {
	return errors.Is(err, ErrNoBatch) || errors.Is(err, ErrMessage) || errors.Is(err, batch.ErrHashMismatch) || errors.Is(err, ErrStalled)
}
