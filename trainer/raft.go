package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/raftnet"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/raftfsm"
	"github.com/clawmesh/clawmesh/trainer/raftstore"
)

// RaftDir holds the raft log, stable store and snapshots in a trainer's
// data directory.
const RaftDir = "raft"

// Timing tunes the group's raft and rounds. The zero value of each field
// means its default, chosen for a WAN-ish mesh of volunteers: a leader is
// suspected after a second of silence, and replaced within about three.
type Timing struct {
	// Heartbeat and Election are raft's HeartbeatTimeout and
	// ElectionTimeout (default 1 s each); LeaderLease raft's
	// LeaderLeaseTimeout (default half of Heartbeat).
	Heartbeat, Election, LeaderLease time.Duration
	// JoinWait is how long a new trainer looks for a group to join before
	// it bootstraps one of its own (default 5 s).
	JoinWait time.Duration
	// Tick is how often the leader looks at the group's work (default
	// 250 ms).
	Tick time.Duration
	// ReplaceAfter is how long a voter may fail heartbeats before the
	// leader replaces it with a live non-voter (default 30 s).
	ReplaceAfter time.Duration
	// SnapshotThreshold and SnapshotInterval are raft's: logs between
	// snapshots (default 1024), and how often raft looks (default 2 min).
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// VerifyRetry is how long a batch whose verification could not run
	// (its plugins out of reach) waits for the next try (default 30 s).
	VerifyRetry time.Duration
	// MaxVoters bounds the group's raft voters (default group.MaxVoters);
	// further trainers the mesh's admin trusts are non-voters, standing
	// by. Volunteers (trainers the admin did not trust) are always
	// non-voters.
	MaxVoters int
	// CertifyWait is how long the newest version may wait for a quorum of
	// the mesh's voters to certify it before the leader retracts it
	// (default 2 min).
	CertifyWait time.Duration
}

// WithDefaults fills in the zero fields with their defaults.
func (o Timing) WithDefaults() Timing {
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	if o.Election == 0 {
		o.Election = time.Second
	}
	if o.LeaderLease == 0 {
		o.LeaderLease = o.Heartbeat / 2
	}
	if o.JoinWait == 0 {
		o.JoinWait = 5 * time.Second
	}
	if o.Tick == 0 {
		o.Tick = 250 * time.Millisecond
	}
	if o.ReplaceAfter == 0 {
		o.ReplaceAfter = 30 * time.Second
	}
	if o.SnapshotThreshold == 0 {
		o.SnapshotThreshold = 1024
	}
	if o.SnapshotInterval == 0 {
		o.SnapshotInterval = 2 * time.Minute
	}
	if o.CertifyWait == 0 {
		o.CertifyWait = 2 * time.Minute
	}
	if o.VerifyRetry == 0 {
		o.VerifyRetry = 30 * time.Second
	}
	if o.MaxVoters == 0 {
		o.MaxVoters = group.MaxVoters
	}
	return o
}

// raftMember is this trainer's member of the raft group.
type raftMember struct {
	t      *Trainer
	log    *slog.Logger
	timing Timing
	fsm    *raftfsm.FSM
	raft   *raft.Raft
	logs   *raftstore.Store
	layer  *raftnet.Layer
	trans  *raft.NetworkTransport
	obs    *raft.Observer
	obsCh  chan raft.Observation

	mu          sync.Mutex
	failing     map[mesh.PeerID]time.Time // voters failing heartbeats, since
	leaderSince time.Time
	deltas      map[mesh.PeerID]*submission // the open round's, on the leader
	deltaRound  uint64
	wake        chan struct{}
}

// submission is one trainer's delta for a round, held by the leader.
type submission struct {
	round, base uint64
	samples     int
	seconds     float64
	batches     []string
	refused     []group.Refusal
	delta       []byte
	// signed is the delta as its trainer signed it, for the voters.
	signed signedDelta
}

