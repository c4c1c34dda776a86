package memnet

import (
	"testing"
	"time"
)

// TestDraws: every draw is a function of the seed and of what is drawn,
// and delays stay within Latency and Latency+Jitter.
func TestDraws(t *testing.T) {
	o := Options{Seed: 11, Latency: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}
	n1, n2, other := NewNetwork(o), NewNetwork(o), NewNetwork(Options{Seed: 12, Latency: o.Latency, Jitter: o.Jitter})
	var same, differs int
	for k := range uint64(100) {
		d1 := n1.delay(n1.draw("stream", "a", "b", "/p", k))
		d2 := n2.delay(n2.draw("stream", "a", "b", "/p", k))
		if d1 != d2 {
			t.Fatalf("draw %d: %s on one network, %s on another of the same seed", k, d1, d2)
		}
		if d1 < o.Latency || d1 >= o.Latency+o.Jitter {
			t.Fatalf("draw %d: delay %s outside [%s, %s)", k, d1, o.Latency, o.Latency+o.Jitter)
		}
		if d1 == other.delay(other.draw("stream", "a", "b", "/p", k)) {
			same++
		}
		if d1 != n1.delay(n1.draw("stream", "b", "a", "/p", k)) {
			differs++
		}
	}
	// Jitter is drawn in nanoseconds: equal delays from independent
	// draws are all but impossible.
	if same > 2 {
		t.Errorf("another seed drew the same delay %d times in 100", same)
	}
	if differs < 98 {
		t.Errorf("the reverse link drew another delay only %d times in 100", differs)
	}
}
