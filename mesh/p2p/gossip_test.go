package p2p

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

const warmupPrefix = "warmup-"

// join joins the test topic on h.
func join(t *testing.T, h *Host) mesh.Topic {
	t.Helper()
	tp, err := h.Join(topicName)
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	return tp
}

// warmUp publishes distinct warm-up messages on from until to receives one:
// the gossip mesh forms at the routers' heartbeats, and a message published
// before that reaches nobody.
func warmUp(t *testing.T, from, to mesh.Topic) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(waitFor)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("gossip mesh did not form")
		}
		if err := from.Publish(ctx, fmt.Appendf(nil, "%s%d", warmupPrefix, i)); err != nil {
			t.Fatalf("warm-up publish: %v", err)
		}
		m, ok, err := nextWithin(to, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if ok && strings.HasPrefix(string(m.Data), warmupPrefix) {
			return
		}
		if ok {
			t.Fatalf("unexpected message %q during warm-up", m.Data)
		}
	}
}

// recv returns the next message that is not a warm-up one, or ok false if
// none comes within d.
func recv(t *testing.T, tp mesh.Topic, d time.Duration) (mesh.Message, bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return mesh.Message{}, false
		}
		m, ok, err := nextWithin(tp, left)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if !ok {
			return mesh.Message{}, false
		}
		if !strings.HasPrefix(string(m.Data), warmupPrefix) {
			return m, true
		}
	}
}

// expect reads tp until want arrives, failing on any other message.
func expect(t *testing.T, tp mesh.Topic, want string) mesh.Message {
	t.Helper()
	m, ok := recv(t, tp, waitFor)
	if !ok {
		t.Fatalf("message %q did not arrive", want)
	}
	if string(m.Data) != want {
		t.Fatalf("got message %q, want %q", m.Data, want)
	}
	return m
}

// quiet checks that tp receives nothing but warm-up messages for a while.
func quiet(t *testing.T, tp mesh.Topic, why string) {
	t.Helper()
	if m, ok := recv(t, tp, quietFor); ok {
		t.Fatalf("%s: got %q from %s", why, m.Data, m.From)
	}
}

func publish(t *testing.T, tp mesh.Topic, data string) {
	t.Helper()
	if err := tp.Publish(context.Background(), []byte(data)); err != nil {
		t.Fatalf("Publish(%q): %v", data, err)
	}
}