// isTrainerPeer reports a peer this trainer may run the group with: one
// admitted with a trainer certificate of this mesh, now or before (a
// trainer whose connection dropped is dialled again, and the mesh admits
// it anew), and not blocked since.
func (t *Trainer) isTrainerPeer(p mesh.PeerID) bool {
	if p == t.self {
		return true
	}
	if t.isolated.Load() || t.mesh.Blocked(p) {
		return false
	}
	if until, ok := t.cutOff.Load(p); ok {
		if time.Now().Before(until.(time.Time)) {
			return false
		}
		t.cutOff.Delete(p)
	}
	if pr, ok := t.mesh.Peer(p); ok {
		if pr.Cert == nil || pr.Cert.Role() != member.RoleTrainer {
			return false
		}
		t.known.Store(p, &knownTrainer{addrs: pr.Addrs})
		return true
	}
	v, ok := t.known.Load(p)
	if ok {
		t.redial(p, v.(*knownTrainer))
	}
	return ok
}

// knownTrainer is a trainer admitted once.
type knownTrainer struct {
	addrs []string
	last  atomic.Int64 // unix nanoseconds of the last redial
}

// redial connects again to a known trainer that is not connected, at most
// once a second, so that the mesh admits it and the streams raft and the
// rounds open to it go through (the host opens them only to admitted
// peers).
func (t *Trainer) redial(p mesh.PeerID, k *knownTrainer) {
	now := time.Now().UnixNano()
	last := k.last.Load()
	if now-last < int64(time.Second) || !k.last.CompareAndSwap(last, now) || len(k.addrs) == 0 {
		return
	}
	go func() {
		dctx, dcancel := t.detached()
		defer dcancel()
		ctx, cancel := context.WithTimeout(dctx, 10*time.Second)
		defer cancel()
		if _, err := t.host.Connect(ctx, k.addrs); err != nil {
			t.log.Debug("cannot reach a trainer", "trainer", p, "err", err)
		}
	}()
}

func openRaftMember(t *Trainer, timing Timing) (*raftMember, error) {
	timing = timing.WithDefaults()
	dir := filepath.Join(t.cfg.DataDir, RaftDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logs, err := raftstore.Open(filepath.Join(dir, "log"), raftstore.Options{})
	if err != nil {
		return nil, err
	}
	hl := raftnet.HCLog(t.log.With("component", "raft"))
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(dir, "snapshots"), 2, hl)
	if err != nil {
		logs.Close()
		return nil, err
	}
	n := &raftMember{t: t, log: t.log, timing: timing, fsm: raftfsm.New(), logs: logs,
		failing: map[mesh.PeerID]time.Time{}, wake: make(chan struct{}, 1)}
	n.layer = raftnet.New(t.host, t.isTrainerPeer)
	n.trans = raftnet.NewTransport(n.layer, raftnet.TransportOptions{Logger: t.log})

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(t.self)
	conf.HeartbeatTimeout = timing.Heartbeat
	conf.ElectionTimeout = timing.Election
	conf.LeaderLeaseTimeout = timing.LeaderLease
	conf.CommitTimeout = 20 * time.Millisecond
	conf.SnapshotThreshold = timing.SnapshotThreshold
	conf.SnapshotInterval = timing.SnapshotInterval
	conf.TrailingLogs = max(timing.SnapshotThreshold, 64)
	conf.Logger = hl
	n.raft, err = raft.NewRaft(conf, n.fsm, logs, logs, snaps, n.trans)
	if err != nil {
		n.layer.Close()
		logs.Close()
		return nil, fmt.Errorf("trainer: raft: %w", err)
	}
	n.obsCh = make(chan raft.Observation, 64)
	n.obs = raft.NewObserver(n.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.LeaderObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(n.obs)
	n.fsm.Watch(func(group.Applied) { n.poke() })
	return n, nil
}

func (n *raftMember) poke() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *raftMember) close() error {
	n.raft.DeregisterObserver(n.obs)
	err := n.raft.Shutdown().Error()
	n.trans.Close()
	n.layer.Close()
	return errors.Join(err, n.logs.Close())
}

// inGroup reports whether this trainer is in a raft configuration.
func (n *raftMember) inGroup() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	return len(f.Configuration().Servers) > 0
}

func (n *raftMember) isLeader() bool { return n.raft.State() == raft.Leader }

func (n *raftMember) leader() mesh.PeerID {
	_, id := n.raft.LeaderWithID()
	return mesh.PeerID(id)
}

// view reads the replicated state.
func (n *raftMember) view(fn func(*group.State)) { n.fsm.View(fn) }

