package verify_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer/verify"
)

// benchBatch is a 64-step batch sealed by a real device from copies of the
// recorded steps, scored by the five built-ins and the contact plugin.
func benchBatch(b *testing.B) (*device, []byte) {
	b.Helper()
	d := newDevice(b)
	var steps []*core.Step
	for i := 0; len(steps) < 64; i++ {
		for _, s := range recordedSteps(b) {
			s.ID = core.StepID(fmt.Sprintf("%s-%d", s.ID, i))
			s.SessionID = core.SessionID(fmt.Sprintf("%s-%d", s.SessionID, i))
			steps = append(steps, s)
		}
	}
	d.record(b, steps[:64]...)
	payload, _ := seal(b, d.out)
	return d, payload
}

// BenchmarkDecode is the cost a trainer pays for every batch anyway:
// decoding and checking its bytes (batch.Decode).
func BenchmarkDecode(b *testing.B) {
	_, payload := benchBatch(b)
	var steps int
	b.ResetTimer()
	for b.Loop() {
		bt, err := batch.Decode(payload, batch.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		steps = len(bt.Steps)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*steps), "ns/step")
	b.ReportMetric(float64(len(payload)), "bytes/batch")
}

// BenchmarkCheck is Check on the same batch, its modules cached: every
// step's combined reward, and the scores of 8 sampled steps replayed,
// each in a fresh instance (the default) or in reused ones.
func BenchmarkCheck(b *testing.B) {
	d, payload := benchBatch(b)
	bt, err := batch.Decode(payload, batch.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	fetch := func(ctx context.Context, from mesh.PeerID, hash string, max int64) ([]byte, error) {
		return d.runner.Module(hash)
	}
	for _, reuse := range []bool{false, true} {
		name := "fresh"
		if reuse {
			name = "reuse"
		}
		b.Run(name, func(b *testing.B) {
			c, err := verify.New(verify.Config{CacheDir: b.TempDir(), CompileDir: compileCache(), Fetch: fetch, Seed: 1, ReuseInstances: reuse})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			ctx := context.Background()
			res, err := c.Check(ctx, bt, "node") // fetches and compiles
			if err != nil || !res.Verified {
				b.Fatalf("%+v, %v", res, err)
			}
			b.ResetTimer()
			for b.Loop() {
				if res, err = c.Check(ctx, bt, "node"); err != nil || !res.Verified {
					b.Fatalf("%+v, %v", res, err)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(n*float64(len(res.Sampled))), "ns/sampled-step")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(n*float64(res.Replayed+res.Judged)), "ns/score")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(n*float64(len(bt.Steps))), "ns/batch-step")
		})
	}
}
