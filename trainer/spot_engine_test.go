package trainer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/internal/synthetic"
)

// retrainTwice trains the same share from the same version 0 with two
// workers made by mk (each its own engine; the first also trains it twice
// in a row, as a leader retrains a volunteer's share after its own) and
// returns the largest difference of one value between the deltas.
func retrainTwice(t *testing.T, mk func() *worker) float64 {
	t.Helper()
	ctx := context.Background()
	cfg := group.Config{LocalSteps: 2}.WithDefaults()
	p, err := synthetic.Batch(7, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := batch.Decode(p, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "v0")
	first := mk()
	defer first.close()
	if _, err := first.genesis(ctx, cfg, dir); err != nil {
		t.Fatal(err)
	}
	var payloads [][]byte
	for _, w := range []*worker{first, first, mk()} {
		res, err := w.train(ctx, cfg, dir, 0, 1, b.Steps, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.samples == 0 {
			t.Fatal("no sample trained")
		}
		out, err := res.delta.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, out)
	}
	worst := 0.0
	for _, o := range payloads[1:] {
		d := maxAbsDiff(payloads[0], o)
		if d < 0 {
			t.Fatal("the deltas cannot be compared")
		}
		worst = max(worst, d)
	}
	return worst
}

// The native engine retrains a share to the same bytes: a spot check
// compares it exactly.
func TestSpotRetrainNativeExact(t *testing.T) {
	if d := retrainTwice(t, func() *worker { return &worker{} }); d != 0 {
		t.Fatalf("the native engine retrained a share %g apart", d)
	}
}

// Two CPU runs of the torch engine on the same share stay within
// torchTolerance (the figure goes in docs/benchmarks.md).
func TestSpotRetrainTorchTolerance(t *testing.T) {
	python, err := checkEngine(context.Background(), EngineTorch, DeviceCPU, 0)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the torch engine may not be skipped: %v", err)
		}
		t.Skipf("python3 with torch not found (Debian: apt-get install python3-torch libopenblas0-pthread): %v", err)
	}
	d := retrainTwice(t, func() *worker { return &worker{engineID: EngineTorch, device: DeviceCPU, python: python} })
	t.Logf("torch on the CPU: max abs diff %g between runs of one share (tolerance %g)", d, torchTolerance)
	if d > torchTolerance {
		t.Fatalf("two torch runs of one share %g apart, over the tolerance %g", d, torchTolerance)
	}
}

// BenchmarkSpotCheck measures what spot checks cost: rounds of ten
// volunteers' shares (one batch of 8 steps each, the native engine's tiny
// model, 2 local steps), then the shares the sampling rule picks at each
// rate retrained and compared as the leader does. It reports the checks a
// round and the retraining time as a share of the round's training time
// (all its shares), and in shares of leader time a round.
//
//	go test ./trainer -run '^$' -bench BenchmarkSpotCheck -benchtime 1x
func BenchmarkSpotCheck(b *testing.B) {
	const volunteers, rounds = 10, 10
	ctx := context.Background()
	cfg := group.Config{LocalSteps: 2}.WithDefaults()
	dir := filepath.Join(b.TempDir(), "v0")
	w := &worker{}
	defer w.close()
	if _, err := w.genesis(ctx, cfg, dir); err != nil {
		b.Fatal(err)
	}
	type share struct {
		steps   []*core.Step
		payload []byte
	}
	var ps []mesh.PeerID
	for v := range volunteers {
		ps = append(ps, mesh.PeerID(fmt.Sprintf("volunteer-%02d", v)))
	}
	// The rounds, trained once: what the volunteers do whatever the rate.
	shares := make([]map[mesh.PeerID]share, rounds)
	var train time.Duration
	for r := range rounds {
		shares[r] = map[mesh.PeerID]share{}
		for v, p := range ps {
			payload, err := synthetic.Batch(uint64(1000*r+v), 8, "")
			if err != nil {
				b.Fatal(err)
			}
			bt, err := batch.Decode(payload, batch.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			res, err := w.train(ctx, cfg, dir, 0, uint64(r+1), bt.Steps, nil)
			if err != nil {
				b.Fatal(err)
			}
			train += time.Since(start)
			out, err := res.delta.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			shares[r][p] = share{steps: bt.Steps, payload: out}
		}
	}
	perShare := train.Seconds() / (rounds * volunteers)
	for _, rate := range []float64{0.05, 0.1, 0.25} {
		b.Run(fmt.Sprintf("rate=%g", rate), func(b *testing.B) {
			var checks int
			var check time.Duration
			for range b.N {
				checks, check = 0, 0
				for r := range rounds {
					draw := func(p mesh.PeerID) float64 {
						return spotDraw(binary.BigEndian.AppendUint64([]byte(p), uint64(r)))
					}
					for _, p := range spotSample(ps, rate, draw) {
						sh := shares[r][p]
						start := time.Now()
						res, err := w.train(ctx, cfg, dir, 0, uint64(r+1), sh.steps, nil)
						if err != nil {
							b.Fatal(err)
						}
						out, err := res.delta.MarshalBinary()
						if err != nil {
							b.Fatal(err)
						}
						if !bytes.Equal(out, sh.payload) {
							b.Fatalf("round %d: %s's share retrained %g apart", r, p, maxAbsDiff(out, sh.payload))
						}
						check += time.Since(start)
						checks++
					}
				}
			}
			b.ReportMetric(float64(checks)/rounds, "checks/round")
			b.ReportMetric(check.Seconds()/train.Seconds(), "extra/round_training")
			b.ReportMetric(check.Seconds()/rounds/perShare, "leader_shares/round")
		})
	}
}
