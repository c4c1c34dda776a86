package trainer

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Protocol is the trainers' own protocol: joining the group, registering,
// handing deltas to the leader, and fetching adapter versions and batches
// from one another. Only trainers of the mesh may open it.
const Protocol = "/clawmesh/trainer/1"

// RPC operations.
const (
	opJoin      = "join"      // add the caller to the raft group
	opRegister  = "register"  // record the caller in the registry
	opDelta     = "delta"     // the caller's delta for a round (payload)
	opBundle    = "bundle"    // an adapter version's bundle (payload back)
	opBatch     = "batch"     // a batch's bytes (payload back)
	opLeave     = "leave"     // remove the caller from the group
	opConfigure = "configure" // change the group's configuration
	opHold      = "hold"      // keep a bundle about to be committed (payload)
	opTasks     = "tasks"     // add a task set (payload: group.TaskSet; its files fetched from the caller)
	opTaskFile  = "task_file" // a task set's file or plugin, by hash (payload back)
	opOffer     = "offer"     // a batch the caller stored that the ledger lacks (the leader pulls it)
	// opSubmissions: the signed deltas of a version the callee published
	// (payload back); opVote: a voter's vote for, or refusal of, the
	// newest version (to the leader).
	opSubmissions = "submissions"
	opVote        = "vote"
	// opClear: lift a trainer's bench (a voter's, to the leader).
	opClear = "clear"
)

// Error codes of a reply.
const (
	codeNotLeader = "not_leader" // ask Leader instead
	codeNoGroup   = "no_group"   // the callee is in no group yet
	codeRefused   = "refused"
	codeNotFound  = "not_found"
)

// Limits of the protocol.
const (
	maxRequest = 64 << 10
	maxPayload = 256 << 20
	rpcTimeout = 2 * time.Minute
	// openTimeout bounds opening a stream: a trainer cut off answers no
	// sooner.
	openTimeout = 5 * time.Second
)

// request is the first line of a stream.
type request struct {
	Op      string          `json:"op"`
	Version uint64          `json:"version,omitempty"`
	Hash    string          `json:"hash,omitempty"`
	Batch   core.BatchID    `json:"batch,omitempty"`
	Round   uint64          `json:"round,omitempty"`
	Base    uint64          `json:"base,omitempty"`
	Samples int             `json:"samples,omitempty"`
	Seconds float64         `json:"seconds,omitempty"`
	Batches []core.BatchID  `json:"batches,omitempty"`
	Refused []group.Refusal `json:"refused,omitempty"`
	Trainer *group.Trainer  `json:"trainer,omitempty"`
	Config  *group.Config   `json:"config,omitempty"`
	// From is the device that announced Batch (offer).
	From mesh.PeerID `json:"from,omitempty"`
	// Fresh says the caller is in no group yet (join).
	Fresh bool `json:"fresh,omitempty"`
	// Sig is the caller's signature over its delta (delta: deltaClaim)
	// or its vote over the version's claim (vote).
	Sig []byte `json:"sig,omitempty"`
	// VoterSet is the SHA-256 of the voter set a vote was made under;
	// Refuse, why a voter refuses the version instead.
	VoterSet []byte `json:"voter_set,omitempty"`
	Refuse   string `json:"refuse,omitempty"`
	// Index is the log index that committed the version voted on (vote).
	Index uint64 `json:"index,omitempty"`
	// Size is the length of the payload that follows the line.
	Size int64 `json:"size,omitempty"`
}

// reply answers a request.
type reply struct {
	OK     bool        `json:"ok"`
	Code   string      `json:"code,omitempty"`
	Err    string      `json:"err,omitempty"`
	Leader mesh.PeerID `json:"leader,omitempty"`
	Size   int64       `json:"size,omitempty"`
}

// rpcError is a refusal from a peer.
type rpcError struct {
	Code, Msg string
	Leader    mesh.PeerID
}

func (e *rpcError) Error() string {
	if e.Msg == "" {
		return "trainer: refused: " + e.Code
	}
	return e.Msg
}

func codeOf(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return re.Code
	}
	return ""
}

func writeFrame(w io.Writer, v any, payload []byte) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	if len(payload) > 0 {
		_, err = w.Write(payload)
	}
	return err
}