// propose applies e through raft (on the leader) and returns the state
// machine's verdict on it.
func (n *raftMember) propose(ctx context.Context, e *group.Entry) error {
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	b, err := e.Encode()
	if err != nil {
		return err
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	f := n.raft.Apply(b, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return &rpcError{Code: codeNotLeader, Msg: err.Error(), Leader: n.leader()}
		}
		return err
	}
	if err, ok := f.Response().(error); ok && err != nil {
		return err
	}
	return nil
}

// configuration returns the raft servers.
func (n *raftMember) configuration() ([]raft.Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Configuration().Servers, nil
}

// addServer adds trainer p to the group: a voter while there are fewer
// than MaxVoters and the mesh's admin trusts it (its voter set names it),
// else a non-voter. A volunteer never votes.
func (n *raftMember) addServer(p mesh.PeerID) error {
	if !n.t.isTrainerPeer(p) {
		return errors.New("trainer: only the mesh's trainers join the group")
	}
	servers, err := n.configuration()
	if err != nil {
		return err
	}
	voters := 0
	for _, s := range servers {
		if s.ID == raft.ServerID(p) {
			return nil
		}
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	vote := voters < n.timing.MaxVoters && n.t.mayVote(p)
	if vote {
		err = n.raft.AddVoter(raft.ServerID(p), raft.ServerAddress(p), 0, 10*time.Second).Error()
	} else {
		err = n.raft.AddNonvoter(raft.ServerID(p), raft.ServerAddress(p), 0, 10*time.Second).Error()
	}
	if err == nil {
		n.log.Info("trainer joined the group", "trainer", p, "voter", vote, "trusted", n.t.mayVote(p))
	}
	return err
}

// removeServer takes p out of the group and the registry.
func (n *raftMember) removeServer(ctx context.Context, p mesh.PeerID) error {
	if p == n.t.self {
		return errors.New("trainer: the leader hands over before it leaves")
	}
	var known bool
	n.view(func(s *group.State) { _, known = s.Trainers[p] })
	if known {
		if err := n.propose(ctx, &group.Entry{Leave: p}); err != nil {
			return err
		}
	}
	if err := n.raft.RemoveServer(raft.ServerID(p), 0, 10*time.Second).Error(); err != nil {
		return err
	}
	n.log.Info("trainer left the group", "trainer", p)
	n.promote()
	return nil
}

// join makes a fresh trainer part of a group: it asks the trainers it
// can reach to add it, and bootstraps a group of its own when none is in
// one after JoinWait. Two fresh trainers that find each other agree that
// the one with the smaller id bootstraps.
func (n *raftMember) join(ctx context.Context) error {
	deadline := time.Now().Add(n.timing.JoinWait)
	for {
		if n.inGroup() {
			return nil
		}
		wait := false // a group exists, or a smaller fresh trainer will make one
		for _, p := range n.trainerPeers() {
			_, err := n.t.call(ctx, p, request{Op: opJoin, Fresh: true}, nil)
			n.log.Debug("asked to join the group", "trainer", p, "err", err)
			if err == nil {
				n.log.Info("joined the trainers' group", "via", p)
				return n.waitInGroup(ctx)
			}
			switch codeOf(err) {
			case codeNotLeader:
				wait = true
				var re *rpcError
				if errors.As(err, &re) && re.Leader != "" && re.Leader != n.t.self {
					if _, err := n.t.call(ctx, re.Leader, request{Op: opJoin, Fresh: true}, nil); err == nil {
						n.log.Info("joined the trainers' group", "via", re.Leader)
						return n.waitInGroup(ctx)
					}
				}
			case codeNoGroup:
				// The smaller trusted trainer starts the group; a
				// volunteer never does.
				if p < n.t.self && n.t.mayVote(p) {
					wait = true
				}
			}
		}
		if time.Now().After(deadline) && !wait {
			if n.t.mayVote(n.t.self) {
				return n.bootstrap()
			}
			// A volunteer never starts a group: it would vote in it.
			n.t.warnVolunteerWaits()
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

func (n *raftMember) waitInGroup(ctx context.Context) error {
	for range 400 {
		if n.inGroup() {
			return nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return errors.New("trainer: added to the group, but no configuration reached this trainer")
}

func (n *raftMember) bootstrap() error {
	n.log.Info("no trainers' group found: bootstrapping one")
	f := n.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter, ID: raft.ServerID(n.t.self), Address: raft.ServerAddress(n.t.self)}}})
	if err := f.Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return err
	}
	return nil
}

// trainerPeers lists the admitted trainers connected now, sorted.
func (n *raftMember) trainerPeers() []mesh.PeerID {
	var out []mesh.PeerID
	for _, p := range n.t.mesh.Peers() {
		if p.ID != n.t.self && n.t.isTrainerPeer(p.ID) {
			out = append(out, p.ID)
		}
	}
	slices.Sort(out)
	return out
}

// watchObservations keeps the failing voters and the leader's start.
func (n *raftMember) watchObservations(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-n.obsCh:
			n.mu.Lock()
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				p := mesh.PeerID(d.PeerID)
				if _, ok := n.failing[p]; !ok {
					n.failing[p] = time.Now()
				}
			case raft.ResumedHeartbeatObservation:
				delete(n.failing, mesh.PeerID(d.PeerID))
			case raft.LeaderObservation:
				if mesh.PeerID(d.LeaderID) == n.t.self {
					n.leaderSince = time.Now()
					n.failing = map[mesh.PeerID]time.Time{}
				}
			}
			n.mu.Unlock()
			n.poke()
		}
	}
}

