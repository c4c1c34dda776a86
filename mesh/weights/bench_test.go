package weights

import (
	"context"
	"os"
	"testing"
)

// TestBenchRuns runs the benchmark small: it must measure every part.
func TestBenchRuns(t *testing.T) {
	r, err := Bench(context.Background(), BenchOptions{Size: 16<<20 + 5, Fetchers: 4, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Ours.MBps <= 0 || r.Bare.MBps <= 0 || r.TLS.MBps <= 0 || r.OverHost.MBps <= 0 || r.HostRatio <= 0 || len(r.FanOut) != 3 {
		t.Fatalf("report %+v", r)
	}
	for _, f := range r.FanOut {
		// Alone, the trainer serves every fetcher the whole bundle; with
		// re-serving, only the first wave.
		if want := float64(f.Fetchers) * float64(r.Bytes) / (1 << 20); f.DirectTrainerMB < want*0.999 {
			t.Errorf("%d fetchers: the trainer served %.1f MiB, want %.1f", f.Fetchers, f.DirectTrainerMB, want)
		}
		if f.Fetchers > 1 && f.ReserveTrainerMB >= f.DirectTrainerMB {
			t.Errorf("%d fetchers: re-serving did not spare the trainer (%.1f vs %.1f MiB)", f.Fetchers, f.ReserveTrainerMB, f.DirectTrainerMB)
		}
	}
	if c := r.Certify; c.VoteMicros <= 0 || len(c.Verify) != 4 || c.Verify[0].Voters != 1 || c.Verify[3].Voters != 7 || c.Verify[3].Micros <= 0 {
		t.Errorf("certification's cost %+v", c)
	}
	r.Print(os.Stderr)
}

// BenchmarkWeights fetches a 64 MiB bundle through the protocol and with
// bare quic-go.
func BenchmarkWeights(b *testing.B) {
	for range b.N {
		r, err := Bench(context.Background(), BenchOptions{Fetchers: 1, Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.Ours.MBps, "MiB/s")
		b.ReportMetric(r.Ratio, "x-bare-quic")
		b.ReportMetric(r.Ours.CPUPerGB, "cpu-s/GB")
		b.ReportMetric(r.HostRatio, "x-over-host")
	}
}
