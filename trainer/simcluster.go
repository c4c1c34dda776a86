package trainer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/memnet"
)

// SimCluster is Cluster over a simulated network (mesh/memnet): one device
// that ships batches and n trainers, every peer the real mesh and the real
// trainer, their streams in memory with seeded latencies, and faults at
// will: crashes as under kill -9, isolation, partitions. The same
// scenarios run on it over many seeds.
type SimCluster struct {
	Dir  string
	Net  *memnet.Network
	opts ClusterOptions
	sim  SimOptions

	node     *simPeer
	out      *benchOutbox
	trainers []*simTrainer
	wg       sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
}

type simPeer struct {
	mesh   *mesh.Mesh
	host   *memnet.Host
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type simTrainer struct {
	dir  string
	key  ed25519.PrivateKey
	peer *simPeer
	t    *Trainer
	done chan struct{}
}

// SimOptions configure the simulated network.
type SimOptions struct {
	Seed            uint64
	Latency, Jitter time.Duration
	// NoAdmin starts the trainers with no admin API (Config.Admin
	// AdminOff), so that the cluster opens no real socket and can run in a
	// testing/synctest bubble, in virtual time.
	NoAdmin bool
}

// NewSimCluster makes the mesh on a simulated network and starts every
// trainer.
func NewSimCluster(ctx context.Context, o ClusterOptions, so SimOptions) (_ *SimCluster, err error) {
	if o.Trainers == 0 {
		o.Trainers = 3
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "clawmesh-sim-"); err != nil {
			return nil, err
		}
	}
	c := &SimCluster{Dir: dir, opts: o, sim: so, out: newBenchOutbox(),
		Net: memnet.NewNetwork(memnet.Options{Seed: so.Seed, Latency: so.Latency, Jitter: so.Jitter, Logger: o.Logger.With("component", "memnet")})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	nodeDir := filepath.Join(dir, "node")
	nodeKey := c.Net.NewKey()
	nodeID, err := memnet.IDFromKey(nodeKey.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	if _, err := mesh.Init(nodeDir, "sim", nodeKey, nodeID, time.Now(), rand.Reader); err != nil {
		return nil, err
	}
	if c.node, err = c.startPeer(nodeDir, nodeKey); err != nil {
		return nil, err
	}
	c.goRun(func() {
		c.node.mesh.Ship(c.ctx, c.out, mesh.ShipOptions{Poll: 20 * time.Millisecond, Retry: ShipRetry, MaxRetry: 5 * ShipRetry})
	})
	for i := range o.Trainers {
		tok, err := mesh.Invite(nodeDir, nodeKey, member.RoleTrainer, time.Hour, 1, c.node.host.Addrs(), time.Now(), rand.Reader)
		if err != nil {
			return nil, err
		}
		key := c.Net.NewKey()
		h, err := c.Net.NewHost(memnet.HostOptions{Key: key, Gate: nobody{}, Open: mesh.OpenProtocols, NewAddr: true})
		if err != nil {
			return nil, err
		}
		td := filepath.Join(dir, "trainer"+strconv.Itoa(i))
		jctx, jcancel := context.WithTimeout(ctx, benchWait)
		_, err = mesh.Join(jctx, h, td, tok.String(), time.Now())
		jcancel()
		h.Close()
		if err != nil {
			return nil, fmt.Errorf("trainer %d joins: %w", i, err)
		}
		c.trainers = append(c.trainers, &simTrainer{dir: td, key: key})
	}
	for i := range c.trainers {
		if err := c.Start(ctx, i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// nobody admits no one: the gate of a host that has not joined yet.
type nobody struct{}

func (nobody) Blocked(mesh.PeerID) bool  { return false }
func (nobody) Admitted(mesh.PeerID) bool { return false }

func (c *SimCluster) goRun(fn func()) {
	c.wg.Add(1)
	go func() { defer c.wg.Done(); fn() }()
}

func (c *SimCluster) startPeer(dir string, key ed25519.PrivateKey) (*simPeer, error) {
	m, err := mesh.New(mesh.Config{DataDir: dir, Key: key, KeyOf: memnet.KeyOf, Logger: c.opts.Logger})
	if err != nil {
		return nil, err
	}
	h, err := c.Net.NewHost(memnet.HostOptions{Key: key, Gate: m, Open: mesh.OpenProtocols})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(c.ctx)
	if err := m.Start(ctx, h); err != nil {
		cancel()
		h.Close()
		return nil, err
	}
	p := &simPeer{mesh: m, host: h, cancel: cancel}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); m.Run(ctx) }()
	// Peers dial the ones they know, as the real host does on start.
	if c.node != nil {
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		h.Connect(dctx, c.node.host.Addrs())
		dcancel()
	}
	return p, nil
}

func (p *simPeer) stop() {
	p.cancel()
	p.wg.Wait()
	p.host.Close()
}

// Len is the number of trainers.
func (c *SimCluster) Len() int { return len(c.trainers) }

// Trainer is trainer i, nil while it is down.
func (c *SimCluster) Trainer(i int) *Trainer { return c.trainers[i].t }

// Start starts trainer i (again) from its data directory.
func (c *SimCluster) Start(ctx context.Context, i int) error {
	st := c.trainers[i]
	if st.t != nil {
		return fmt.Errorf("trainer %d is running", i)
	}
	p, err := c.startPeer(st.dir, st.key)
	if err != nil {
		return err
	}
	admin := ""
	if c.sim.NoAdmin {
		admin = AdminOff
	}
	t, err := NewOn(Config{DataDir: st.dir, Admin: admin, Timing: c.opts.Timing, Group: c.opts.Group, Verify: c.opts.Verify, NoVerify: c.opts.Verify == nil,
		Logger: c.opts.Logger.With("trainer", i)}, p.host, p.mesh)
	if err != nil {
		p.stop()
		return err
	}
	st.peer, st.t, st.done = p, t, make(chan struct{})
	done := st.done
	c.goRun(func() { defer close(done); t.Run(c.ctx) })
	return nil
}

// Kill crashes trainer i as kill -9 would: its host vanishes from the
// network at once, then its process state is dropped. Its data directory
// stays.
func (c *SimCluster) Kill(i int) error {
	st := c.trainers[i]
	if st.t == nil {
		return nil
	}
	t := st.t
	st.t = nil
	err := c.Net.Crash(t.self)
	// Raft's goroutines end before the stores close under them (raft
	// panics on a log it cannot read).
	err = errors.Join(err, t.group.raft.Shutdown().Error())
	t.cancel()
	<-st.done
	st.peer.stop()
	return errors.Join(err, t.Close())
}

// Isolate cuts trainer i off the network (on) or heals every cut (off).
func (c *SimCluster) Isolate(i int, on bool) {
	if on {
		c.Net.Isolate(c.trainers[i].peer.host.ID())
		return
	}
	c.Net.Heal()
	// Hosts dial again after an outage, as the real ones do.
	for _, st := range c.trainers {
		if st.t != nil {
			ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			st.peer.host.Connect(ctx, c.node.host.Addrs())
			cancel()
		}
	}
}

// Leader is the index of the running trainer that leads, ok=false if none
// (or more than one) does.
func (c *SimCluster) Leader() (int, bool) { return leaderAmong(len(c.trainers), c.Trainer) }

// Ship has the device ship a batch.
func (c *SimCluster) Ship(payload []byte) core.BatchID { return c.out.ship(payload) }

// WaitUntil polls cond for at most d.
func (c *SimCluster) WaitUntil(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	return waitFor(ctx, d, "sim cluster: no "+what, cond)
}

// Close stops everything and removes the directory if NewSimCluster made
// it.
func (c *SimCluster) Close() error {
	var errs []error
	for i, st := range c.trainers {
		if st.t != nil {
			t := st.t
			st.t = nil
			t.cancel()
			<-st.done
			st.peer.stop()
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
	c.Net.Close()
	if c.opts.Dir == "" {
		os.RemoveAll(c.Dir)
	}
	return errors.Join(errs...)
}

// DataDir is trainer i's data directory.
func (c *SimCluster) DataDir(i int) string { return c.trainers[i].dir }
