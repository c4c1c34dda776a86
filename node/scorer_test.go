package node_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
)

// TestScorerShedsOverBacklog: with more closed steps waiting than
// MaxScoreBacklog, a pass scores the newest and skips the oldest, counting
// them as shed; once it has caught up it scores the skipped ones, so that
// in the end every step is scored with the built-in plugins.
func TestScorerShedsOverBacklog(t *testing.T) {
	const waiting, bound = 50, 10
	ctx := context.Background()
	// The node is not served: no background scorer runs, the test's
	// passes are the only ones.
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := t0.Add(time.Hour)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	n, err := node.New(ctx, node.Config{DataDir: t.TempDir(), Upstream: "http://127.0.0.1:9/v1", MaxScoreBacklog: bound, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	// The plugins are ready, and what they score at start is done.
	if _, err := n.ScoreClosed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for i := range waiting {
		id := core.StepID(fmt.Sprintf("s%03d", i))
		s := &core.Step{
			ID: id, SessionID: core.SessionID("sess" + string(id)), Turn: core.TurnMain, API: core.APIChat, State: core.StateClosed,
			Request: core.Request{Messages: []core.Message{
				{Role: core.RoleSystem, Content: "You are helpful."},
				{Role: core.RoleUser, Content: fmt.Sprintf("question %d", i)},
			}},
			Response:  core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: fmt.Sprintf("answer %d", i)}}}},
			NextState: &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "No, that's wrong."}}},
			Timings:   core.Timings{Start: t0.Add(time.Duration(i) * time.Second)},
		}
		if err := n.Pool().Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	mu.Lock()
	now = now.Add(2 * time.Second) // the backlog is counted at most once a second
	mu.Unlock()
	done, err := n.ScoreClosed(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	st := n.Scorer()
	if done != bound || st.Shed != waiting-bound || st.Backlog != bound || st.Scored != bound {
		t.Fatalf("first pass: took %d, scorer %+v; want the newest %d taken and %d shed", done, st, bound, waiting-bound)
	}
	scored, err := n.Pool().List(ctx, pool.Filter{State: core.StateScored})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range scored {
		if s.Timings.Start.Before(t0.Add((waiting - bound) * time.Second)) {
			t.Errorf("step %s, one of the oldest, was scored before the newest", s.ID)
		}
		if s.Reward == nil || len(s.Reward.Scores) == 0 {
			t.Errorf("step %s scored without scores: %+v", s.ID, s.Reward)
		}
	}
	// Caught up on the newest: the skipped ones come next, a few at a
	// time, the backlog counted before each pass (more than the bound wait
	// again, and the oldest are skipped again: they were counted already).
	for range 20 {
		mu.Lock()
		now = now.Add(2 * time.Second)
		mu.Unlock()
		if _, err := n.ScoreClosed(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	left, err := n.Pool().List(ctx, pool.Filter{State: core.StateClosed})
	if err != nil {
		t.Fatal(err)
	}
	if st := n.Scorer(); len(left) != 0 || st.Scored != waiting || st.Shed != waiting-bound {
		t.Fatalf("after catching up: %d closed steps left, scorer %+v; want every step scored and %d shed, each counted once", len(left), st, waiting-bound)
	}
}

// TestScorerTakesClosedSteps: a step the gateway closes (here: the next
// call of its conversation continues it) is handed to the background
// scorer and scored with the built-ins at once, not at the scorer's next
// pass over the pool (an hour away here).
func TestScorerTakesClosedSteps(t *testing.T) {
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "Sydney."}, {Text: "Canberra."}}},
		node.Config{ScoreInterval: time.Hour})
	ctx := context.Background()
	chat := base + "/v1/chat/completions"
	post(t, chat, `{"model":"m","messages":[{"role":"user","content":"The capital of Australia?"}]}`)
	post(t, chat, `{"model":"m","messages":[{"role":"user","content":"The capital of Australia?"},{"role":"assistant","content":"Sydney."},{"role":"user","content":"No, that's wrong: it is Canberra."}]}`)
	deadline := time.Now().Add(time.Minute) // a bound, not a measure
	for {
		steps, err := n.Pool().List(ctx, pool.Filter{State: core.StateScored})
		if err != nil {
			t.Fatal(err)
		}
		if len(steps) == 1 {
			s := steps[0]
			if s.Action().Content != "Sydney." || s.Reward == nil || len(s.Reward.Scores) == 0 || s.NextState == nil {
				t.Fatalf("scored step %+v: want the first, with its next state and the built-ins' scores", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the closed step was not scored within a minute; scorer %+v", n.Scorer())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := n.Scorer(); st.Scored != 1 {
		t.Fatalf("scorer %+v: want the one step scored, counted once", st)
	}
}