// readFrame reads a frame's JSON: its length (at most maxRequest), then
// the bytes, taken as they arrive.
func readFrame(r io.Reader, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxRequest {
		return fmt.Errorf("trainer: frame of %d bytes (at most %d)", size, maxRequest)
	}
	b, err := readSized(r, int64(size), nil)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// readPayload reads a payload of size bytes (at most maxPayload), its
// memory counted in alloc (if not nil).
func readPayload(r io.Reader, size int64, alloc *atomic.Int64) ([]byte, error) {
	if size < 0 || size > maxPayload {
		return nil, fmt.Errorf("trainer: payload of %d bytes (0 to %d)", size, maxPayload)
	}
	return readSized(r, size, alloc)
}

// firstRead is the buffer a read of a frame or payload starts in; it
// doubles as the bytes arrive.
const firstRead = 64 << 10

// readSized reads exactly size bytes, taking memory as they arrive (never
// more than size, whatever size says), and counts it in alloc. Fewer bytes
// than size fail with io.ErrUnexpectedEOF.
func readSized(r io.Reader, size int64, alloc *atomic.Int64) ([]byte, error) {
	grow := func(b []byte, n int64) []byte {
		nb := make([]byte, len(b), n)
		copy(nb, b)
		if alloc != nil {
			alloc.Add(n)
		}
		return nb
	}
	b := grow(nil, min(size, firstRead))
	for int64(len(b)) < size {
		if len(b) == cap(b) {
			b = grow(b, min(2*int64(cap(b)), size))
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil && int64(len(b)) < size {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return b, nil
}

// call sends req (with payload) to p and returns the reply's payload.
func (t *Trainer) call(ctx context.Context, p mesh.PeerID, req request, payload []byte) ([]byte, error) {
	if !t.isTrainerPeer(p) {
		return nil, fmt.Errorf("trainer: %s is not a trainer of this mesh", p)
	}
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	octx, ocancel := context.WithTimeout(ctx, openTimeout)
	s, err := t.host.NewStream(octx, p, Protocol)
	ocancel()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	req.Size = int64(len(payload))
	bw := bufio.NewWriter(s)
	if err := writeFrame(bw, req, payload); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	s.CloseWrite()
	br := bufio.NewReader(s)
	var rep reply
	if err := readFrame(br, &rep); err != nil {
		return nil, fmt.Errorf("trainer: %s from %s: %w", req.Op, p, err)
	}
	if !rep.OK {
		return nil, &rpcError{Code: rep.Code, Msg: rep.Err, Leader: rep.Leader}
	}
	return readPayload(br, rep.Size, &t.rpc.allocated)
}

// serveRPC serves one stream of Protocol: at most rpcPerPeer of one peer
// at a time.
func (t *Trainer) serveRPC(s mesh.Stream) {
	defer s.Close()
	from := s.RemotePeer()
	if !t.isTrainerPeer(from) {
		s.Reset()
		return
	}
	release, ok := t.rpc.enter(t.stopped, from)
	if !ok {
		s.Reset()
		if t.rpc.strike(from) {
			t.log.Warn("trainer disconnected: too many streams at once, too often", "trainer", from)
			t.host.Disconnect(from)
		}
		return
	}
	defer release()
	s.SetDeadline(time.Now().Add(rpcTimeout))
	br := bufio.NewReader(s)
	var req request
	if err := readFrame(br, &req); err != nil {
		s.Reset()
		return
	}
	var payload []byte
	if req.Size > 0 {
		var err error
		if payload, err = readPayload(br, req.Size, &t.rpc.allocated); err != nil {
			s.Reset()
			return
		}
	}
	ctx, cancel := t.detached()
	out, err := t.handle(ctx, from, req, payload)
	cancel()
	rep := reply{OK: err == nil, Size: int64(len(out))}
	if err != nil {
		var re *rpcError
		if errors.As(err, &re) {
			rep.Code, rep.Leader = re.Code, re.Leader
		} else {
			rep.Code = codeRefused
		}
		rep.Err = err.Error()
		out = nil
		rep.Size = 0
	}
	bw := bufio.NewWriter(s)
	if writeFrame(bw, rep, out) == nil {
		bw.Flush()
	}
}

// handle answers one request from trainer from.
func (t *Trainer) handle(ctx context.Context, from mesh.PeerID, req request, payload []byte) ([]byte, error) {
	switch req.Op {
	case opBundle:
		return t.bundleBytes(req.Version)
	case opBatch:
		return t.store.Payload(ctx, req.Batch)
	case opHold:
		return nil, t.hold(req.Hash, payload)
	case opTaskFile:
		return t.serveTaskFile(req.Hash)
	case opSubmissions:
		return t.submissions(req.Round, req.Hash)
	}
	g := t.group
	if g == nil || !g.inGroup() {
		return nil, &rpcError{Code: codeNoGroup, Msg: "not in a group yet"}
	}
	if !g.isLeader() {
		return nil, &rpcError{Code: codeNotLeader, Msg: "not the leader", Leader: g.leader()}
	}
	switch req.Op {
	case opJoin:
		return nil, g.addServer(from)
	case opOffer:
		return nil, t.takeOffer(ctx, from, req.Batch, req.From)
	case opRegister:
		if req.Trainer == nil || req.Trainer.ID != from {
			return nil, errors.New("trainer: a trainer registers only itself")
		}
		return nil, g.propose(ctx, &group.Entry{Register: req.Trainer})
	case opLeave:
		return nil, g.removeServer(ctx, from)
	case opConfigure:
		if req.Config == nil {
			return nil, errors.New("trainer: no configuration")
		}
		return nil, g.propose(ctx, &group.Entry{Configure: req.Config})
	case opDelta:
		return nil, g.takeDelta(ctx, from, req, payload)
	case opVote:
		return nil, g.takeVote(ctx, from, req)
	case opClear:
		return nil, t.takeClear(ctx, from, req)
	case opTasks:
		return t.addTasks(ctx, from, payload)
	}
	return nil, fmt.Errorf("trainer: unknown operation %q", req.Op)
}

// Bounds of the streams one trainer opens to another.
const (
	// rpcPerPeer is how many streams of one peer are served at once; one
	// more waits up to rpcWait for a turn, and is reset if none comes.
	rpcPerPeer = 4
	rpcWait    = 5 * time.Second
	// rpcMaxStrikes streams reset within rpcStrikeDecay each of the last
	// disconnect the peer.
	rpcMaxStrikes  = 8
	rpcStrikeDecay = 10 * time.Second
)

// rpcBounds holds what each peer's streams take: the turns they hold, the
// streams refused, the memory of their payloads. The zero value is ready.
type rpcBounds struct {
	mu    sync.Mutex
	peers map[mesh.PeerID]*rpcPeer

	// refused counts the streams reset for want of a turn, disconnects the
	// peers disconnected for it, allocated the bytes taken for payloads
	// (both ways).
	refused, disconnects, allocated atomic.Int64
}

type rpcPeer struct {
	turns   chan struct{}
	strikes int
	struck  time.Time
}

// enter waits for one of p's turns, up to rpcWait, or until stop closes.
func (b *rpcBounds) enter(stop <-chan struct{}, p mesh.PeerID) (release func(), ok bool) {
	b.mu.Lock()
	if b.peers == nil {
		b.peers = map[mesh.PeerID]*rpcPeer{}
	}
	rp := b.peers[p]
	if rp == nil {
		rp = &rpcPeer{turns: make(chan struct{}, rpcPerPeer)}
		b.peers[p] = rp
	}
	b.mu.Unlock()
	tm := time.NewTimer(rpcWait)
	defer tm.Stop()
	select {
	case rp.turns <- struct{}{}:
		return func() { <-rp.turns }, true
	case <-tm.C:
	case <-stop:
	}
	b.refused.Add(1)
	return nil, false
}

// strike counts a refused stream of p, and reports whether p has had too
// many of them.
func (b *rpcBounds) strike(p mesh.PeerID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	rp := b.peers[p]
	now := time.Now()
	if now.Sub(rp.struck) > rpcStrikeDecay {
		rp.strikes = 0
	}
	rp.strikes++
	rp.struck = now
	if rp.strikes < rpcMaxStrikes {
		return false
	}
	rp.strikes = 0
	b.disconnects.Add(1)
	return true
}

// toLeader sends req to the group's leader, following redirections.
func (t *Trainer) toLeader(ctx context.Context, req request, payload []byte) ([]byte, error) {
	var lastErr error
	for range 5 {
		l := t.group.leader()
		if l == "" {
			lastErr = errors.New("trainer: the group has no leader now")
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		}
		if l == t.self {
			return t.handle(ctx, t.self, req, payload)
		}
		out, err := t.call(ctx, l, req, payload)
		if err == nil {
			return out, nil
		}
		lastErr = err
		if codeOf(err) != codeNotLeader && codeOf(err) != "" {
			return nil, err
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	return nil, lastErr
}

func sleep(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}
