package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
)

func testBatch(t *testing.T, text string) ([]byte, *batch.Batch) {
	t.Helper()
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	steps := []*core.Step{{
		ID: core.StepID("s-" + text), SessionID: "session", Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
		Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: text}}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
		Timings:  core.Timings{Start: at},
	}}
	p, err := batch.Encode(batch.Meta{Created: at}, steps)
	if err != nil {
		t.Fatal(err)
	}
	b, err := batch.Decode(p, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

func TestPutListReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	s, err := Open(dir, func() time.Time { now = now.Add(time.Second); return now })
	if err != nil {
		t.Fatal(err)
	}
	p1, b1 := testBatch(t, "one")
	p2, b2 := testBatch(t, "two")
	id1, id2 := batch.ID(p1), batch.ID(p2)
	if err := s.Put(ctx, id1, p1, b1); err != nil {
		t.Fatal(err)
	}
	if err := s.PutFrom(ctx, id2, "device-2", p2, b2); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, id1, p2, b2); !errors.Is(err, batch.ErrHashMismatch) {
		t.Errorf("bytes under another's id: %v", err)
	}
	if _, err := s.Payload(ctx, core.BatchID("00")); !errors.Is(err, mesh.ErrNoBatch) {
		t.Errorf("an unknown batch: %v", err)
	}
	if _, err := Open(dir, nil); !errors.Is(err, ErrLocked) {
		t.Errorf("a second open: %v", err)
	}
	s.Close()

	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es, err := s.List(ctx)
	if err != nil || len(es) != 2 || es[0].ID != id1 || es[1].ID != id2 {
		t.Fatalf("list after reopening: %+v, %v", es, err)
	}
	if es[1].From != "device-2" || es[0].From != "" || es[1].Header.Steps != 1 {
		t.Errorf("entries: %+v", es)
	}
	e, err := s.Entry(ctx, id2)
	if err != nil || e.From != "device-2" || e.Size != len(p2) {
		t.Errorf("entry: %+v, %v", e, err)
	}
	if has, _ := s.Has(ctx, id1); !has {
		t.Error("Has says no")
	}
	b, err := s.Batch(ctx, id2)
	if err != nil || b.Steps[0].Request.Messages[0].Content != "two" {
		t.Errorf("batch read back: %v", err)
	}
}
