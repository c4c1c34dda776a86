package sim

import (
	"slices"
	"testing"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
)

// TestGossipsubMesh: every node's mesh is symmetric, made of neighbours
// it can send to, between gsDlo and gsDhi peers where it has that many;
// messages are pushed over the meshes, not flooded to every neighbour,
// and reach every live device.
func TestGossipsubMesh(t *testing.T) {
	w, err := newWorld(Options{Nodes: 1000, Trainers: 3, Seed: 7}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	var degree, nbrs float64
	for i, n := range w.nodes {
		usable := 0
		for _, j := range n.nbrs {
			if w.sendTo(n, w.nodes[j]) {
				usable++
			}
		}
		if len(n.mesh) > gsDhi || len(n.mesh) < min(gsDlo, usable) {
			t.Fatalf("%s: a mesh of %d peers, %d usable neighbours", n.pid, len(n.mesh), usable)
		}
		for _, j := range n.mesh {
			if _, ok := slices.BinarySearch(n.nbrs, j); !ok || !w.sendTo(n, w.nodes[j]) {
				t.Fatalf("%s has %s in its mesh, not a neighbour it can send to", n.pid, w.nodes[j].pid)
			}
			if !slices.Contains(w.nodes[j].mesh, i) {
				t.Fatalf("%s has %s in its mesh, not the other way", n.pid, w.nodes[j].pid)
			}
		}
		degree += float64(len(n.mesh))
		nbrs += float64(usable)
	}
	degree /= float64(len(w.nodes))
	nbrs /= float64(len(w.nodes))
	t.Logf("mean mesh degree %.2f, mean usable neighbours %.2f", degree, nbrs)
	w.run()
	r := w.report()
	t.Logf("gossip %+v", r.Gossip)
	if r.Gossip.DeliveryRatio != 1 {
		t.Errorf("delivery ratio %v in a quiet mesh", r.Gossip.DeliveryRatio)
	}
	// A flood sends each message over every usable connection but the
	// one it came on; the mesh pushes it to about gsD peers.
	if r.Gossip.CopiesPerNode > degree+0.5 || r.Gossip.CopiesPerNode >= nbrs-1 {
		t.Errorf("%.2f copies per node per message: mesh degree %.2f, usable neighbours %.2f", r.Gossip.CopiesPerNode, degree, nbrs)
	}
	if r.Gossip.IHavesPerNode < gsDlazy {
		t.Errorf("%.2f IHAVEs per node per message, fewer than gsDlazy %d each heartbeat", r.Gossip.IHavesPerNode, gsDlazy)
	}
}

// TestGossipsubRecovers: on links that lose about half of all messages,
// the eager push over the meshes leaves devices out; the IHAVE/IWANT
// gossip at the heartbeats brings the messages to them.
func TestGossipsubRecovers(t *testing.T) {
	run := func(eagerOnly bool) *Report {
		w, err := newWorld(Options{Nodes: 1000, Trainers: 3, Seed: 7}, DefAll)
		if err != nil {
			t.Fatal(err)
		}
		w.eagerOnly = eagerOnly
		for _, n := range w.nodes {
			n.loss = 0.3 // 1 − 0.7² = 0.51 a link
		}
		w.run()
		r := w.report()
		t.Logf("eager only %v: gossip %+v", eagerOnly, r.Gossip)
		return r
	}
	eager, full := run(true), run(false)
	if eager.Gossip.Pulled != 0 || eager.Gossip.IHavesPerNode != 0 {
		t.Fatalf("gossip with IHAVE off: %+v", eager.Gossip)
	}
	if full.Gossip.Pulled == 0 {
		t.Fatal("no copy was pulled by IWANT")
	}
	if full.Gossip.DeliveryRatio <= eager.Gossip.DeliveryRatio || full.Gossip.DeliveryRatio < 0.99 {
		t.Errorf("delivery ratio %v with IHAVE/IWANT, %v without", full.Gossip.DeliveryRatio, eager.Gossip.DeliveryRatio)
	}
}

// TestGossipsubDefaults: the model's gossipsub constants are the library's
// defaults, which mesh/p2p runs with.
func TestGossipsubDefaults(t *testing.T) {
	for _, c := range []struct {
		name        string
		model, real any
	}{
		{"D", gsD, pubsub.GossipSubD},
		{"Dlo", gsDlo, pubsub.GossipSubDlo},
		{"Dhi", gsDhi, pubsub.GossipSubDhi},
		{"Dlazy", gsDlazy, pubsub.GossipSubDlazy},
		{"GossipFactor", gsGossipFactor, pubsub.GossipSubGossipFactor},
		{"HeartbeatInterval", gsHeartbeat, pubsub.GossipSubHeartbeatInterval},
		{"HistoryGossip", gsHistoryGossip, pubsub.GossipSubHistoryGossip},
	} {
		if c.model != c.real {
			t.Errorf("GossipSub%s: the model has %v, go-libp2p-pubsub %v", c.name, c.model, c.real)
		}
	}
}
