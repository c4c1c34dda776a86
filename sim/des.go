package sim

import (
	"container/heap"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"
)

// event is one thing that happens at a virtual time. Events at the same
// time run in the order they were scheduled (seq), so a run is a pure
// function of its seed.
type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

// clock is the discrete-event core: a virtual clock and the queue of
// events still to run.
type clock struct {
	now    time.Duration
	seq    uint64
	q      eventQueue
	events uint64
}

// at schedules fn at virtual time t (now if t is in the past).
func (c *clock) at(t time.Duration, fn func()) {
	if t < c.now {
		t = c.now
	}
	c.seq++
	heap.Push(&c.q, &event{at: t, seq: c.seq, fn: fn})
}

// after schedules fn d from now.
func (c *clock) after(d time.Duration, fn func()) { c.at(c.now+d, fn) }

// step runs the next event; false when none is left or the next one is
// past until.
func (c *clock) step(until time.Duration) bool {
	if len(c.q) == 0 || c.q[0].at > until {
		return false
	}
	e := heap.Pop(&c.q).(*event)
	c.now = e.at
	c.events++
	e.fn()
	return true
}

// stream returns the random stream for one purpose: PCG seeded from the
// run's seed and the purpose's name, so that a draw added for one purpose
// leaves every other purpose's draws as they were.
func stream(seed uint64, purpose string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(purpose))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// logUniform draws from [lo, hi] with a uniform logarithm.
func logUniform(r *rand.Rand, lo, hi float64) float64 {
	return math.Exp(math.Log(lo) + r.Float64()*(math.Log(hi)-math.Log(lo)))
}

// expDur draws an exponential duration of the given mean.
func expDur(r *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(r.ExpFloat64() * float64(mean))
}

// seconds converts a virtual duration to seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }
