package chunks

import (
	"fmt"
	"testing"
)

// BenchmarkVerifyCertified is a device's check of a certified manifest
// carrying the votes of every voter of its set.
func BenchmarkVerifyCertified(b *testing.B) {
	w := newWorld(b)
	for _, n := range []int{1, 3, 5, 7} {
		b.Run(fmt.Sprintf("voters=%d", n), func(b *testing.B) {
			ps, vs := w.voters(b, uint64(n), n)
			m, ok := w.certified(b, vs, ps, 5, 2, 40)
			if !ok {
				b.Fatal("no quorum")
			}
			pub := w.pub()
			for b.Loop() {
				if err := m.VerifyCertified(pub, vs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVoteFor is one voter's vote for a version.
func BenchmarkVoteFor(b *testing.B) {
	w := newWorld(b)
	ps, vs := w.voters(b, 1, 3)
	m, _ := w.certified(b, vs, ps, 5, 2, 40)
	for b.Loop() {
		if _, err := m.VoteFor(ps[0].key, string(ps[0].id), vs); err != nil {
			b.Fatal(err)
		}
	}
}
