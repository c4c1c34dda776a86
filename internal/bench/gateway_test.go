package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/storetest"
)

// TestGatewayRuns runs the gateway benchmark briefly with both stores and
// checks that it measured every series without errors. It asserts nothing
// about speed.
func TestGatewayRuns(t *testing.T) {
	for _, mem := range []bool{false, true} {
		r, err := Gateway(context.Background(), GatewayOptions{Rate: 100, Duration: 400 * time.Millisecond, Warmup: 100 * time.Millisecond, DataDir: t.TempDir(), Memory: mem})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Series) != 3 {
			t.Fatalf("%d series", len(r.Series))
		}
		for _, s := range r.Series {
			if s.Direct.N == 0 || s.Through.N == 0 || s.Direct.Errors+s.Through.Errors > 0 {
				t.Errorf("memory=%v %s: %+v", mem, s.Name, s)
			}
			if s.Through.P50 <= 0 || s.Through.P99 < s.Through.P50 {
				t.Errorf("memory=%v %s: percentiles %v %v", mem, s.Name, s.Through.P50, s.Through.P99)
			}
		}
		var b bytes.Buffer
		r.Print(&b)
		if !strings.Contains(b.String(), "added p50") {
			t.Errorf("print: %s", b.String())
		}
	}
}

// TestMemStoreConformance: the memory store of --memory keeps the pool's
// rules, so the gateway does the same work against it.
func TestMemStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store { return &memStore{steps: map[core.StepID]*core.Step{}} })
}
