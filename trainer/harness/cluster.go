package harness

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/internal/synthetic"
)

// Cluster is a mesh made for a purpose: one device that ships batches and
// n trainer peers in a raft group, each in its own data directory, which
// can be killed, isolated and restarted. Its peers are on the network
// ClusterOptions.Net makes: libp2p hosts on loopback, or a simulated
// network in memory (mesh/memnet) with seeded latencies, where a crash is
// the host vanishing at once. Tests and `clawmesh bench trainers` use it.
type Cluster struct {
	Dir      string
	opts     ClusterOptions
	net      hosts
	out      *benchOutbox
	node     *clusterPeer
	cancel   context.CancelFunc // stops the device and every trainer
	wg       sync.WaitGroup
	trainers []*clusterTrainer
}

type clusterTrainer struct {
	dir    string
	key    ed25519.PrivateKey
	t      *trainer.Trainer
	peer   *clusterPeer // the trainer's host when the network made it
	cancel context.CancelFunc
	done   chan struct{}
}

// clusterPeer is a host with its mesh, started and run by the cluster.
type clusterPeer struct {
	mesh   *mesh.Mesh
	host   mesh.Host
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// stop stops the peer's run and closes its host.
func (p *clusterPeer) stop() {
	p.cancel()
	p.wg.Wait()
	p.host.Close()
}

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	// Trainers is how many trainers to make (default 3).
	Trainers int
	// Timing and Group configure every trainer.
	Timing trainer.Timing
	Group  group.Config
	// Dir is where the data directories go (default a new temporary one,
	// removed by Close).
	Dir    string
	Logger *slog.Logger
	// Verify checks batches (see trainer.Config.Verify); nil checks
	// nothing, as the batches made up here carry no real plugin to replay.
	Verify func(ctx context.Context, id core.BatchID, from mesh.PeerID) (string, error)
	// Net is the network the peers are on: Loopback (the default, nil)
	// or Memory.
	Net Net
	// Volunteers are the trainers (by index) the mesh's admin does not
	// trust: they train but never vote or certify. The others are voters.
	Volunteers []int
	// Personal configures every trainer's training of personal adapters
	// (off by default).
	Personal trainer.PersonalConfig
}

// Net is a network a Cluster's peers are on: Loopback or Memory.
type Net interface {
	open(log *slog.Logger) hosts
}

// hosts makes the cluster's peers on one kind of host.
type hosts interface {
	// identity makes the identity of the device's peer in dir: its key
	// and id.
	identity(dir string) (ed25519.PrivateKey, mesh.PeerID, error)
	// startNode starts the device's peer, run until ctx is done.
	startNode(ctx context.Context, dir string, key ed25519.PrivateKey) (*clusterPeer, error)
	// join makes the identity of trainer i's peer in dir and redeems
	// token for it; it returns the peer's key.
	join(ctx context.Context, i int, dir, token string) (ed25519.PrivateKey, error)
	// startTrainer makes trainer i of c on its data directory, with cfg
	// filled in but for the network's fields; its peer is nil if the
	// trainer runs its own.
	startTrainer(ctx context.Context, c *Cluster, i int, cfg trainer.Config) (*trainer.Trainer, *clusterPeer, error)
	// crash cuts a trainer's host off at once, before the trainer's own
	// Crash (a no-op where Crash closes the host).
	crash(t *trainer.Trainer) error
	// isolate cuts trainer i off (on) or heals it.
	isolate(c *Cluster, i int, on bool)
	// name is the mesh's name, prefix the temporary directory's.
	name() (mesh, prefix string)
	// waitPrefix starts WaitUntil's errors.
	waitPrefix() string
	close()
}

