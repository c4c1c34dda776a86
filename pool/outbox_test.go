package pool

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// TestOutbox: Seal records a batch with its payload and moves its steps to
// batched and the held ones to held, only from scored; MarkShipped moves
// them on; both are recorded.
func TestOutbox(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	p := openTest(t, t.TempDir(), Options{Now: func() time.Time { return now }})
	states := []core.State{core.StateScored, core.StateOpen, core.StateScored, core.StateClosed, core.StateScored, core.StateScored}
	for i, st := range states {
		if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprintf("s%d", i)), "s", t0.Add(time.Duration(i)*time.Second), st, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for name, spec := range map[string]SealSpec{
		"payload without steps": {Payload: []byte("x")},
		"steps without payload": {Steps: []core.StepID{"s0"}},
		"a step twice":          {Steps: []core.StepID{"s0"}, Held: []core.StepID{"s0"}, Payload: []byte("x")},
		"oversize payload":      {Steps: []core.StepID{"s0"}, Payload: make([]byte, MaxPayload+1)},
	} {
		if b, err := p.Seal(ctx, spec); err == nil {
			t.Errorf("Seal with %s accepted: %+v", name, b)
		}
	}
	if b, err := p.Seal(ctx, SealSpec{}); err != nil || b != nil {
		t.Errorf("an empty Seal: %+v, %v", b, err)
	}
	// A step that is not scored makes the whole seal fail, writing nothing.
	for _, bad := range []core.StepID{"s1", "s3", "nope"} {
		_, err := p.Seal(ctx, SealSpec{Steps: []core.StepID{"s0", bad}, Payload: []byte("bad")})
		if !errors.Is(err, ErrConflict) {
			t.Errorf("sealing %s: %v, want ErrConflict", bad, err)
		}
	}
	checkIndexOnly(t, p, Filter{State: core.StateScored}, []core.StepID{"s0", "s2", "s4", "s5"})

	payload := []byte("first batch's bytes")
	first, err := p.Seal(ctx, SealSpec{Steps: []core.StepID{"s0", "s2"}, Held: []core.StepID{"s4"}, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	if first == nil || first.ID != core.BatchID(hex.EncodeToString(sum[:])) || !reflect.DeepEqual(first.Steps, []core.StepID{"s0", "s2"}) ||
		first.Size != int64(len(payload)) || !first.Created.Equal(now) || !first.Shipped.IsZero() {
		t.Fatalf("first batch: %+v", first)
	}
	if got, err := p.Payload(ctx, first.ID); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("Payload: %q, %v", got, err)
	}
	checkIndexOnly(t, p, Filter{State: core.StateBatched}, []core.StepID{"s0", "s2"})
	checkIndexOnly(t, p, Filter{State: core.StateHeld}, []core.StepID{"s4"})
	checkIndexOnly(t, p, Filter{State: core.StateScored}, []core.StepID{"s5"})
	// The same payload again is the same batch.
	if again, err := p.Seal(ctx, SealSpec{Steps: []core.StepID{"s5"}, Payload: payload}); err != nil || again.ID != first.ID || !reflect.DeepEqual(again.Steps, first.Steps) {
		t.Fatalf("sealing the same payload again: %+v, %v", again, err)
	}
	// Everything held: no batch.
	if b, err := p.Seal(ctx, SealSpec{Held: []core.StepID{"s5"}}); err != nil || b != nil {
		t.Fatalf("sealing only held steps: %+v, %v", b, err)
	}
	// Open and closed steps were never taken.
	checkIndexOnly(t, p, Filter{State: core.StateOpen}, []core.StepID{"s1"})
	checkIndexOnly(t, p, Filter{State: core.StateClosed}, []core.StepID{"s3"})

	// Neither a batched nor a held step can go back to be scored again.
	for _, id := range []core.StepID{"s0", "s4"} {
		if err := p.Update(ctx, id, func(s *core.Step) error { s.State = core.StateClosed; return nil }); !errors.Is(err, ErrTransition) {
			t.Errorf("%s → closed: %v, want ErrTransition", id, err)
		}
	}
	if err := p.Update(ctx, "s4", func(s *core.Step) error { s.State = core.StateShipped; return nil }); !errors.Is(err, ErrTransition) {
		t.Errorf("held → shipped: %v, want ErrTransition", err)
	}

	now = now.Add(time.Minute)
	if err := p.MarkShipped(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	checkIndexOnly(t, p, Filter{State: core.StateShipped}, []core.StepID{"s0", "s2"})
	got, err := p.GetBatch(ctx, first.ID)
	if err != nil || !got.Shipped.Equal(now) || !reflect.DeepEqual(got.Steps, first.Steps) {
		t.Fatalf("shipped batch: %+v, %v", got, err)
	}
	now = now.Add(time.Minute)
	if err := p.MarkShipped(ctx, first.ID); err != nil {
		t.Fatalf("marking a shipped batch again: %v", err)
	}
	if got, _ := p.GetBatch(ctx, first.ID); !got.Shipped.Equal(now.Add(-time.Minute)) {
		t.Errorf("marking again moved the shipping time to %v", got.Shipped)
	}
	if err := p.MarkShipped(ctx, "nope"); !errors.Is(err, ErrNoBatch) {
		t.Errorf("MarkShipped of an unknown batch: %v", err)
	}
	if _, err := p.GetBatch(ctx, "nope"); !errors.Is(err, ErrNoBatch) {
		t.Errorf("GetBatch of an unknown batch: %v", err)
	}
	if _, err := p.Payload(ctx, "nope"); !errors.Is(err, ErrNoBatch) {
		t.Errorf("Payload of an unknown batch: %v", err)
	}

	all, err := p.Batches(ctx)
	if err != nil || len(all) != 1 {
		t.Fatalf("Batches: %d, %v", len(all), err)
	}
	st, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Batches != 1 || st.BatchesShipped != 1 || st.ByState[core.StateShipped] != 2 || st.ByState[core.StateHeld] != 2 {
		t.Errorf("stats: %d batches, %d shipped, by state %v", st.Batches, st.BatchesShipped, st.ByState)
	}
}

// TestOutboxSurvivesPowerLoss: a batch, its payload and its steps' new
// states are synced when Seal and MarkShipped return.
func TestOutboxSurvivesPowerLoss(t *testing.T) {
	ctx := context.Background()
	p, crash := crashablePool(t)
	for i := 0; i < 3; i++ {
		if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprint(i)), "s", t0.Add(time.Duration(i)), core.StateScored, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	b, err := p.Seal(ctx, SealSpec{Steps: []core.StepID{"0", "1"}, Held: []core.StepID{"2"}, Payload: []byte("payload")})
	if err != nil {
		t.Fatal(err)
	}
	check := func(want core.State) {
		t.Helper()
		q := crash()
		got, err := q.GetBatch(ctx, b.ID)
		if err != nil || !reflect.DeepEqual(got.Steps, b.Steps) || got.Shipped.IsZero() != (want == core.StateBatched) {
			t.Fatalf("batch after the crash: %+v, %v", got, err)
		}
		checkIndexOnly(t, q, Filter{State: want}, b.Steps)
		checkIndexOnly(t, q, Filter{State: core.StateHeld}, []core.StepID{"2"})
		if got, err := q.Payload(ctx, b.ID); err != nil || string(got) != "payload" {
			t.Fatalf("payload after the crash: %q, %v", got, err)
		}
	}
	check(core.StateBatched)
	if err := p.MarkShipped(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	check(core.StateShipped)
}
