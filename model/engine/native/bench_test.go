package native

import (
	"context"
	"sync"
	"testing"
)

var peak struct {
	once sync.Once
	rate float64
}

// peakGFLOPS is the matmul kernel's measured rate, the reference for the
// engine benchmarks' "%peak".
func peakGFLOPS(b *testing.B) float64 {
	peak.once.Do(func() {
		bc, _, _ := BenchConfig{}.withDefaults()
		peak.rate = matmulRate(bc.Threads, bc.Now)
	})
	return peak.rate
}

func benchEngine(b *testing.B, bc BenchConfig, train bool) {
	pk := peakGFLOPS(b)
	if train {
		bc.GenTokens = -1
	} else {
		bc.Steps = -1
	}
	var tok, gf float64
	for b.Loop() {
		r, err := Bench(context.Background(), bc)
		if err != nil {
			b.Fatal(err)
		}
		if train {
			tok, gf = r.TrainTokensPerSec, r.TrainGFLOPS
		} else {
			tok, gf = r.GenTokensPerSec, r.GenGFLOPS
		}
	}
	b.ReportMetric(tok, "tok/s")
	b.ReportMetric(gf, "GFLOP/s")
	b.ReportMetric(100*gf/pk, "%peak")
	b.ReportMetric(pk, "peak-GFLOP/s")
}

// The tiny model: vocab 512, hidden 64, 2 layers; a batch of 4 × 64 tokens.
func BenchmarkTrainTiny(b *testing.B) { benchEngine(b, BenchConfig{Model: "tiny"}, true) }

func BenchmarkGenerateTiny(b *testing.B) {
	benchEngine(b, BenchConfig{Model: "tiny", GenTokens: 64}, false)
}

// The small model: Qwen2.5-0.5B's shape (vocab 151936) with 2 layers; a
// batch of 2 × 64 tokens.
func BenchmarkTrainSmall(b *testing.B) {
	benchEngine(b, BenchConfig{Model: "small", Seqs: 2, SeqLen: 64, Steps: 1}, true)
}

func BenchmarkGenerateSmall(b *testing.B) {
	benchEngine(b, BenchConfig{Model: "small", GenTokens: 16}, false)
}

func TestBench(t *testing.T) {
	r, err := Bench(context.Background(), BenchConfig{Seqs: 2, SeqLen: 8, Steps: 1, GenTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !(r.MatmulGFLOPS > 0 && r.GonumGFLOPS > 0 && r.TrainTokensPerSec > 0 && r.GenTokensPerSec > 0 && r.TrainGFLOPS > 0) {
		t.Fatalf("result %+v", r)
	}
	if _, err := Bench(context.Background(), BenchConfig{Model: "huge"}); err == nil {
		t.Fatal("unknown model accepted")
	}
}
