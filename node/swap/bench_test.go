package swap

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

func p50(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkClawmeshSwap measures a swap on a real `clawmesh serve` of the
// tiny model, Load then Warm of a new version, against its baseline in the
// same run: the warm-up alone (one one-token completion). The ratio says
// what a swap costs over the request that proves it.
func BenchmarkClawmeshSwap(b *testing.B) {
	ctx := ctxT(b)
	s := startTinyServe(b, "")
	d, err := New("clawmesh", Config{Upstream: s.URL})
	if err != nil {
		b.Fatal(err)
	}
	dir := s.adapter(b)
	t0, err := d.Load(ctx, "v0", dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Warm(ctx, t0); err != nil {
		b.Fatal(err)
	}
	cur := t0
	var warm, swap []time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := d.Warm(ctx, cur); err != nil {
			b.Fatal(err)
		}
		warm = append(warm, time.Since(start))

		start = time.Now()
		t, err := d.Load(ctx, fmt.Sprintf("v%d", i+1), dir)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Warm(ctx, t); err != nil {
			b.Fatal(err)
		}
		swap = append(swap, time.Since(start))
		cur = t
	}
	b.StopTimer()
	w, sw := p50(warm), p50(swap)
	b.ReportMetric(float64(w.Microseconds()), "warm-p50-µs")
	b.ReportMetric(float64(sw.Microseconds()), "swap-p50-µs")
	b.ReportMetric(float64(sw)/float64(w), "swap/warm")
}