// TestGossipLine: A-B-C in a line, all admitted. A message from A reaches C
// through B, signed by A, once however often A publishes it; the same data
// published by B is B's message, a second one.
func TestGossipLine(t *testing.T) {
	a := newTestHost(t, newGate(true))
	b := newTestHost(t, newGate(true))
	c := newTestHost(t, newGate(true))
	connect(t, a, b)
	connect(t, b, c)
	ta, tb, tc := join(t, a), join(t, b), join(t, c)
	warmUp(t, ta, tc)

	// A raw subscription on C shows the wire message.
	raw, err := c.topics[topicName].t.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Cancel()

	publish(t, ta, "m1")
	m := expect(t, tc, "m1")
	if m.From != b.ID() || m.Author != a.ID() {
		t.Fatalf("From = %s, Author = %s; want the forwarder B %s and the author A %s", m.From, m.Author, b.ID(), a.ID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for {
		rm, err := raw.Next(ctx)
		if err != nil {
			t.Fatalf("raw Next: %v", err)
		}
		if strings.HasPrefix(string(rm.Data), warmupPrefix) {
			continue
		}
		if string(rm.Data) != "m1" {
			t.Fatalf("raw message %q, want m1", rm.Data)
		}
		if rm.GetFrom() != a.host.ID() || rm.Signature == nil {
			t.Fatalf("message not signed by A: from %s signature %x", rm.GetFrom(), rm.Signature)
		}
		break
	}
	expect(t, tb, "m1")

	// The same data, published twice by A, is one message; published by
	// B too, it is B's, a second message.
	publish(t, ta, "m2")
	publish(t, ta, "m2")
	expect(t, tb, "m2")
	publish(t, tb, "m2")
	publish(t, ta, "m3")
	var got []string
	authors := map[mesh.PeerID]int{}
	deadline := time.Now().Add(waitFor)
	for !contains(got, "m3") && time.Now().Before(deadline) {
		if m, ok := recv(t, tc, time.Until(deadline)); ok {
			got = append(got, string(m.Data))
			if string(m.Data) == "m2" {
				authors[m.Author]++
			}
		}
	}
	if m, ok := recv(t, tc, quietFor); ok {
		got = append(got, string(m.Data))
		if string(m.Data) == "m2" {
			authors[m.Author]++
		}
	}
	if count(got, "m2") != 2 || count(got, "m3") != 1 || len(got) != 3 || authors[a.ID()] != 1 || authors[b.ID()] != 1 {
		t.Fatalf("C received %q (m2 by %v), want m2 once by A and once by B, m3 once", got, authors)
	}

	// A never reads its own messages back (B's m2 is B's).
	if m := expect(t, ta, "m2"); m.Author != b.ID() {
		t.Fatalf("A read m2 by %s, want B's", m.Author)
	}
	quiet(t, ta, "A's Next returned a message")
}

func contains(l []string, s string) bool { return count(l, s) > 0 }

func count(l []string, s string) int {
	n := 0
	for _, x := range l {
		if x == s {
			n++
		}
	}
	return n
}

// TestGossipAdmission: D is connected to A and subscribed, but A does not
// admit it: nothing flows either way until A's Gate admits D.
func TestGossipAdmission(t *testing.T) {
	gateA := newGate(false)
	a := newTestHost(t, gateA)
	b := newTestHost(t, newGate(true))
	d := newTestHost(t, newGate(true)) // D would gladly talk to A
	gateA.admit(b.ID(), true)
	connect(t, a, b)
	connect(t, d, a)
	ta, tb, td := join(t, a), join(t, b), join(t, d)
	warmUp(t, ta, tb)

	publish(t, ta, "for members")
	expect(t, tb, "for members")
	quiet(t, td, "a peer not admitted received gossip")

	publish(t, td, "from outside")
	quiet(t, ta, "a message from a peer not admitted was delivered")

	// Admitted, D is grafted at A's next heartbeat: A's later messages
	// reach it, and its messages reach A.
	gateA.admit(d.ID(), true)
	deadline := time.Now().Add(waitFor)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("D, once admitted, received nothing")
		}
		publish(t, ta, fmt.Sprintf("after-%d", i))
		m, ok := recv(t, td, 500*time.Millisecond)
		if ok && strings.HasPrefix(string(m.Data), "after-") {
			if m.From != a.ID() {
				t.Fatalf("From = %s, want A", m.From)
			}
			break
		}
		if ok && string(m.Data) != "for members" { // gossip may still offer it
			t.Fatalf("D received %q", m.Data)
		}
	}
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("A received nothing from D once D was admitted")
		}
		publish(t, td, fmt.Sprintf("from-d-%d", i))
		m, ok := recv(t, ta, 500*time.Millisecond)
		if ok && strings.HasPrefix(string(m.Data), "from-d-") {
			if m.From != d.ID() {
				t.Fatalf("From = %s, want D", m.From)
			}
			break
		}
		if ok {
			t.Fatalf("A received %q", m.Data)
		}
	}
}

// TestGossipOversize: Publish refuses data over MaxMessage, and a peer
// with a smaller MaxMessage refuses what a laxer peer sends it.
func TestGossipOversize(t *testing.T) {
	s := newTestHost(t, newGate(true))
	ro := testOptions(t, newGate(true))
	ro.MaxMessage = 1024
	r := startHost(t, ro)
	connect(t, s, r)
	ts, tr := join(t, s), join(t, r)

	err := tr.Publish(context.Background(), make([]byte, 1025))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "1025") {
		t.Fatalf("Publish(1025 bytes) = %v, want ErrTooLarge naming the size", err)
	}

	warmUp(t, ts, tr)
	big := strings.Repeat("x", 2048)
	publish(t, ts, big) // within s's limit, over r's
	publish(t, ts, "small")
	expect(t, tr, "small")
	quiet(t, tr, "an oversize message was delivered")
}

func TestTopicLifecycle(t *testing.T) {
	h := newTestHost(t, newGate(true))
	tp, err := h.Join(topicName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Join(topicName); !errors.Is(err, ErrJoined) {
		t.Fatalf("second Join = %v, want ErrJoined", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := tp.Next(context.Background())
		done <- err
	}()
	if err := tp.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Close = %v, want ErrClosed", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Next did not return after Close")
	}
	if err := tp.Publish(context.Background(), []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
	tp2, err := h.Join(topicName) // closed, it can be joined again
	if err != nil {
		t.Fatalf("Join after Close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tp2.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after the host closed = %v, want ErrClosed", err)
	}
	if _, err := h.Join("other"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Join after the host closed = %v, want ErrClosed", err)
	}
}
