package p2p

import (
	"sync"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/mesh"
)

// notifier turns libp2p's connectedness events into the mesh's up/down
// calls. The swarm emits its events from one goroutine, and blocks when a
// subscriber does not read: so one goroutine only moves events into an
// unbounded queue, and another calls the callbacks, in order.
type notifier struct {
	sub  event.Subscription
	stop chan struct{}
	wake chan struct{} // capacity 1: the queue has something
	wg   sync.WaitGroup

	mu    sync.Mutex
	fns   []func(mesh.PeerID, bool)
	queue []event.EvtPeerConnectednessChanged

	// first is called before the registered callbacks, with the same
	// arguments (the peer cache's bookkeeping).
	first func(peer.ID, bool)
	// up is whether each peer was last reported up; dispatcher-only.
	up map[peer.ID]bool
}

func newNotifier(bus event.Bus, first func(peer.ID, bool)) (*notifier, error) {
	sub, err := bus.Subscribe(new(event.EvtPeerConnectednessChanged))
	if err != nil {
		return nil, err
	}
	n := &notifier{
		sub:   sub,
		stop:  make(chan struct{}),
		wake:  make(chan struct{}, 1),
		first: first,
		up:    make(map[peer.ID]bool),
	}
	n.wg.Add(2)
	go n.read()
	go n.dispatch()
	return n, nil
}

func (n *notifier) add(fn func(mesh.PeerID, bool)) {
	n.mu.Lock()
	n.fns = append(n.fns, fn)
	n.mu.Unlock()
}

// read moves events from the subscription into the queue.
func (n *notifier) read() {
	defer n.wg.Done()
	for {
		select {
		case e, ok := <-n.sub.Out():
			if !ok {
				return
			}
			n.mu.Lock()
			n.queue = append(n.queue, e.(event.EvtPeerConnectednessChanged))
			n.mu.Unlock()
			select {
			case n.wake <- struct{}{}:
			default:
			}
		case <-n.stop:
			return
		}
	}
}

// dispatch calls the callbacks for each change of a peer between up (at
// least one connection, limited ones included) and down.
func (n *notifier) dispatch() {
	defer n.wg.Done()
	for {
		select {
		case <-n.wake:
		case <-n.stop:
			return
		}
		for {
			n.mu.Lock()
			if len(n.queue) == 0 {
				n.queue = nil // let a burst's backing array go
				n.mu.Unlock()
				break
			}
			e := n.queue[0]
			n.queue = n.queue[1:]
			fns := n.fns
			n.mu.Unlock()

			up := e.Connectedness == network.Connected || e.Connectedness == network.Limited
			if up == n.up[e.Peer] {
				continue
			}
			if up {
				n.up[e.Peer] = true
			} else {
				delete(n.up, e.Peer)
			}
			if n.first != nil {
				n.first(e.Peer, up)
			}
			for _, fn := range fns {
				fn(meshID(e.Peer), up)
			}
			select {
			case <-n.stop:
				return
			default:
			}
		}
	}
}

// close stops both goroutines and waits for a callback in flight; no
// callback is called after it returns.
func (n *notifier) close() {
	close(n.stop)
	_ = n.sub.Close()
	n.wg.Wait()
}
