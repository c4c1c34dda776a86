package memnet

import (
	"sync"

	"github.com/clawmesh/clawmesh/mesh"
)

// notifier calls a Host's Notify callbacks: the network pushes changes
// into an unbounded queue (never blocking, under its lock), and one
// goroutine calls the callbacks, in order, for each change of a peer
// between up and down.
type notifier struct {
	wake chan struct{} // capacity 1: the queue has something
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	stopped bool
	fns     []func(mesh.PeerID, bool)
	queue   []change

	up map[mesh.PeerID]bool // dispatcher only
}

type change struct {
	p  mesh.PeerID
	up bool
}

func newNotifier() *notifier {
	n := &notifier{
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
		up:   map[mesh.PeerID]bool{},
	}
	go n.dispatch()
	return n
}

func (n *notifier) add(fn func(mesh.PeerID, bool)) {
	n.mu.Lock()
	n.fns = append(n.fns, fn)
	n.mu.Unlock()
}

// push queues a change; after close it does nothing.
func (n *notifier) push(p mesh.PeerID, up bool) {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return
	}
	n.queue = append(n.queue, change{p, up})
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *notifier) dispatch() {
	defer close(n.done)
	for {
		select {
		case <-n.wake:
		case <-n.stop:
			return
		}
		for {
			n.mu.Lock()
			if len(n.queue) == 0 {
				n.queue = nil
				n.mu.Unlock()
				break
			}
			e := n.queue[0]
			n.queue = n.queue[1:]
			fns := n.fns
			n.mu.Unlock()
			if e.up == n.up[e.p] {
				continue
			}
			if e.up {
				n.up[e.p] = true
			} else {
				delete(n.up, e.p)
			}
			for _, fn := range fns {
				fn(e.p, e.up)
			}
			select {
			case <-n.stop:
				return
			default:
			}
		}
	}
}

// close stops the dispatcher and waits for a callback in flight: no
// callback is called after it returns.
func (n *notifier) close() {
	n.mu.Lock()
	if !n.stopped {
		n.stopped = true
		n.queue = nil
		close(n.stop)
	}
	n.mu.Unlock()
	<-n.done
}
