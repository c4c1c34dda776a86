package harness

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/trainer"
)

// testTiming makes raft and rounds quick enough for tests on a loaded
// two-core machine; nothing asserts on durations.
var testTiming = trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond,
	SnapshotThreshold: 4, SnapshotInterval: 200 * time.Millisecond}

// TestBenchDelta: consecutive versions of the tiny adapter are compared,
// and the sizes add up.
func TestBenchDelta(t *testing.T) {
	r, err := BenchDelta(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Bundle == 0 || r.Zstd == 0 || r.DeltaZstd == 0 || r.Zstd > r.Bundle {
		t.Fatalf("%+v: want three compared versions, each compressed no larger than its bundle", r)
	}
	if want := float64(r.DeltaZstd) / float64(r.Bundle); r.Ratio != want {
		t.Fatalf("ratio %v, want %v", r.Ratio, want)
	}
}
