package memnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Join joins a gossip topic and subscribes to it. A topic can be joined
// once per Host at a time (ErrJoined); Close it to join it again.
func (h *Host) Join(name string) (mesh.Topic, error) {
	if name == "" {
		return nil, fmt.Errorf("memnet: join: empty topic name")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.running() {
		return nil, fmt.Errorf("%w: host %s", ErrClosed, h.id)
	}
	if _, ok := h.topics[name]; ok {
		return nil, fmt.Errorf("%w: %s", ErrJoined, name)
	}
	t := &topic{h: h, name: name, ch: make(chan mesh.Message, TopicBuffer), done: make(chan struct{})}
	h.topics[name] = t
	return t, nil
}

// topic is a joined gossip topic.
type topic struct {
	h    *Host
	name string
	ch   chan mesh.Message
	done chan struct{} // closed by Close, or when the host stops
	once sync.Once
}

// Publish sends data to the topic's admitted, subscribed neighbours, who
// forward it to theirs. Data larger than Options.MaxMessage is refused
// (ErrTooLarge). Publishing data this host has seen on the topic within
// Options.SeenTTL does nothing.
func (t *topic) Publish(ctx context.Context, data []byte) error {
	if max := t.h.n.o.MaxMessage; len(data) > max {
		return fmt.Errorf("%w: %d bytes on %s, at most %d", ErrTooLarge, len(data), t.name, max)
	}
	if isClosed(t.done) || !t.h.running() {
		return fmt.Errorf("%w: topic %s", ErrClosed, t.name)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	id := messageID(t.name, t.h.id, data)
	t.h.mu.Lock()
	fresh := t.h.seeLocked(id)
	t.h.mu.Unlock()
	if fresh {
		t.h.forward(t.name, id, t.h.id, bytes.Clone(data), "")
	}
	return nil
}

// Next returns the next message from another peer, blocking until one
// arrives, ctx is done or the topic closes (ErrClosed). From is the
// neighbour that forwarded it, Author the host that published it.
func (t *topic) Next(ctx context.Context) (mesh.Message, error) {
	if isClosed(t.done) {
		return mesh.Message{}, fmt.Errorf("%w: topic %s", ErrClosed, t.name)
	}
	select {
	case m := <-t.ch:
		return m, nil
	case <-t.done:
		return mesh.Message{}, fmt.Errorf("%w: topic %s", ErrClosed, t.name)
	case <-ctx.Done():
		return mesh.Message{}, ctx.Err()
	}
}

// Close leaves the topic: Next fails with ErrClosed, and no more
// messages come to this host on it (nor through it).
func (t *topic) Close() error {
	t.h.mu.Lock()
	if t.h.topics[t.name] == t {
		delete(t.h.topics, t.name)
	}
	t.h.mu.Unlock()
	t.once.Do(func() { close(t.done) })
	return nil
}

// deliver hands a message to Next, or drops it if TopicBuffer messages
// are waiting already.
func (t *topic) deliver(m mesh.Message) {
	if isClosed(t.done) {
		return
	}
	select {
	case t.ch <- m:
		t.h.n.stats.delivered.Add(1)
	default:
		t.h.log.Debug("gossip dropped: topic buffer full", "topic", t.name, "from", m.From)
	}
}

// closeTopics closes every topic of a host that stopped.
func (h *Host) closeTopics() {
	h.mu.Lock()
	topics := make([]*topic, 0, len(h.topics))
	for _, t := range h.topics {
		topics = append(topics, t)
	}
	h.topics = map[string]*topic{}
	h.mu.Unlock()
	for _, t := range topics {
		t.once.Do(func() { close(t.done) })
	}
}

// messageID identifies a message by its topic, author and data, as
// mesh/p2p does: sha256(topic, 0, uvarint length of the author, the
// author, data) (mesh/p2p hashes the author's id in its binary form).
func messageID(topic string, author mesh.PeerID, data []byte) string {
	d := sha256.New()
	d.Write([]byte(topic))
	d.Write([]byte{0})
	d.Write(binary.AppendUvarint(nil, uint64(len(author))))
	d.Write([]byte(author))
	d.Write(data)
	return string(d.Sum(nil))
}

// seeLocked records a message id and reports whether it is new (not seen
// within SeenTTL); h.mu is held.
func (h *Host) seeLocked(id string) bool {
	now := time.Now()
	ttl := h.n.o.SeenTTL
	if now.After(h.sweep) {
		for k, at := range h.seen {
			if now.Sub(at) >= ttl {
				delete(h.seen, k)
			}
		}
		h.sweep = now.Add(ttl / 2)
	}
	if at, ok := h.seen[id]; ok && now.Sub(at) < ttl {
		return false
	}
	h.seen[id] = now
	return true
}

// forward sends a message to every connected neighbour but except that
// is subscribed to the topic and that this host admits, each after its
// link's delay unless the link drops it.
func (h *Host) forward(topic, id string, author mesh.PeerID, data []byte, except mesh.PeerID) {
	type hop struct {
		c    *conn
		to   *Host
		drop float64
	}
	n := h.n
	var hops []hop
	n.mu.Lock()
	for p, c := range n.conns[h.id] {
		if p == except {
			continue
		}
		to := c.other(h)
		to.mu.Lock()
		_, subscribed := to.topics[topic]
		to.mu.Unlock()
		if subscribed {
			hops = append(hops, hop{c, to, n.dropLocked(h.id, p)})
		}
	}
	n.mu.Unlock()
	now := time.Now()
	for _, o := range hops {
		if h.gate.Blocked(o.to.id) || !h.gate.Admitted(o.to.id) {
			continue
		}
		n.stats.sent.Add(1)
		delay := n.o.Latency
		if o.drop > 0 || n.o.Jitter > 0 {
			// The drop is drawn first, always, so that a link's delays
			// do not change with its drop probability.
			r := n.draw("gossip", h.id, o.to.id, id, 0)
			if r.Float64() < o.drop {
				n.stats.dropped.Add(1)
				h.log.Debug("gossip dropped on the link", "to", o.to.id, "topic", topic)
				continue
			}
			delay = n.delay(r)
		}
		o.c.send(h, delivery{at: now.Add(delay), topic: topic, id: id, author: author, data: data})
	}
}

// receive takes a message a neighbour sent over c: from an admitted peer,
// on a topic this host has joined, the first time, it is delivered to the
// topic and forwarded.
func (h *Host) receive(c *conn, from *Host, d delivery) {
	if c.isCut() || !h.running() {
		return
	}
	if h.gate.Blocked(from.id) || !h.gate.Admitted(from.id) {
		h.log.Debug("gossip from a peer not admitted: dropped", "from", from.id, "topic", d.topic)
		return
	}
	h.mu.Lock()
	t := h.topics[d.topic]
	fresh := t != nil && h.seeLocked(d.id)
	h.mu.Unlock()
	if !fresh {
		return
	}
	if d.author != h.id {
		t.deliver(mesh.Message{Data: bytes.Clone(d.data), From: from.id, Author: d.author})
	}
	h.forward(d.topic, d.id, d.author, d.data, from.id)
}
