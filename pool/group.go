package pool

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// groupCommit commits the synced writes of concurrent writers together: a
// writer queues its batch; the first one finding no commit running leads:
// it takes the queue, applies the queued batches to one batch, commits that
// with a single synced write and releases the others with its result. A
// writer that queued while a commit ran is handed the lead of the next one,
// so the queue is committed as soon as the disk is free, and nobody waits
// for more than the commit in progress and its own. Every writer still
// returns only after a sync that covers its batch.
//
// Pebble's commit pipeline already shares one WAL sync among the batches
// waiting for it; what grouping here adds is one trip through that pipeline
// (sequence numbers, the WAL record, the memtable, the wake-ups) for the
// whole group instead of one per writer, which is what concurrent writers
// of small steps spend their time on.
type groupCommit struct {
	mu      sync.Mutex
	queue   []*groupWaiter
	leading bool
	// commits counts the batches committed into Pebble (for tests).
	commits int
}

type groupWaiter struct {
	b    *pebble.Batch
	done chan groupResult // buffered: the leader never waits on it
}

type groupResult struct {
	err  error
	lead bool // take the lead of the next commit instead
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
	g.queue = append(g.queue, w)
	if g.leading {
		g.mu.Unlock()
		if r := <-w.done; !r.lead {
			return r.err
		}
	} else {
		g.leading = true
		g.mu.Unlock()
	}
	return in.lead(w)
}

// lead commits the writers at the head of the queue (self among them) and
// passes the lead on to the first writer left queued, if any.
func (in *instance) lead(self *groupWaiter) error {
	g := &in.group
	g.mu.Lock()
	n, size := 0, 0
	for n < len(g.queue) && (n == 0 || size+len(g.queue[n].b.Repr()) <= groupMaxBytes) {
		size += len(g.queue[n].b.Repr())
		n++
	}
	batch := g.queue[:n:n]
	g.queue = append([]*groupWaiter(nil), g.queue[n:]...)
	g.commits++
	g.mu.Unlock()

	err := in.commitGroup(batch)

	g.mu.Lock()
	if len(g.queue) > 0 {
		g.queue[0].done <- groupResult{lead: true}
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	mine := err
	for _, w := range batch {
		if w != self {
			w.done <- groupResult{err: err}
		}
	}
	return mine
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
