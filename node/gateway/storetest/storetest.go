// Package storetest is the conformance suite for the gateway's step stores:
// one set of checks that the Pebble pool and every in-memory stand-in
// (the gateway's test store, the benchmark's memory store) must pass, so
// that what the gateway's tests and benchmarks see of a fake holds of the
// real store too.
package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/pool"
)

// Store is what the gateway needs of a store (gateway.Store).
type Store interface {
	Put(ctx context.Context, s *core.Step) error
	Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error
}

// Applier is the optional capability of writing several changes in one
// commit (gateway.Applier).
type Applier interface {
	Apply(ctx context.Context, puts []*core.Step, changes []pool.Change) error
}

var errRead = errors.New("storetest: read only")

// read returns the stored step through Update, writing nothing.
func read(t *testing.T, st Store, id core.StepID) (*core.Step, error) {
	t.Helper()
	var got core.Step
	err := st.Update(context.Background(), id, func(s *core.Step) error {
		got = *s
		return errRead
	})
	if errors.Is(err, errRead) {
		return &got, nil
	}
	return nil, err
}

func step(id core.StepID, state core.State, text string) *core.Step {
	return &core.Step{
		ID: id, SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: state,
		Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: text}}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "re: " + text}}}},
		Timings:  core.Timings{Start: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)},
	}
}

func closeWith(text string) func(*core.Step) error {
	return func(s *core.Step) error {
		s.State = core.StateClosed
		s.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: text}}}
		return nil
	}
}

// Run checks the store open returns (a fresh, empty one per call).
func Run(t *testing.T, open func(t *testing.T) Store) {
	ctx := context.Background()
	t.Run("PutUpdate", func(t *testing.T) {
		st := open(t)
		if err := st.Put(ctx, step("a", core.StateOpen, "one")); err != nil {
			t.Fatal(err)
		}
		if err := st.Update(ctx, "a", closeWith("next")); err != nil {
			t.Fatal(err)
		}
		got, err := read(t, st, "a")
		if err != nil || got.State != core.StateClosed || got.NextState == nil || got.NextState.Messages[0].Content != "next" ||
			got.Action().Content != "re: one" {
			t.Fatalf("after Update: %+v, %v", got, err)
		}
		if err := st.Update(ctx, "nope", closeWith("x")); !errors.Is(err, pool.ErrNotFound) {
			t.Errorf("Update of an unknown step: %v, want pool.ErrNotFound", err)
		}
		boom := errors.New("boom")
		if err := st.Update(ctx, "a", func(s *core.Step) error { s.State = core.StateScored; return boom }); !errors.Is(err, boom) {
			t.Errorf("Update whose function fails: %v", err)
		}
		if got, _ := read(t, st, "a"); got == nil || got.State != core.StateClosed {
			t.Errorf("a failed Update wrote: %+v", got)
		}
	})
	t.Run("Transitions", func(t *testing.T) {
		st := open(t)
		if err := st.Put(ctx, step("a", core.StateScored, "one")); err != nil {
			t.Fatal(err)
		}
		if err := st.Update(ctx, "a", func(s *core.Step) error { s.State = core.StateOpen; return nil }); !errors.Is(err, pool.ErrTransition) {
			t.Errorf("scored → open: %v, want pool.ErrTransition", err)
		}
		if err := st.Update(ctx, "a", func(s *core.Step) error { s.State = core.StateClosed; return nil }); err != nil {
			t.Errorf("scored → closed (to be scored again): %v", err)
		}
	})
	t.Run("Apply", func(t *testing.T) {
		st := open(t)
		a, ok := st.(Applier)
		if !ok {
			t.Skip("not an Applier")
		}
		if err := st.Put(ctx, step("p", core.StateOpen, "parent")); err != nil {
			t.Fatal(err)
		}
		// All or nothing: a change of a missing step fails the put too.
		if err := a.Apply(ctx, []*core.Step{step("c0", core.StateOpen, "child")}, []pool.Change{{ID: "p", Fn: closeWith("x")}, {ID: "nope", Fn: closeWith("x")}}); !errors.Is(err, pool.ErrNotFound) {
			t.Errorf("Apply changing a missing step: %v, want pool.ErrNotFound", err)
		}
		if _, err := read(t, st, "c0"); !errors.Is(err, pool.ErrNotFound) {
			t.Errorf("the put of a failed Apply was stored: %v", err)
		}
		if got, _ := read(t, st, "p"); got == nil || got.State != core.StateOpen {
			t.Errorf("the change of a failed Apply was stored: %+v", got)
		}
		child := step("c", core.StateClosed, "child")
		if err := a.Apply(ctx, []*core.Step{child}, []pool.Change{{ID: "p", Fn: closeWith("child")}}); err != nil {
			t.Fatal(err)
		}
		if got, err := read(t, st, "c"); err != nil || got.State != core.StateClosed || got.Action().Content != "re: child" {
			t.Errorf("the put of an Apply: %+v, %v", got, err)
		}
		if got, err := read(t, st, "p"); err != nil || got.State != core.StateClosed || got.NextState == nil || got.NextState.Messages[0].Content != "child" {
			t.Errorf("the change of an Apply: %+v, %v", got, err)
		}
		if err := a.Apply(ctx, []*core.Step{step("c", core.StateClosed, "again")}, []pool.Change{{ID: "c", Fn: closeWith("x")}}); !errors.Is(err, pool.ErrInvalid) {
			t.Errorf("Apply writing one step twice: %v, want pool.ErrInvalid", err)
		}
	})
}
