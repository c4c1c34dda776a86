package memnet_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/memnet"
)

// simPeer is a mesh peer on a memnet host: what mesh/peer.Start makes on
// mesh/p2p, here by hand.
type simPeer struct {
	mesh   *mesh.Mesh
	host   *memnet.Host
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startPeer starts and runs the peer of a data directory in a mesh, on a
// new host of key; stop (or the test's end) stops it.
func startPeer(t *testing.T, n *memnet.Network, dataDir string, key ed25519.PrivateKey) *simPeer {
	t.Helper()
	m, err := mesh.New(mesh.Config{
		DataDir: dataDir, Key: key, KeyOf: memnet.KeyOf, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := n.NewHost(memnet.HostOptions{Key: key, Gate: m, Open: mesh.OpenProtocols})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx, h); err != nil {
		cancel()
		t.Fatal(err)
	}
	p := &simPeer{mesh: m, host: h, cancel: cancel}
	p.goRun(func() { m.Run(ctx) })
	t.Cleanup(func() {
		if t.Failed() {
			var ids []mesh.PeerID
			for _, q := range m.Peers() {
				ids = append(ids, q.ID)
			}
			t.Logf("peer %s (%s): connected to %v, admits %v", m.ID(), m.Cert().Role(), h.Connected(), ids)
		}
		p.stop()
	})
	return p
}

func (p *simPeer) goRun(fn func()) {
	p.wg.Add(1)
	go func() { defer p.wg.Done(); fn() }()
}

// stop stops the peer's goroutines and closes its host (after a crash,
// closing does nothing).
func (p *simPeer) stop() {
	p.cancel()
	p.wg.Wait()
	p.host.Close()
}

// nobody admits no one: the gate of a host that has not joined yet (as
// mesh/peer's).
type nobody struct{}

func (nobody) Blocked(mesh.PeerID) bool  { return false }
func (nobody) Admitted(mesh.PeerID) bool { return false }

// joinMesh redeems an invite for role on a host of its own, as `clawmesh
// join` does, and returns the new member's data directory and key.
func joinMesh(t *testing.T, n *memnet.Network, inviterDir string, inviterKey ed25519.PrivateKey, inviter *simPeer, role member.Role) (string, ed25519.PrivateKey) {
	t.Helper()
	tok, err := mesh.Invite(inviterDir, inviterKey, role, time.Hour, 1, inviter.host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := n.NewKey()
	// The joining host listens at a port of the system's choosing, as
	// mesh/peer.Join's does; the peer it becomes, at its usual address.
	h, err := n.NewHost(memnet.HostOptions{Key: key, Gate: nobody{}, Open: mesh.OpenProtocols, NewAddr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dir := filepath.Join(t.TempDir(), "joined")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := mesh.Join(ctx, h, dir, tok.String(), time.Now()); err != nil {
		t.Fatalf("join as %s: %v", role, err)
	}
	return dir, key
}

// startAdmin makes a mesh on a new data directory and runs its admin's
// peer on a new host.
func startAdmin(t *testing.T, n *memnet.Network) (string, ed25519.PrivateKey, *simPeer) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "admin")
	key := n.NewKey()
	id, err := memnet.IDFromKey(key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(dir, "sim", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	return dir, key, startPeer(t, n, dir, key)
}

func admitted(a, b *simPeer) bool {
	return a.mesh.Admitted(b.mesh.ID()) && b.mesh.Admitted(a.mesh.ID())
}

// TestMeshOverMemnet runs the real mesh over memnet: an admin's node
// invites a member and a trainer, who join over memnet hosts; all admit
// each other (the member and the trainer find each other through the
// admin); batches the member ships are collected by the trainer; the
// trainer crashes, restarts on its data directory and collects again; a
// partition and its healing come and go.
func TestMeshOverMemnet(t *testing.T) {
	n := newNet(t, memnet.Options{Seed: 21, Latency: time.Millisecond, Jitter: 2 * time.Millisecond})
	adminDir, adminKey, admin := startAdmin(t, n)
	memberDir, memberKey := joinMesh(t, n, adminDir, adminKey, admin, member.RoleMember)
	trainerDir, trainerKey := joinMesh(t, n, adminDir, adminKey, admin, member.RoleTrainer)
	memb := startPeer(t, n, memberDir, memberKey)
	trainer := startPeer(t, n, trainerDir, trainerKey)
	eventually(t, "the admin to admit the member and the trainer", func() bool { return admitted(admin, memb) && admitted(admin, trainer) })
	eventually(t, "the member and the trainer to find and admit each other", func() bool { return admitted(memb, trainer) })

	// The member ships, the trainer collects.
	st := newMemStore()
	collect := func(p *simPeer) {
		ctx, cancel := context.WithCancel(context.Background())
		p.goRun(func() { p.mesh.Collect(ctx, st, mesh.PullOptions{}) })
		t.Cleanup(cancel)
	}
	collect(trainer)
	out := &memOutbox{payloads: map[core.BatchID][]byte{}, shipped: map[core.BatchID]int{}}
	{
		ctx, cancel := context.WithCancel(context.Background())
		memb.goRun(func() {
			memb.mesh.Ship(ctx, out, mesh.ShipOptions{Retry: 200 * time.Millisecond, MaxRetry: time.Second, Poll: 10 * time.Millisecond})
		})
		t.Cleanup(cancel)
	}
	first := out.add(t, 3, "first")
	eventually(t, "the first batch stored and shipped", func() bool { return st.has(first) && out.count(first) == 1 })

	// The trainer crashes: the others see it go. It restarts on its data
	// directory, dials its bootstrap peer (the admin), is admitted again
	// and collects the next batch, which it pulls from the member.
	if err := n.Crash(trainer.mesh.ID()); err != nil {
		t.Fatal(err)
	}
	trainer.stop()
	eventually(t, "the admin and the member to drop the crashed trainer", func() bool {
		return !admin.mesh.Admitted(trainer.mesh.ID()) && !memb.mesh.Admitted(trainer.mesh.ID())
	})
	second := out.add(t, 2, "second")
	trainer = startPeer(t, n, trainerDir, trainerKey)
	collect(trainer)
	eventually(t, "the restarted trainer admitted by the admin and the member", func() bool { return admitted(admin, trainer) && admitted(memb, trainer) })
	eventually(t, "the second batch stored and shipped", func() bool { return st.has(second) && out.count(second) == 1 })

	// A partition puts the trainer apart: nobody admits it any more (its
	// connections closed). Healed, it dials the admin again and is
	// admitted again.
	n.Partition([]mesh.PeerID{admin.mesh.ID(), memb.mesh.ID()}, []mesh.PeerID{trainer.mesh.ID()})
	eventually(t, "the trainer dropped across the partition", func() bool {
		return !admin.mesh.Admitted(trainer.mesh.ID()) && !trainer.mesh.Admitted(memb.mesh.ID())
	})
	if admin.mesh.Admitted(memb.mesh.ID()) != true {
		t.Error("the partition cut the admin from the member, on the same side")
	}
	n.Heal()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := trainer.host.Connect(ctx, admin.host.Addrs()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the trainer admitted again after the heal", func() bool { return admitted(admin, trainer) && admitted(memb, trainer) })
	third := out.add(t, 1, "third")
	eventually(t, "the third batch stored and shipped", func() bool { return st.has(third) && out.count(third) == 1 })
}

// memStore is a trainer's store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[core.BatchID][]byte
}

func newMemStore() *memStore { return &memStore{m: map[core.BatchID][]byte{}} }

func (s *memStore) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.m[id]; ok {
		return b, nil
	}
	return nil, mesh.ErrNoBatch
}

func (s *memStore) Has(ctx context.Context, id core.BatchID) (bool, error) { return s.has(id), nil }

func (s *memStore) Put(ctx context.Context, id core.BatchID, payload []byte, b *batch.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[id] = payload
	return nil
}

func (s *memStore) has(id core.BatchID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

// memOutbox is a node's outbox in memory.
type memOutbox struct {
	mu       sync.Mutex
	payloads map[core.BatchID][]byte
	shipped  map[core.BatchID]int
}

// add puts a batch of n steps in the outbox.
func (o *memOutbox) add(t *testing.T, n int, text string) core.BatchID {
	t.Helper()
	var steps []*core.Step
	for i := range n {
		v := 1.0
		steps = append(steps, &core.Step{
			ID: core.StepID(fmt.Sprintf("%s-%d", text, i)), SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: core.StateBatched,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprintf("%s %d", text, i)}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
			Reward:   &core.Reward{Value: &v, Scores: []core.Score{}},
		})
	}
	b, err := batch.Encode(batch.Meta{Created: time.Now().UTC().Truncate(time.Hour)}, steps)
	if err != nil {
		t.Fatal(err)
	}
	id := batch.ID(b)
	o.mu.Lock()
	o.payloads[id] = b
	o.mu.Unlock()
	return id
}

func (o *memOutbox) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if b, ok := o.payloads[id]; ok {
		return b, nil
	}
	return nil, mesh.ErrNoBatch
}

func (o *memOutbox) Unshipped(ctx context.Context) ([]core.BatchID, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []core.BatchID
	for id := range o.payloads {
		if o.shipped[id] == 0 {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (o *memOutbox) Shipped(ctx context.Context, id core.BatchID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.shipped[id]++
	return nil
}

func (o *memOutbox) count(id core.BatchID) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.shipped[id]
}

// TestPeersMeetAgain: a member and a trainer that know each other only
// through the admin lose their connection (a blip, a connection manager's
// trim); neither dials the other again on its own, but each asks the
// admin again, in turn, which peers it knows, and they meet again. The
// same exchange, run again, is what lets two peers that joined through
// the admin at the same moment, each admitted before the admin knew the
// other, find each other.
func TestPeersMeetAgain(t *testing.T) {
	n := newNet(t, memnet.Options{Seed: 5, Latency: time.Millisecond, Jitter: 2 * time.Millisecond})
	adminDir, adminKey, admin := startAdmin(t, n)
	memberDir, memberKey := joinMesh(t, n, adminDir, adminKey, admin, member.RoleMember)
	trainerDir, trainerKey := joinMesh(t, n, adminDir, adminKey, admin, member.RoleTrainer)
	memb := startPeer(t, n, memberDir, memberKey)
	trainer := startPeer(t, n, trainerDir, trainerKey)
	eventually(t, "the member and the trainer to admit each other", func() bool { return admitted(memb, trainer) })
	since := memb.mesh.Peers()

	cut := time.Now()
	if err := memb.host.Disconnect(trainer.mesh.ID()); err != nil {
		t.Fatal(err)
	}
	// Meeting again is a new admission on each side (how soon it comes
	// after both sides forgot each other is timing, not the point).
	eventually(t, "the member and the trainer to meet again", func() bool {
		a, ok := memb.mesh.Peer(trainer.mesh.ID())
		b, ok2 := trainer.mesh.Peer(memb.mesh.ID())
		return ok && ok2 && a.Since.After(cut) && b.Since.After(cut)
	})

	// Running the exchange again with the admin admitted nothing anew: the
	// admin is the peer it was, since the same moment.
	for _, p := range memb.mesh.Peers() {
		if p.ID != admin.mesh.ID() {
			continue
		}
		for _, q := range since {
			if q.ID == p.ID && !q.Since.Equal(p.Since) {
				t.Errorf("the admin admitted since %v, then since %v", q.Since, p.Since)
			}
		}
	}
}
