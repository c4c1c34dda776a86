package harness

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/memnet"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/trainer"
)

// Loopback puts a Cluster's peers on libp2p hosts on 127.0.0.1, each
// trainer the whole trainer peer (trainer.New) with its weights service.
type Loopback struct{}

func (Loopback) open(*slog.Logger) hosts { return loopback{} }

type loopback struct{}

func (loopback) name() (string, string) { return "cluster", "clawmesh-cluster-" }
func (loopback) waitPrefix() string     { return "cluster: no " }

func (loopback) identity(dir string) (ed25519.PrivateKey, mesh.PeerID, error) {
	return peer.Identity(dir)
}

func (loopback) startNode(ctx context.Context, dir string, _ ed25519.PrivateKey) (*clusterPeer, error) {
	ctx, cancel := context.WithCancel(ctx)
	p, err := peer.Start(ctx, peer.Options{DataDir: dir, Listen: benchListen})
	if err != nil {
		cancel()
		return nil, err
	}
	cp := &clusterPeer{mesh: p.Mesh, host: p.Host, cancel: cancel}
	cp.wg.Add(1)
	go func() { defer cp.wg.Done(); p.Run(ctx) }()
	return cp, nil
}

func (loopback) join(ctx context.Context, _ int, dir, token string) (ed25519.PrivateKey, error) {
	_, err := peer.Join(ctx, dir, token, benchListen, nil)
	return nil, err // the trainer loads its key itself
}

func (loopback) startTrainer(ctx context.Context, c *Cluster, _ int, cfg trainer.Config) (*trainer.Trainer, *clusterPeer, error) {
	boot := c.node.host.Addrs()
	for _, o := range c.trainers {
		if o.t != nil {
			boot = append(boot, o.t.Peer().Host.Addrs()...)
		}
	}
	cfg.Listen, cfg.Bootstrap, cfg.Weights = benchListen, boot, "127.0.0.1:0"
	t, err := trainer.New(ctx, cfg)
	return t, nil, err
}

// crash leaves the host to Trainer.Crash, which closes it.
func (loopback) crash(*trainer.Trainer) error { return nil }

func (loopback) isolate(c *Cluster, i int, on bool) {
	t := c.trainers[i].t
	if t == nil {
		return
	}
	t.SetIsolated(on)
	if on {
		for _, o := range c.trainers {
			if o.t != nil && o.t != t {
				t.Peer().Host.Disconnect(o.t.ID())
			}
		}
	}
}

func (loopback) close() {}

// Memory puts a Cluster's peers on a simulated network (mesh/memnet):
// every peer the real mesh and the real trainer (trainer.NewOn, with no
// weights service), their streams in memory with seeded latencies, a
// crash the host vanishing at once. The same scenarios run on it over
// many seeds.
type Memory struct {
	Seed            uint64
	Latency, Jitter time.Duration
	// NoAdmin starts the trainers with no admin API (trainer.AdminOff),
	// so that the cluster opens no real socket and can run in a
	// testing/synctest bubble, in virtual time.
	NoAdmin bool
}

func (o Memory) open(log *slog.Logger) hosts {
	return &memory{o: o, log: log,
		net: memnet.NewNetwork(memnet.Options{Seed: o.Seed, Latency: o.Latency, Jitter: o.Jitter, Logger: log.With("component", "memnet")})}
}

type memory struct {
	o   Memory
	log *slog.Logger
	net *memnet.Network
}

func (*memory) name() (string, string) { return "sim", "clawmesh-sim-" }
func (*memory) waitPrefix() string     { return "sim cluster: no " }

func (m *memory) identity(string) (ed25519.PrivateKey, mesh.PeerID, error) {
	key := m.net.NewKey()
	id, err := memnet.IDFromKey(key.Public().(ed25519.PublicKey))
	return key, id, err
}

// startPeer starts and runs the peer of dir until ctx is done or stop;
// it dials the device's peer, when there is one, as a real host dials
// the peers it knows on start.
func (m *memory) startPeer(ctx context.Context, dir string, key ed25519.PrivateKey, node *clusterPeer) (*clusterPeer, error) {
	ms, err := mesh.New(mesh.Config{DataDir: dir, Key: key, KeyOf: memnet.KeyOf, Logger: m.log})
	if err != nil {
		return nil, err
	}
	h, err := m.net.NewHost(memnet.HostOptions{Key: key, Gate: ms, Open: mesh.OpenProtocols})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := ms.Start(ctx, h); err != nil {
		cancel()
		h.Close()
		return nil, err
	}
	p := &clusterPeer{mesh: ms, host: h, cancel: cancel}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); ms.Run(ctx) }()
	if node != nil {
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		h.Connect(dctx, node.host.Addrs())
		dcancel()
	}
	return p, nil
}

func (m *memory) startNode(ctx context.Context, dir string, key ed25519.PrivateKey) (*clusterPeer, error) {
	return m.startPeer(ctx, dir, key, nil)
}

func (m *memory) join(ctx context.Context, i int, dir, token string) (ed25519.PrivateKey, error) {
	key := m.net.NewKey()
	h, err := m.net.NewHost(memnet.HostOptions{Key: key, Gate: nobody{}, Open: mesh.OpenProtocols, NewAddr: true})
	if err != nil {
		return nil, err
	}
	_, err = mesh.Join(ctx, h, dir, token, time.Now())
	h.Close()
	if err != nil {
		return nil, fmt.Errorf("trainer %d joins: %w", i, err)
	}
	return key, nil
}

// nobody admits no one: the gate of a host that has not joined yet.
type nobody struct{}

func (nobody) Blocked(mesh.PeerID) bool  { return false }
func (nobody) Admitted(mesh.PeerID) bool { return false }

func (m *memory) startTrainer(_ context.Context, c *Cluster, i int, cfg trainer.Config) (*trainer.Trainer, *clusterPeer, error) {
	ct := c.trainers[i]
	// The peer runs until the trainer is killed or the cluster closes.
	p, err := m.startPeer(context.Background(), ct.dir, ct.key, c.node)
	if err != nil {
		return nil, nil, err
	}
	if m.o.NoAdmin {
		cfg.Admin = trainer.AdminOff
	}
	t, err := trainer.NewOn(cfg, p.host, p.mesh)
	if err != nil {
		p.stop()
		return nil, nil, err
	}
	return t, p, nil
}

func (m *memory) crash(t *trainer.Trainer) error { return m.net.Crash(t.ID()) }

func (m *memory) isolate(c *Cluster, i int, on bool) {
	if on {
		m.net.Isolate(c.trainers[i].peer.host.ID())
		return
	}
	m.net.Heal()
	// Hosts dial again after an outage, as the real ones do.
	for _, ct := range c.trainers {
		if ct.t != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ct.peer.host.Connect(ctx, c.node.host.Addrs())
			cancel()
		}
	}
}

func (m *memory) close() { m.net.Close() }
