package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

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

// lowDiskFS reports free as the free space of its filesystem.
type lowDiskFS struct {
	vfs.FS
	free atomic.Int64
}

func (f *lowDiskFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: uint64(f.free.Load()), TotalBytes: 100 << 30}, nil
}

// When free space falls under --min-free, the node stops recording and
// its retention loop drops the shipped steps to make room at once, not at
// its next period (an hour here); the calls are still answered.
func TestLowSpaceRetentionAtOnce(t *testing.T) {
	fs := &lowDiskFS{FS: vfs.Default}
	fs.free.Store(10 << 30)
	n, base := startNode(t, fakeupstream.Script{}, node.Config{PoolFS: fs, MinFree: 1 << 30, RetentionEvery: time.Hour, NoScoring: true})
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	for i, st := range []core.State{core.StateShipped, core.StateShipped, core.StateScored} {
		s := &core.Step{ID: core.StepID(fmt.Sprintf("old%d", i)), SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: st,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprint("question ", i)}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "answer"}}}},
			Timings:  core.Timings{Start: t0.Add(time.Duration(i) * time.Second)}}
		if err := n.Pool().Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	fs.free.Store(100 << 20)
	for i := 0; n.Pool().Health().Recording; i++ { // the guard looks once a second
		if i == 600 {
			t.Fatal("the free-space guard did not trip")
		}
		time.Sleep(10 * time.Millisecond)
	}
	post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"while the disk is full"}]}`)
	deadline := time.Now().Add(time.Minute) // a bound, not a measure
	for {
		_, err0 := n.Pool().Get(ctx, "old0")
		_, err1 := n.Pool().Get(ctx, "old1")
		if errors.Is(err0, pool.ErrNotFound) && errors.Is(err1, pool.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shipped steps are still there a minute after the disk ran low: %v, %v", err0, err1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := n.Pool().Get(ctx, "old2"); err != nil {
		t.Fatalf("a step not shipped was dropped: %v", err)
	}
	if h := n.Pool().Health(); h.Recording || !strings.Contains(h.Paused, "low disk space") {
		t.Fatalf("health under low space: %+v", h)
	}
	steps, err := n.Pool().List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if len(s.Request.Messages) > 0 && s.Request.Messages[0].Content == "while the disk is full" {
			t.Fatalf("a call was recorded under the free-space guard")
		}
	}
}
