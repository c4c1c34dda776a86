package learn

import (
	"context"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// BenchmarkTrainTiny measures one Train call of 32 recorded, rewarded steps
// on the tiny native model (building samples, recomputing missing old
// log-probs, reference log-probs, advantages, one optimizer step).
func BenchmarkTrainTiny(b *testing.B) {
	eng, tok := tinyEngine(b, 1)
	r, err := ChatML()
	if err != nil {
		b.Fatal(err)
	}
	bld := sample.NewBuilder(tok, r, sample.Options{})
	sc := &scenario{eng: eng, tok: tok, b: bld}
	sc.o, err = PreferenceOptions{}.withDefaults()
	if err != nil {
		b.Fatal(err)
	}
	if id, ok := tok.TokenID("<|im_end|>"); ok {
		sc.stop = []int{id}
	}
	if err := sc.prepare(); err != nil {
		b.Fatal(err)
	}
	steps, _, err := sc.rollout(context.Background(), 1, 0)
	if err != nil {
		b.Fatal(err)
	}
	l, err := New(eng, bld, Options{Engine: engine.Recipe{LR: 1e-6}, Staleness: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	var tokens int
	b.ResetTimer()
	for b.Loop() {
		rep, err := l.Train(context.Background(), steps)
		if err != nil || rep.Used != len(steps) {
			b.Fatalf("%+v %v", rep, err)
		}
		tokens = rep.Tokens
	}
	b.ReportMetric(float64(len(steps))*float64(b.N)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "trained-tokens/s")
}
