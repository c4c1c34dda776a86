package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
)

// TestBenchMesh runs BenchMesh small and checks that its figures are sane;
// it asserts nothing about speed.
func TestBenchMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two peers")
	}
	r, err := BenchMesh(context.Background(), BenchOptions{Batches: 5, Steps: 4, PullBytes: 1 << 20, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.LatencyP50 <= 0 || r.LatencyP99 < r.LatencyP50 {
		t.Errorf("latency p50 %s, p99 %s", r.LatencyP50, r.LatencyP99)
	}
	if r.BatchBytes <= 0 || r.Batches != 5 || r.Steps != 4 || r.Rounds != 2 {
		t.Errorf("batches: %+v", r)
	}
	if r.PullBatchBytes < 1<<20*98/100 || r.PullBatchBytes > 1<<20*102/100 || r.PullSteps <= 0 {
		t.Errorf("the pulled batch: %d bytes, %d steps; want about 1 MiB", r.PullBatchBytes, r.PullSteps)
	}
	if r.PullMBps <= 0 || r.BareMBps <= 0 || r.CollectMBps <= 0 || r.Ratio != r.PullMBps/r.BareMBps {
		t.Errorf("rates: pull %v, bare %v, collect %v, ratio %v", r.PullMBps, r.BareMBps, r.CollectMBps, r.Ratio)
	}
	var out bytes.Buffer
	r.Print(&out)
	if s := out.String(); !strings.Contains(s, "goal >= 0.80x") || !strings.Contains(s, "p99") {
		t.Errorf("Print:\n%s", s)
	}
	t.Logf("\n%s", out.String())
}

func TestBenchOptions(t *testing.T) {
	for _, o := range []BenchOptions{{Batches: -1}, {PullBytes: 33 << 20}, {Rounds: -2}} {
		if _, err := BenchMesh(context.Background(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if o := (BenchOptions{}).withDefaults(); o.Batches != 50 || o.Steps != 16 || o.PullBytes != 16<<20 || o.Rounds != 5 {
		t.Errorf("defaults: %+v", o)
	}
}

// BenchmarkPull copies a 4 MiB batch from a member to a trainer over the
// pull protocol and over a bare libp2p stream between the same hosts
// (compare the two sub-benchmarks' MB/s).
func BenchmarkPull(b *testing.B) {
	ps, _, err := pullBatches(BenchOptions{Steps: DefaultBenchSteps, PullBytes: 4 << 20, Rounds: 1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	bm, err := newBenchMesh(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer bm.close()
	p := ps[0]
	id := batch.ID(p)
	bm.out.add(id, p)
	for _, k := range []struct {
		name string
		copy func(context.Context, core.BatchID, int) (time.Duration, error)
	}{{"bare", bm.bare}, {"pull", bm.pull}} {
		b.Run(k.name, func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if _, err := k.copy(ctx, id, len(p)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
