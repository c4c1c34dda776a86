package memnet_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/memnet"
)

// inbox reads a topic into a list until the test ends.
type inbox struct {
	mu   sync.Mutex
	msgs []mesh.Message
}

func read(t *testing.T, topic mesh.Topic) *inbox {
	in := &inbox{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := topic.Next(ctx)
			if err != nil {
				return
			}
			in.mu.Lock()
			in.msgs = append(in.msgs, m)
			in.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return in
}

func (in *inbox) len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.msgs)
}

func (in *inbox) data() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]string, len(in.msgs))
	for i, m := range in.msgs {
		out[i] = string(m.Data)
	}
	return out
}

func (in *inbox) from() []mesh.PeerID {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]mesh.PeerID, len(in.msgs))
	for i, m := range in.msgs {
		out[i] = m.From
	}
	return out
}

func join(t *testing.T, h *memnet.Host, name string) mesh.Topic {
	t.Helper()
	topic, err := h.Join(name)
	if err != nil {
		t.Fatal(err)
	}
	return topic
}

// TestGossipAdmission: a message reaches the admitted, subscribed peers
// only: not a peer the publisher does not admit, not one that does not
// admit the publisher, not one that has not joined; once.
func TestGossipAdmission(t *testing.T) {
	n := newNet(t, memnet.Options{Seed: 4, Latency: time.Millisecond, Jitter: 2 * time.Millisecond})
	ga := newGate(false)
	a := newHost(t, n, ga)
	member := newHost(t, n, nil)           // admitted both ways
	stranger := newHost(t, n, nil)         // a does not admit it
	picky := newHost(t, n, newGate(false)) // it does not admit a
	away := newHost(t, n, nil)             // admitted, not subscribed
	ga.admit(member.ID(), true)
	ga.admit(picky.ID(), true)
	ga.admit(away.ID(), true)
	for _, h := range []*memnet.Host{member, stranger, picky, away} {
		connect(t, a, h)
	}
	pub := join(t, a, "news")
	inMember, inStranger, inPicky := read(t, join(t, member, "news")), read(t, join(t, stranger, "news")), read(t, join(t, picky, "news"))
	inSelf := read(t, pub)
	join(t, away, "other")

	ctx := context.Background()
	if err := pub.Publish(ctx, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the member to get the message", func() bool { return inMember.len() == 1 })
	if got := inMember.from(); got[0] != a.ID() {
		t.Errorf("from %s, want %s", got[0], a.ID())
	}
	// Published again: seen already, nothing is sent.
	if err := pub.Publish(ctx, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	never(t, "a message reached a peer it must not, or twice", func() bool {
		return inMember.len() > 1 || inStranger.len() > 0 || inPicky.len() > 0 || inSelf.len() > 0
	})
	if st := n.Stats(); st.GossipSent != 2 || st.GossipDelivered != 1 {
		// a sent to the member and to picky (which dropped it); nobody forwards.
		t.Errorf("stats %+v: want 2 sent, 1 delivered", st)
	}

	// Admission changes take effect at once.
	ga.admit(stranger.ID(), true)
	if err := pub.Publish(ctx, []byte("now you too")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the newly admitted peer to get the next message", func() bool { return inStranger.len() == 1 })

	// Errors.
	if _, err := a.Join("news"); !errors.Is(err, memnet.ErrJoined) {
		t.Errorf("join twice: %v", err)
	}
	if err := pub.Publish(ctx, make([]byte, memnet.DefaultMaxMessage+1)); !errors.Is(err, memnet.ErrTooLarge) {
		t.Errorf("a message too large: %v", err)
	}
	pub.Close()
	if _, err := pub.Next(ctx); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("next on a closed topic: %v", err)
	}
	if err := pub.Publish(ctx, []byte("x")); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("publish on a closed topic: %v", err)
	}
	join(t, a, "news") // closed, it can be joined again
}

// TestGossipForwarding: gossip crosses hosts that are not connected
// directly, From naming the neighbour that forwarded it, and each host
// gets a message once however many paths lead to it.
func TestGossipForwarding(t *testing.T) {
	n := newNet(t, memnet.Options{Seed: 5, Latency: time.Millisecond, Jitter: time.Millisecond})
	// a — b — c, and a — d — c: two paths from a to c.
	a, b, c, d := newHost(t, n, nil), newHost(t, n, nil), newHost(t, n, nil), newHost(t, n, nil)
	connect(t, a, b)
	connect(t, b, c)
	connect(t, a, d)
	connect(t, d, c)
	pub := join(t, a, "t")
	inB, inC, inD := read(t, join(t, b, "t")), read(t, join(t, c, "t")), read(t, join(t, d, "t"))
	for i := range 20 {
		if err := pub.Publish(context.Background(), fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every message everywhere", func() bool { return inB.len() == 20 && inC.len() == 20 && inD.len() == 20 })
	never(t, "a message delivered twice", func() bool { return inC.len() > 20 || inB.len() > 20 || inD.len() > 20 })
	for _, p := range inC.from() {
		if p != b.ID() && p != d.ID() {
			t.Fatalf("c got a message from %s, which is not its neighbour", p)
		}
	}
	inC.mu.Lock()
	for _, m := range inC.msgs {
		if m.Author != a.ID() {
			t.Errorf("c got %q by %q, want its author a %s", m.Data, m.Author, a.ID())
		}
	}
	inC.mu.Unlock()
	got := inC.data()
	slices.Sort(got)
	if got = slices.Compact(got); len(got) != 20 {
		t.Errorf("c got %d distinct messages", len(got))
	}
}

// TestGossipDrop: a link's drop probability loses messages; which ones
// is a function of the seed, the same on a network made again with it.
func TestGossipDrop(t *testing.T) {
	const msgs = 200
	run := func(seed uint64) (received []string, st memnet.Stats) {
		n := newNet(t, memnet.Options{Seed: seed})
		a, b := newHost(t, n, nil), newHost(t, n, nil)
		n.SetDrop(a.ID(), b.ID(), 0.5)
		connect(t, a, b)
		pub := join(t, a, "t")
		in := read(t, join(t, b, "t"))
		for i := range msgs {
			if err := pub.Publish(context.Background(), fmt.Appendf(nil, "m%03d", i)); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, "every message sent and not dropped delivered", func() bool {
			st = n.Stats()
			return st.GossipSent == msgs && uint64(in.len()) == st.GossipSent-st.GossipDropped
		})
		got := in.data()
		slices.Sort(got)
		return got, st
	}
	first, st := run(7)
	if len(first) == 0 || len(first) == msgs {
		t.Fatalf("%d of %d messages arrived with a drop probability of 0.5", len(first), msgs)
	}
	if st.GossipDropped != uint64(msgs-len(first)) {
		t.Errorf("stats %+v, %d received", st, len(first))
	}
	if again, _ := run(7); !slices.Equal(again, first) {
		t.Errorf("the same seed lost other messages: %d then %d arrived", len(first), len(again))
	}
	if other, _ := run(8); slices.Equal(other, first) {
		t.Error("another seed lost the same messages")
	}
}

// TestGossipCut: a partition stops gossip across it; within each side it
// goes on.
func TestGossipCut(t *testing.T) {
	n := newNet(t, memnet.Options{})
	a, b, c := newHost(t, n, nil), newHost(t, n, nil), newHost(t, n, nil)
	connect(t, a, b)
	connect(t, a, c)
	pub := join(t, a, "t")
	inB, inC := read(t, join(t, b, "t")), read(t, join(t, c, "t"))
	n.Partition([]mesh.PeerID{a.ID(), b.ID()})
	if err := pub.Publish(context.Background(), []byte("x")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b to get the message", func() bool { return inB.len() == 1 })
	never(t, "a message crossed the partition", func() bool { return inC.len() > 0 })
}
