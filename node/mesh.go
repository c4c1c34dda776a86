package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

// MeshConfig makes a node that is in a mesh (its data directory holds a
// membership: `clawmesh mesh init` or `clawmesh join`) a mesh peer: it
// announces its sealed batches to the mesh, serves them to the trainers
// that pull them, and marks each shipped at a trainer's first ack. It also
// serves its reward plugins' modules by hash (mesh.ProtoPlugin), so that a
// trainer can replay the scores its batches carry.
type MeshConfig struct {
	// Listen are libp2p multiaddrs; default QUIC and TCP on port 4001 (or
	// a free port).
	Listen []string
	// Bootstrap are peers to dial at start.
	Bootstrap []string
	// MDNS finds peers on the local network; NAT turns on NAT traversal.
	MDNS, NAT bool
	// Ship times the announcements (mesh.ShipOptions).
	Ship mesh.ShipOptions
	// Weights is the UDP address of the QUIC service that fetches the
	// trainers' adapter versions and re-serves them to other devices
	// (default ":0"); "off" follows none.
	Weights string
	// WeightsAnnounce is how often the newest version held is offered
	// again (mesh/weights default); WeightsRetry how long after a failed
	// fetch or swap the next try starts (node/adapters default).
	WeightsAnnounce, WeightsRetry time.Duration
}

// joined reports whether the node's data directory is in a mesh.
func joined(dataDir string) (bool, error) {
	st, err := mesh.LoadState(dataDir)
	if errors.Is(err, mesh.ErrNotJoined) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if c, _ := st.Certificate(); c.Role() == member.RoleTrainer {
		return false, &datadir.KindError{Dir: dataDir, Want: "node", Is: "trainer", Why: "its mesh certificate is a trainer's"}
	}
	return true, nil
}

// notTrainers refuses a trainer's data directory: a node there would take
// the trainer's identity and write its pool and keys beside its batches.
func notTrainers(dataDir string) error {
	if datadir.Is(dataDir, datadir.TrainerMark) {
		return &datadir.KindError{Dir: dataDir, Want: "node", Is: "trainer", Why: "it holds a trainer's batch store, " + datadir.TrainerMark + "/"}
	}
	return nil
}

// startMesh starts the node's mesh peer, if its data directory is in a
// mesh and cfg.Mesh is set.
func (n *Node) startMesh(ctx context.Context) error {
	if n.cfg.Mesh == nil || !n.joined {
		return nil
	}
	mc := n.cfg.Mesh
	p, err := peer.Start(ctx, peer.Options{DataDir: n.cfg.DataDir, Listen: mc.Listen, Bootstrap: mc.Bootstrap, MDNS: mc.MDNS, NAT: mc.NAT, Logger: n.log})
	if err != nil {
		return fmt.Errorf("node: mesh: %w", err)
	}
	n.peer = p
	if n.plugins != nil {
		p.Mesh.ServePlugins(runnerPlugins{n})
	}
	return n.startWeights()
}

// runnerPlugins serves the modules of the plugins the reward runner has
// loaded (once it has).
type runnerPlugins struct{ n *Node }

func (s runnerPlugins) Plugin(ctx context.Context, hash string) ([]byte, error) {
	r, err := s.n.runner(ctx)
	if err != nil {
		return nil, err
	}
	b, err := r.Module(hash)
	if errors.Is(err, reward.ErrUnknownPlugin) {
		return nil, fmt.Errorf("%w: %v", mesh.ErrNoPlugin, err)
	}
	return b, err
}

// Peer returns the node's mesh peer, nil when it is not in a mesh.
func (n *Node) Peer() *peer.Peer { return n.peer }

// runMesh runs the mesh peer and ships the outbox until ctx is done.
func (n *Node) runMesh(ctx context.Context) {
	done := make(chan struct{})
	go func() { n.peer.Run(ctx); close(done) }()
	if err := n.peer.Mesh.Ship(ctx, poolOutbox{n.pool, n.metrics}, n.cfg.Mesh.Ship); err != nil && ctx.Err() == nil {
		n.log.Error("shipping batches", "err", err)
	}
	<-done
}

// Batches is a pool's outbox as the mesh admin API lists it.
type Batches struct{ P *pool.Pool }

// List lists the outbox batches, oldest first.
func (b Batches) List(ctx context.Context) ([]peer.BatchInfo, error) {
	bs, err := b.P.Batches(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(bs, func(x, y *pool.Batch) int { return x.Created.Compare(y.Created) })
	out := make([]peer.BatchInfo, 0, len(bs))
	for _, x := range bs {
		out = append(out, peer.BatchInfo{ID: x.ID, Size: x.Size, Steps: len(x.Steps), Created: x.Created, Shipped: x.Shipped})
	}
	return out, nil
}

// Get returns an outbox batch decoded from its payload.
func (b Batches) Get(ctx context.Context, id core.BatchID) (*batch.Batch, error) {
	p, err := poolOutbox{p: b.P}.Payload(ctx, id)
	if err != nil {
		return nil, err
	}
	return batch.Verify(p, id, batch.Limits{MaxBytes: int64(len(p))})
}

// poolOutbox is the pool's outbox as the mesh ships it.
type poolOutbox struct {
	p *pool.Pool
	m *metrics
}

func (o poolOutbox) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	b, err := o.p.Payload(ctx, id)
	if errors.Is(err, pool.ErrNoBatch) {
		return nil, fmt.Errorf("%w: %v", mesh.ErrNoBatch, err)
	}
	return b, err
}

// OpenPayload serves a trainer's pull (announcements read Payload).
func (o poolOutbox) OpenPayload(ctx context.Context, id core.BatchID) (io.ReadCloser, int64, error) {
	b, err := o.Payload(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	o.m.pulled(len(b))
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

func (o poolOutbox) Unshipped(ctx context.Context) ([]core.BatchID, error) {
	bs, err := o.p.Batches(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(bs, func(a, b *pool.Batch) int { return a.Created.Compare(b.Created) })
	var ids []core.BatchID
	for _, b := range bs {
		if b.Shipped.IsZero() {
			ids = append(ids, b.ID)
		}
	}
	return ids, nil
}

func (o poolOutbox) Shipped(ctx context.Context, id core.BatchID) error {
	if err := o.p.MarkShipped(ctx, id); err != nil {
		return err
	}
	o.m.shippedOne()
	return nil
}
