package node_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
)

// The node's retention loop drops, as the clock moves on, the steps older
// than MaxAge, and leaves the fresh ones.
func TestRetentionLoop(t *testing.T) {
	start := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	var offset atomic.Int64
	now := func() time.Time { return start.Add(time.Duration(offset.Load())) }
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "one"}, {Text: "two"}}},
		node.Config{MaxAge: time.Hour, RetentionEvery: 20 * time.Millisecond, Now: now, NoScoring: true})
	ctx := context.Background()
	post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"old"}]}`)
	offset.Store(int64(50 * time.Minute))
	post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"newer"}]}`)
	live := func() []*core.Step {
		steps, err := n.Pool().List(ctx, pool.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		var out []*core.Step
		for _, s := range steps {
			if s.State != core.StateDropped {
				out = append(out, s)
			}
		}
		return out
	}
	if got := len(live()); got != 2 {
		t.Fatalf("%d steps before the clock moves", got)
	}
	// 70 minutes after the first call: it is older than MaxAge, the
	// second is not.
	offset.Store(int64(70 * time.Minute))
	deadline := time.Now().Add(30 * time.Second)
	for len(live()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the retention loop kept %d steps", len(live()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := live()[0]; s.Request.Messages[0].Content != "newer" {
		t.Errorf("retention kept %q, not the newer step", s.Request.Messages[0].Content)
	}
}
