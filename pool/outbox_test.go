package pool

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// TestOutbox: Batch takes the oldest scored steps and only those, MarkShipped
// moves them on, and both are recorded.
func TestOutbox(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	p := openTest(t, t.TempDir(), Options{Now: func() time.Time { return now }})
	if b, err := p.Batch(ctx, 10); err != nil || b != nil {
		t.Fatalf("Batch of an empty pool: %+v, %v", b, err)
	}
	states := []core.State{core.StateScored, core.StateOpen, core.StateScored, core.StateClosed, core.StateScored}
	for i, st := range states {
		if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprintf("s%d", i)), "s", t0.Add(time.Duration(i)*time.Second), st, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Batch(ctx, 0); err == nil {
		t.Error("Batch with max 0 accepted")
	}

	first, err := p.Batch(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if first == nil || !reflect.DeepEqual(first.Steps, []core.StepID{"s0", "s2"}) || len(first.ID) != 64 || !first.Created.Equal(now) || !first.Shipped.IsZero() {
		t.Fatalf("first batch: %+v", first)
	}
	checkIndexOnly(t, p, Filter{State: core.StateBatched}, []core.StepID{"s0", "s2"})
	checkIndexOnly(t, p, Filter{State: core.StateScored}, []core.StepID{"s4"})
	second, err := p.Batch(ctx, 10)
	if err != nil || second == nil || !reflect.DeepEqual(second.Steps, []core.StepID{"s4"}) || second.ID == first.ID {
		t.Fatalf("second batch: %+v, %v", second, err)
	}
	if b, err := p.Batch(ctx, 10); err != nil || b != nil {
		t.Fatalf("Batch with nothing scored left: %+v, %v", b, err)
	}
	// Open and closed steps were never taken.
	checkIndexOnly(t, p, Filter{State: core.StateOpen}, []core.StepID{"s1"})
	checkIndexOnly(t, p, Filter{State: core.StateClosed}, []core.StepID{"s3"})

	// A batched step cannot go back to be scored again.
	if err := p.Update(ctx, "s0", func(s *core.Step) error { s.State = core.StateClosed; return nil }); !errors.Is(err, ErrTransition) {
		t.Errorf("batched → closed: %v, want ErrTransition", err)
	}

	now = now.Add(time.Minute)
	if err := p.MarkShipped(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	checkIndexOnly(t, p, Filter{State: core.StateShipped}, []core.StepID{"s0", "s2"})
	checkIndexOnly(t, p, Filter{State: core.StateBatched}, []core.StepID{"s4"})
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

	all, err := p.Batches(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("Batches: %d, %v", len(all), err)
	}
	st, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Batches != 2 || st.BatchesShipped != 1 || st.ByState[core.StateShipped] != 2 || st.ByState[core.StateBatched] != 1 {
		t.Errorf("stats: %d batches, %d shipped, by state %v", st.Batches, st.BatchesShipped, st.ByState)
	}
}

// TestOutboxContentAddressed: the same steps make the same batch id in any
// pool; different content makes another.
func TestOutboxContentAddressed(t *testing.T) {
	ctx := context.Background()
	batch := func(content string) core.BatchID {
		p := openTest(t, t.TempDir(), Options{})
		for i := 0; i < 3; i++ {
			if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprint(i)), "s", t0.Add(time.Duration(i)), core.StateScored, content+fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		b, err := p.Batch(ctx, 10)
		if err != nil || b == nil {
			t.Fatalf("Batch: %+v, %v", b, err)
		}
		return b.ID
	}
	a, again, other := batch("x"), batch("x"), batch("y")
	if a != again {
		t.Errorf("the same steps made batches %s and %s", a, again)
	}
	if a == other {
		t.Errorf("different steps made the same batch id %s", a)
	}
}

// TestOutboxSurvivesPowerLoss: a batch and its steps' new states are synced
// when Batch and MarkShipped return.
func TestOutboxSurvivesPowerLoss(t *testing.T) {
	ctx := context.Background()
	p, crash := crashablePool(t)
	for i := 0; i < 3; i++ {
		if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprint(i)), "s", t0.Add(time.Duration(i)), core.StateScored, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	b, err := p.Batch(ctx, 2)
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
	}
	check(core.StateBatched)
	if err := p.MarkShipped(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	check(core.StateShipped)
}