// NewCluster makes the mesh, joins the trainers and starts them all.
func NewCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	if o.Trainers == 0 {
		o.Trainers = 3
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Net == nil {
		o.Net = Loopback{}
	}
	net := o.Net.open(o.Logger)
	meshName, prefix := net.name()
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", prefix); err != nil {
			net.close()
			return nil, err
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &Cluster{Dir: dir, opts: o, net: net, out: newBenchOutbox(), cancel: cancel}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	nodeDir := filepath.Join(dir, "node")
	key, id, err := net.identity(nodeDir)
	if err != nil {
		return nil, err
	}
	if _, err := mesh.Init(nodeDir, meshName, key, id, time.Now(), rand.Reader); err != nil {
		return nil, err
	}
	if c.node, err = net.startNode(runCtx, nodeDir, key); err != nil {
		return nil, err
	}
	c.goRun(func() {
		c.node.mesh.Ship(runCtx, c.out, mesh.ShipOptions{Poll: 20 * time.Millisecond, Retry: ShipRetry, MaxRetry: 5 * ShipRetry})
	})
	for i := range o.Trainers {
		// The admin trusts every trainer but the volunteers: redeeming a
		// voter token has the device sign the next voter set.
		voter := mesh.MakeVoter
		if slices.Contains(o.Volunteers, i) {
			voter = mesh.MakeVolunteer
		}
		tok, err := mesh.InviteWith(nodeDir, key, mesh.InviteOptions{Role: member.RoleTrainer, TTL: time.Hour, Uses: 1, Addrs: c.node.host.Addrs(), Voter: voter},
			time.Now(), rand.Reader)
		if err != nil {
			return nil, err
		}
		td := filepath.Join(dir, "trainer"+strconv.Itoa(i))
		jctx, jcancel := context.WithTimeout(ctx, benchWait)
		tkey, err := net.join(jctx, i, td, tok.String())
		jcancel()
		if err != nil {
			return nil, err
		}
		c.trainers = append(c.trainers, &clusterTrainer{dir: td, key: tkey})
	}
	for i := range c.trainers {
		if err := c.Start(ctx, i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) goRun(fn func()) {
	c.wg.Add(1)
	go func() { defer c.wg.Done(); fn() }()
}

// Len is the number of trainers.
func (c *Cluster) Len() int { return len(c.trainers) }

// Trainer is trainer i, nil while it is down.
func (c *Cluster) Trainer(i int) *trainer.Trainer { return c.trainers[i].t }

// Device is the mesh's device (the admin's, a member): its host and its
// membership.
func (c *Cluster) Device() (mesh.Host, *mesh.Mesh) { return c.node.host, c.node.mesh }

// Voters is the voter set in force on the mesh's device (the admin's).
func (c *Cluster) Voters() *member.VoterSet { return c.node.mesh.Voters() }

// DataDir is trainer i's data directory.
func (c *Cluster) DataDir(i int) string { return c.trainers[i].dir }

// Start starts trainer i (again) from its data directory.
func (c *Cluster) Start(ctx context.Context, i int) error {
	ct := c.trainers[i]
	if ct.t != nil {
		return fmt.Errorf("trainer %d is running", i)
	}
	cfg := trainer.Config{DataDir: ct.dir, Timing: c.opts.Timing, Group: c.opts.Group,
		Verify: c.opts.Verify, NoVerify: c.opts.Verify == nil, Personal: c.opts.Personal, Logger: c.opts.Logger.With("trainer", i)}
	t, p, err := c.net.startTrainer(ctx, c, i, cfg)
	if err != nil {
		return err
	}
	// A trainer runs until Kill or Close cancel it.
	rctx, cancel := context.WithCancel(context.Background())
	ct.t, ct.peer, ct.cancel, ct.done = t, p, cancel, make(chan struct{})
	done := ct.done
	c.goRun(func() { defer close(done); t.Run(rctx) })
	return nil
}

// Kill stops trainer i at once, as a crash (kill -9) would: its host
// vanishes from the network or its connections drop, and its raft stops
// with no hand-over; then its process state is dropped. Its data
// directory stays.
func (c *Cluster) Kill(i int) error {
	ct := c.trainers[i]
	if ct.t == nil {
		return nil
	}
	t := ct.t
	ct.t = nil
	err := c.net.crash(t)
	// Raft's goroutines end before the stores close under them (raft
	// panics on a log it cannot read).
	err = errors.Join(err, t.Crash())
	ct.cancel()
	<-ct.done
	ct.stopPeer()
	return errors.Join(err, t.Close())
}

func (ct *clusterTrainer) stopPeer() {
	if ct.peer != nil {
		ct.peer.stop()
	}
}

// Isolate cuts trainer i off the other trainers or, with on false, heals
// it (on loopback, its raft and trainer streams are refused both ways and
// its connections dropped; in memory, its host is cut off the network,
// and healing heals every cut).
func (c *Cluster) Isolate(i int, on bool) { c.net.isolate(c, i, on) }

// Leader is the index of the running trainer that leads, ok=false if none
// does (or more than one think they do).
func (c *Cluster) Leader() (int, bool) {
	idx := -1
	for i := range c.trainers {
		if t := c.Trainer(i); t != nil && t.IsLeader() {
			if idx >= 0 {
				return -1, false
			}
			idx = i
		}
	}
	return idx, idx >= 0
}

// Ship has the device ship a batch.
func (c *Cluster) Ship(payload []byte) core.BatchID { return c.out.ship(payload) }

// WaitUntil polls cond every few milliseconds for at most d.
func (c *Cluster) WaitUntil(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	return waitFor(ctx, d, c.net.waitPrefix()+what, cond)
}

// waitFor polls cond every few milliseconds for at most d.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("trainer: %s within %s", what, d)
		}
		tm := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-tm.C:
		}
	}
	return nil
}

// Close stops everything and removes the directory if NewCluster made it.
func (c *Cluster) Close() error {
	var errs []error
	for i, ct := range c.trainers {
		if ct.t != nil {
			t := ct.t
			ct.t = nil
			ct.cancel()
			<-ct.done
			ct.stopPeer()
			if err := t.Close(); err != nil {
				errs = append(errs, fmt.Errorf("trainer %d: %w", i, err))
			}
		}
	}
	c.cancel()
	if c.node != nil {
		c.node.stop()
	}
	c.wg.Wait()
	c.net.close()
	if c.opts.Dir == "" {
		os.RemoveAll(c.Dir)
	}
	return errors.Join(errs...)
}

// SyntheticBatch encodes a batch of n scored steps of one session, as a
// device would ship them: a user asks, the assistant answers, and a
// plugin's reward of +1 or −1 says whether the answer starts with a word.
// Different seeds give different batches.
func SyntheticBatch(seed uint64, n int, adapter string) ([]byte, error) {
	return synthetic.Batch(seed, n, adapter)
}
