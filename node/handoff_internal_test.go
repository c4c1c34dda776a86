package node

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/pool"
)

// TestPassLeavesHandedSteps: a closed step the gateway handed to the
// scorer is left by a pass over the pool (which would otherwise score it,
// and call a judge for it, a second time) and scored from the queue; once
// it has left the queue, passes see steps again.
func TestPassLeavesHandedSteps(t *testing.T) {
	ctx := context.Background()
	// Not served: no background scorer runs, the test's calls are the only
	// ones.
	n, err := New(ctx, Config{DataDir: t.TempDir(), Upstream: "http://127.0.0.1:9/v1"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	if _, err := n.ScoreClosed(ctx, 1); err != nil { // the plugins are ready
		t.Fatal(err)
	}
	step := func(id core.StepID) *core.Step {
		s := &core.Step{ID: id, SessionID: core.SessionID("sess-" + string(id)), Turn: core.TurnMain, API: core.APIChat, State: core.StateClosed,
			Request:   core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: "The capital of Australia?"}}},
			Response:  core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "Sydney."}}}},
			NextState: &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "No, that's wrong."}}},
			Timings:   core.Timings{Start: time.Now()}}
		if err := n.Pool().Put(ctx, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	state := func(id core.StepID) core.State {
		s, err := n.Pool().Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return s.State
	}

	handed := step("handed")
	n.handed(handed)
	if _, err := n.ScoreClosed(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if st := state("handed"); st != core.StateClosed {
		t.Fatalf("a pass scored the step waiting in the hand-off queue: %s", st)
	}
	if k, err := n.scoreHanded(ctx, nil); err != nil || k != 1 {
		t.Fatalf("scoreHanded: %d, %v", k, err)
	}
	if st := state("handed"); st != core.StateScored {
		t.Fatalf("the handed step is %s after the queue's turn", st)
	}
	if len(n.queued) != 0 {
		t.Fatalf("still queued: %v", n.queued)
	}
	if sc := n.Scorer(); sc.Scored != 1 {
		t.Fatalf("scorer %+v: want the one step, counted once", sc)
	}

	// A step not in the queue is a pass's.
	step("later")
	if _, err := n.ScoreClosed(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if st := state("later"); st != core.StateScored {
		t.Fatalf("a pass left a step that is not queued: %s", st)
	}
	if left, err := n.Pool().List(ctx, pool.Filter{State: core.StateClosed}); err != nil || len(left) != 0 {
		t.Fatalf("closed left: %d, %v", len(left), err)
	}
}
