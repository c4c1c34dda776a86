package pool

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// groupCommit commits the synced writes of concurrent writers together. Up
// to groupsInFlight commits run at once: a writer that finds fewer running
// commits its batch at once; otherwise it queues. A commit that ends hands
// what queued meanwhile (up to groupMaxBytes) to the first writer of the
// queue, which applies those batches to one batch, commits it with a single
// synced write and releases the others with its result. Every writer still
// returns only after a sync that covers its batch.
//
// Pebble's commit pipeline already shares one WAL sync among the batches
// waiting for it; what grouping here adds is one trip through that pipeline
// (sequence numbers, the WAL record, the memtable, the wake-ups) for many
// writers instead of one each. Two commits in flight rather than one keep
// what Pebble does for a pair of writers: the second one's record is
// written while the first one's sync runs, and its sync follows at once.
type groupCommit struct {
	mu       sync.Mutex
	queue    []*groupWaiter
	inFlight int // commits running
	// commits counts the batches committed into Pebble (for tests).
	commits int
}

// groupsInFlight is how many group commits run at once.
const groupsInFlight = 2

type groupWaiter struct {
	b    *pebble.Batch
	done chan groupResult // buffered: nobody waits to send on it
}

// groupResult releases a queued writer: with the commit's error, or with
// the group it is to commit (lead).
type groupResult struct {
	err  error
	lead []*groupWaiter
}

// groupMaxBytes bounds a group's batch: far below Pebble's large-batch
// threshold (half a memtable), beyond which a batch is flushed as its own
// memtable.
const groupMaxBytes = 512 << 10

// commitSync commits b synced, together with the batches of the writers
// committing at the same time.
func (in *instance) commitSync(b *pebble.Batch) error {
	w := &groupWaiter{b: b, done: make(chan groupResult, 1)}
	g := &in.group
	g.mu.Lock()
	if g.inFlight < groupsInFlight {
		// Nothing queues while fewer commits run (a commit that ends
		// hands the queue on), so this writer's group is itself.
		g.inFlight++
		g.commits++
		g.mu.Unlock()
		return in.lead(w, []*groupWaiter{w})
	}
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	r := <-w.done
	if r.lead == nil {
		return r.err
	}
	return in.lead(w, r.lead)
}

// lead commits group (self among them), then hands the next group of the
// queue to its first writer, or leaves the commit's place free.
func (in *instance) lead(self *groupWaiter, group []*groupWaiter) error {
	err := in.commitGroup(group)

	g := &in.group
	g.mu.Lock()
	if len(g.queue) > 0 {
		n, size := 0, 0
		for n < len(g.queue) && (n == 0 || size+len(g.queue[n].b.Repr()) <= groupMaxBytes) {
			size += len(g.queue[n].b.Repr())
			n++
		}
		next := g.queue[:n:n]
		g.queue = append([]*groupWaiter(nil), g.queue[n:]...)
		g.commits++
		next[0].done <- groupResult{lead: next}
	} else {
		g.inFlight--
	}
	g.mu.Unlock()
	for _, w := range group {
		if w != self {
			w.done <- groupResult{err: err}
		}
	}
	return err
}

// commitGroup commits the batches of ws as one synced batch.
func (in *instance) commitGroup(ws []*groupWaiter) error {
	if len(ws) == 1 {
		return in.commit(ws[0].b, pebble.Sync)
	}
	size := 0
	for _, w := range ws {
		size += len(w.b.Repr())
	}
	all := in.db.NewBatchWithSize(size)
	defer all.Close()
	for _, w := range ws {
		if err := all.Apply(w.b, nil); err != nil {
			return fmt.Errorf("group commit: %w", err)
		}
	}
	return in.commit(all, pebble.Sync)
}