// live lists the group's trainers the leader hears from now: itself and
// the servers not failing heartbeats.
func (n *raftMember) live() []mesh.PeerID {
	servers, err := n.configuration()
	if err != nil {
		return []mesh.PeerID{n.t.self}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []mesh.PeerID
	for _, s := range servers {
		p := mesh.PeerID(s.ID)
		if _, bad := n.failing[p]; bad && p != n.t.self {
			continue
		}
		out = append(out, p)
	}
	return out
}

// promote keeps the group's voters at MaxVoters while trusted non-voters
// are there: a voter failing heartbeats for ReplaceAfter is replaced by a
// live trusted non-voter, and a free voter seat goes to one. A voter the
// mesh's admin no longer trusts is demoted (the leader hands over first if
// that is itself).
func (n *raftMember) promote() {
	if !n.isLeader() {
		return
	}
	servers, err := n.configuration()
	if err != nil {
		return
	}
	n.mu.Lock()
	failing := make(map[mesh.PeerID]time.Time, len(n.failing))
	for k, v := range n.failing {
		failing[k] = v
	}
	n.mu.Unlock()
	var voters int
	var standby []raft.Server
	var dead []raft.Server
	for _, s := range servers {
		p := mesh.PeerID(s.ID)
		since, bad := failing[p]
		switch {
		case s.Suffrage == raft.Voter && !n.t.mayVote(p):
			if n.t.mesh.Voters() == nil {
				voters++ // no word from the admin yet: nothing to demote on
				continue
			}
			if p == n.t.self {
				n.log.Warn("this trainer is no longer trusted by the mesh's admin: handing the lead over")
				n.raft.LeadershipTransfer()
				return
			}
			if err := n.raft.DemoteVoter(s.ID, 0, 10*time.Second).Error(); err != nil {
				return
			}
			n.log.Warn("voter demoted: the mesh's admin no longer trusts it", "trainer", p)
		case s.Suffrage == raft.Voter:
			voters++
			if bad && time.Since(since) > n.timing.ReplaceAfter {
				dead = append(dead, s)
			}
		case s.Suffrage == raft.Nonvoter && !bad && n.t.mayVote(p):
			standby = append(standby, s)
		}
	}
	for _, s := range standby {
		if voters >= n.timing.MaxVoters {
			if len(dead) == 0 {
				break
			}
			d := dead[0]
			dead = dead[1:]
			if err := n.raft.RemoveServer(d.ID, 0, 10*time.Second).Error(); err != nil {
				return
			}
			voters--
			n.log.Warn("voter replaced: it stopped answering", "voter", d.ID, "by", s.ID)
		}
		if err := n.raft.AddVoter(s.ID, s.Address, 0, 10*time.Second).Error(); err != nil {
			return
		}
		voters++
		n.log.Info("non-voter promoted", "trainer", s.ID)
	}
}
