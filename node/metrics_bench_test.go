package node

import (
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// BenchmarkMetricsCall is what the metrics add to a recorded call: one
// observation in the latency histogram (gateway.Config.OnCall). The
// baseline, a call with no hook, adds nothing.
func BenchmarkMetricsCall(b *testing.B) {
	m := newMetrics(&Node{})
	d := 3 * time.Millisecond
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.call(core.APIChat, d)
		}
	})
}
