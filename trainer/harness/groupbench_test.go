package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestBenchGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts trainers")
	}
	r, err := BenchGroup(context.Background(), GroupBenchOptions{Kills: 2, Timing: testTiming, Rounds: 2, RoundBatches: 2, BatchSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Failover) != 2 || r.P50 <= 0 || r.P99 < r.P50 {
		t.Errorf("failover: %+v", r)
	}
	if len(r.Rounds) == 0 {
		t.Fatal("no round measured")
	}
	for _, rt := range r.Rounds {
		if rt.Training <= 0 || rt.Wall < rt.Training || rt.Steps <= 0 {
			t.Errorf("round %+v", rt)
		}
	}
	var b bytes.Buffer
	r.Print(&b)
	if !strings.Contains(b.String(), "failover") || !strings.Contains(b.String(), "overhead") {
		t.Errorf("printed:\n%s", b.String())
	}
}
