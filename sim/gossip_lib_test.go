package sim

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/host"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// copyCounter counts the copies of topic's messages a host receives,
// duplicates included, and the distinct ones.
type copyCounter struct {
	topic             string
	copies, delivered atomic.Int64
}

func (c *copyCounter) RecvRPC(rpc *pubsub.RPC) {
	for _, m := range rpc.GetPublish() {
		if m.GetTopic() == c.topic {
			c.copies.Add(1)
		}
	}
}

func (c *copyCounter) DeliverMessage(m *pubsub.Message) {
	if m.GetTopic() == c.topic {
		c.delivered.Add(1)
	}
}

// The rest of pubsub.RawTracer: nothing to count.
func (*copyCounter) OnNewOutboundStream(lpeer.ID, protocol.ID)             {}
func (*copyCounter) OnClosedOutboundStream(lpeer.ID)                       {}
func (*copyCounter) Join(string)                                           {}
func (*copyCounter) Leave(string)                                          {}
func (*copyCounter) Graft(lpeer.ID, string)                                {}
func (*copyCounter) Prune(lpeer.ID, string)                                {}
func (*copyCounter) ValidateMessage(*pubsub.Message)                       {}
func (*copyCounter) RejectMessage(*pubsub.Message, string)                 {}
func (*copyCounter) DuplicateMessage(*pubsub.Message)                      {}
func (*copyCounter) ThrottlePeer(lpeer.ID)                                 {}
func (*copyCounter) SendRPC(*pubsub.RPC, lpeer.ID)                         {}
func (*copyCounter) SendRPCCompleted(*pubsub.RPC, lpeer.ID, time.Duration) {}
func (*copyCounter) DropRPC(*pubsub.RPC, lpeer.ID)                         {}
func (*copyCounter) UndeliverableMessage(*pubsub.Message)                  {}

var _ pubsub.RawTracer = (*copyCounter)(nil)

// TestGossipsubCopiesMatchLibrary runs go-libp2p-pubsub's gossipsub itself,
// on hosts on loopback with the options mesh/p2p gives it (no signatures,
// no author, messages identified by their data, flood publishing off) and
// a peer graph made as the simulator makes one, and compares the copies
// of a message a node receives with the model's at the same size.
func TestGossipsubCopiesMatchLibrary(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 40 libp2p hosts")
	}
	const n, degree, msgs = 40, 8, 6
	const topic = "clawmesh/sim/calibration"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hosts := make([]host.Host, n)
	counters := make([]*copyCounter, n)
	topics := make([]*pubsub.Topic, n)
	for i := range n {
		h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		hosts[i] = h
		counters[i] = &copyCounter{topic: topic}
		ps, err := pubsub.NewGossipSub(ctx, h,
			pubsub.WithMessageSignaturePolicy(pubsub.StrictNoSign),
			pubsub.WithNoAuthor(),
			pubsub.WithMessageIdFn(func(m *pb.Message) string {
				d := sha256.Sum256(m.GetData())
				return string(d[:])
			}),
			pubsub.WithFloodPublish(false),
			pubsub.WithPeerExchange(false),
			pubsub.WithRawTracer(counters[i]))
		if err != nil {
			t.Fatal(err)
		}
		if topics[i], err = ps.Join(topic); err != nil {
			t.Fatal(err)
		}
		sub, err := topics[i].Subscribe()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				if _, err := sub.Next(ctx); err != nil {
					return
				}
			}
		}()
	}
	// Every host dials random others until it has degree connections, as
	// the simulator's peer graph is made.
	r := rand.New(rand.NewPCG(7, 7))
	conns := make([]map[int]bool, n)
	for i := range conns {
		conns[i] = map[int]bool{}
	}
	for i := range n {
		for tries := 0; len(conns[i]) < degree && tries < 20*degree; tries++ {
			j := r.IntN(n)
			if j == i || conns[i][j] {
				continue
			}
			if err := hosts[i].Connect(ctx, lpeer.AddrInfo{ID: hosts[j].ID(), Addrs: hosts[j].Addrs()}); err != nil {
				t.Fatal(err)
			}
			conns[i][j], conns[j][i] = true, true
		}
	}
	// The meshes form over a few heartbeats.
	time.Sleep(5 * pubsub.GossipSubHeartbeatInterval)
	for k := range msgs {
		if err := topics[k*n/msgs].Publish(ctx, fmt.Appendf(nil, "message %d", k)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	// Every host has every message, and the heartbeats' gossip is over.
	// (A publisher's own message is not delivered to it.)
	want := make([]int64, n)
	for i := range want {
		want[i] = msgs
	}
	for k := range msgs {
		want[k*n/msgs]--
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < n; {
		if counters[i].delivered.Load() >= want[i] {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %d delivered %d of %d messages", i, counters[i].delivered.Load(), want[i])
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Duration(pubsub.GossipSubHistoryGossip+1) * pubsub.GossipSubHeartbeatInterval)
	var copies int64
	for _, c := range counters {
		copies += c.copies.Load()
	}
	real := float64(copies) / float64(n*msgs)

	w, err := newWorld(Options{Nodes: n - 3, Trainers: 3, Seed: 7, Degree: degree}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	w.run()
	model := w.report().Gossip.CopiesPerNode
	t.Logf("copies of a message per node: go-libp2p-pubsub %.2f, the model %.2f (%d nodes, %d connections dialled each)", real, model, n, degree)
	if math.Abs(real-model) > 0.2*real {
		t.Errorf("copies of a message per node: go-libp2p-pubsub %.2f, the model %.2f", real, model)
	}
}
