package memnet

import (
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// conn is a connection between two hosts: the streams on it and a queue
// of gossip each way. Once cut, it stays cut: a new connection is a new
// conn.
type conn struct {
	a, b *Host
	done chan struct{} // closed when cut
	q    [2]linkQueue  // gossip a→b, b→a

	mu      sync.Mutex
	cut     bool
	streams map[*Stream]struct{} // by the opener's end
}

func newConn(a, b *Host) *conn {
	return &conn{a: a, b: b, done: make(chan struct{}), streams: map[*Stream]struct{}{}}
}

func (c *conn) other(h *Host) *Host {
	if h == c.a {
		return c.b
	}
	return c.a
}

// open registers a stream whose remote end is on remote, and runs start
// (under c.mu, so that no handler starts once the connection is cut or
// the host is gone). It reports false if the connection is cut or remote
// no longer runs.
func (c *conn) open(s *Stream, remote *Host, start func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut || remote.state.Load() != stateRunning {
		return false
	}
	c.streams[s] = struct{}{}
	start()
	return true
}

func (c *conn) remove(s *Stream) {
	c.mu.Lock()
	delete(c.streams, s)
	c.mu.Unlock()
}

// close cuts the connection: its streams reset with err, its gossip
// queues stop.
func (c *conn) close(err error) {
	c.mu.Lock()
	if c.cut {
		c.mu.Unlock()
		return
	}
	c.cut = true
	streams := c.streams
	c.streams = nil
	close(c.done)
	c.mu.Unlock()
	for s := range streams {
		s.reset(err)
	}
}

func (c *conn) isCut() bool { return isClosed(c.done) }

// linkQueue is the gossip on one direction of a connection, in order: one
// goroutine delivers it, started when the queue fills and ending when it
// empties (so an idle network runs no goroutine).
type linkQueue struct {
	mu      sync.Mutex
	items   []delivery
	running bool
}

// delivery is a gossip message on a link, due at at.
type delivery struct {
	at     time.Time
	topic  string
	id     string
	author mesh.PeerID // the host that published it
	data   []byte
}

// send queues d from one end of c to the other.
func (c *conn) send(from *Host, d delivery) {
	q := &c.q[0]
	if from == c.b {
		q = &c.q[1]
	}
	q.mu.Lock()
	q.items = append(q.items, d)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go c.drain(from, q)
	}
}

// drain delivers q's messages, each once it is due, until q is empty or
// the connection is cut.
func (c *conn) drain(from *Host, q *linkQueue) {
	to := c.other(from)
	for {
		q.mu.Lock()
		if len(q.items) == 0 || c.isCut() {
			q.items, q.running = nil, false
			q.mu.Unlock()
			return
		}
		d := q.items[0]
		q.items[0] = delivery{}
		q.items = q.items[1:]
		q.mu.Unlock()
		if wait := time.Until(d.at); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				continue
			}
		}
		to.receive(c, from, d)
	}
}
