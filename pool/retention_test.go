package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

func TestRetentionByAge(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(10 * 24 * time.Hour)
	p := openTest(t, t.TempDir(), Options{MaxAge: 7 * 24 * time.Hour, Now: func() time.Time { return now }})
	// Days 0..9 relative to t0: days 0, 1, 2 are older than 7 days at now.
	for d := 0; d < 10; d++ {
		s := simpleStep(core.StepID(fmt.Sprintf("d%d", d)), "s", t0.Add(time.Duration(d)*24*time.Hour), core.StateClosed, fmt.Sprintf("unique %d", d))
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	before, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := p.ApplyRetention(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("dropped %d, want 3", n)
	}
	for d := 0; d < 10; d++ {
		_, err := p.Get(ctx, core.StepID(fmt.Sprintf("d%d", d)))
		if d < 3 && !errors.Is(err, ErrNotFound) {
			t.Fatalf("d%d: %v, want ErrNotFound", d, err)
		}
		if d >= 3 && err != nil {
			t.Fatalf("d%d: %v", d, err)
		}
	}
	after, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each dropped step had 2 unique messages (user, reply); the shared
	// system prompt stays.
	if after.MessagesStored != before.MessagesStored-6 {
		t.Fatalf("messages stored %d → %d, want 6 released", before.MessagesStored, after.MessagesStored)
	}
	if after.Steps != 7 || after.ByState[core.StateDropped] != 3 {
		t.Fatalf("after: %+v", after)
	}
	tombs, err := p.List(ctx, Filter{State: core.StateDropped})
	if err != nil {
		t.Fatal(err)
	}
	if ids := idsOf(tombs); len(ids) != 3 || ids[0] != "d0" || tombs[0].SessionID != "s" || !tombs[0].Timings.Start.Equal(t0) {
		t.Fatalf("tombstones: %+v", tombs)
	}
	checkIndexOnly(t, p, Filter{Session: "s", Limit: 1}, []core.StepID{"d3"})
	if n := countKeys(t, p, "i/"); n != 7*3+3 {
		t.Fatalf("%d index keys, want %d", n, 7*3+3)
	}
	// Idempotent.
	if n, err := p.ApplyRetention(ctx); err != nil || n != 0 {
		t.Fatalf("second run dropped %d, %v", n, err)
	}
}

func TestRetentionBySize(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := openTest(t, dir, Options{})
	gen := NewStepGen("r", 10)
	const total = 60
	for i := 0; i < total; i++ {
		s := gen.Step(i)
		// The newest session's steps are shipped: they go first.
		if i >= 50 {
			s.State = core.StateShipped
		}
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	full, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	limit := full.Bytes * 2 / 3
	p = openTest(t, dir, Options{MaxBytes: limit})
	n, err := p.ApplyRetention(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("full %d limit %d after %d, dropped %d", full.Bytes, limit, st.Bytes, n)
	if st.Bytes > limit {
		t.Fatalf("after retention %d bytes > limit %d", st.Bytes, limit)
	}
	if n == 0 || st.Steps != total-n {
		t.Fatalf("dropped %d, %d steps left", n, st.Steps)
	}
	// All shipped steps went before any other; then the oldest.
	if st.ByState[core.StateShipped] != 0 {
		t.Fatalf("%d shipped steps left", st.ByState[core.StateShipped])
	}
	left, err := p.List(ctx, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if first := left[0].ID; first != gen.Step(n-10).ID {
		t.Fatalf("oldest remaining %s, want %s", first, gen.Step(n-10).ID)
	}
	// It stopped as soon as it was under: one step frees at most its record
	// and its own two messages (well under 10 kB here).
	if st.Bytes < limit-10000 {
		t.Fatalf("dropped too much: %d bytes left for a limit of %d", st.Bytes, limit)
	}
	// Blobs released: the stored blobs are exactly those the remaining steps use.
	if st.BlobBytes >= full.BlobBytes {
		t.Fatalf("blob bytes %d → %d: nothing released", full.BlobBytes, st.BlobBytes)
	}
	for _, s := range left {
		if _, err := p.Get(ctx, s.ID); err != nil {
			t.Fatalf("remaining step %s: %v", s.ID, err)
		}
	}
}

// TestSweepWithConcurrentWriters runs retention's blob sweep while writers
// put steps that share blobs with dropped ones; no live step may lose a blob.
func TestSweepWithConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := openTest(t, t.TempDir(), Options{MaxAge: 30 * time.Second, Now: clock})
	gen := NewStepGen("w", 8)

	const writers, perWriter = 4, 60
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < perWriter; k++ {
				i := k*writers + w
				s := gen.Step(i) // time: gen.Base + i seconds
				if err := p.Put(ctx, s); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r := 0; r < 40; r++ {
			mu.Lock()
			now = gen.Base.Add(time.Duration(r*6) * time.Second)
			mu.Unlock()
			if _, err := p.ApplyRetention(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	steps, err := p.List(ctx, Filter{})
	if err != nil {
		t.Fatalf("List after concurrent sweep: %v", err)
	}
	for _, s := range steps {
		want := gen.Step(stepIndex(t, gen, s.ID))
		mustEqual(t, s, want)
	}
	// A final sweep with nothing running deletes nothing a live step uses.
	if _, err := p.sweepBlobs(ctx, p.cur); err != nil {
		t.Fatal(err)
	}
	if _, err := p.List(ctx, Filter{}); err != nil {
		t.Fatal(err)
	}
}

// TestSweepSparesBlobsWrittenDuringScan puts, while the sweep scans, a step
// that reuses a blob only a just-dropped step referenced: the blob exists, so
// the put does not write it again, and the sweep must not delete it.
func TestSweepSparesBlobsWrittenDuringScan(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	p := openTest(t, t.TempDir(), Options{MaxAge: time.Minute, Now: func() time.Time { return now }})
	old := simpleStep("old", "s", t0, core.StateClosed, "shared only by old and new")
	if err := p.Put(ctx, old); err != nil {
		t.Fatal(err)
	}
	fresh := simpleStep("new", "s", now, core.StateOpen, "shared only by old and new")
	ran := false
	p.testHookSwept = func() {
		ran = true
		if err := p.Put(ctx, fresh); err != nil {
			t.Error(err)
		}
	}
	n, err := p.ApplyRetention(ctx)
	if err != nil || n != 1 || !ran {
		t.Fatalf("ApplyRetention: dropped %d, %v, hook ran %v", n, err, ran)
	}
	p.testHookSwept = nil
	got, err := p.Get(ctx, "new")
	if err != nil {
		t.Fatalf("step put during the sweep: %v", err)
	}
	mustEqual(t, got, fresh)
	// With no writer racing, the next sweep keeps what "new" uses.
	if _, err := p.ApplyRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, "new"); err != nil {
		t.Fatal(err)
	}
}

func stepIndex(t *testing.T, g *StepGen, id core.StepID) int {
	var sess, turn int
	if _, err := fmt.Sscanf(string(id), g.Prefix+"-%06d-%03d", &sess, &turn); err != nil {
		t.Fatalf("id %s: %v", id, err)
	}
	return sess*g.PerSession + turn
}

// Tombstones stop a dropped step from coming back while a late update may
// still arrive, and are purged once older than TombstoneAge; a reopened
// pool keeps the same record.
func TestTombstonesPurged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	now := t0.Add(2 * time.Hour)
	clock := func() time.Time { return now }
	p := openTest(t, dir, Options{MaxAge: time.Hour, TombstoneAge: 24 * time.Hour, Now: clock})
	old := simpleStep("old", "s", t0, core.StateClosed, "old one")
	if err := p.Put(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx, simpleStep("new", "s", now, core.StateClosed, "new one")); err != nil {
		t.Fatal(err)
	}
	if n, err := p.ApplyRetention(ctx); err != nil || n != 1 {
		t.Fatalf("dropped %d, %v", n, err)
	}
	tombs := func(p *Pool) int {
		l, err := p.List(ctx, Filter{State: core.StateDropped})
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	if n := tombs(p); n != 1 {
		t.Fatalf("%d tombstones after the drop", n)
	}
	// While the tombstone stands, the step does not come back.
	late := simpleStep("old", "s", t0, core.StateScored, "old one")
	if err := p.Put(ctx, late); err == nil {
		t.Fatal("a dropped step came back under its tombstone")
	}
	// A day later the tombstone goes, with its index entry; the fresh
	// step stays.
	now = t0.Add(25 * time.Hour)
	if _, err := p.ApplyRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if n := tombs(p); n != 1 { // "new" was dropped now, by age
		t.Fatalf("%d tombstones after the purge, want only the newly dropped one", n)
	}
	st, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.ByState[core.StateDropped] != 1 {
		t.Errorf("stats count %d tombstones", st.ByState[core.StateDropped])
	}
	p.Close()
	p = openTest(t, dir, Options{MaxAge: time.Hour, TombstoneAge: 24 * time.Hour, Now: clock})
	if n := tombs(p); n != 1 {
		t.Fatalf("%d tombstones after reopening", n)
	}
	// Kept forever with a negative TombstoneAge.
	p.Close()
	now = t0.Add(1000 * time.Hour)
	p = openTest(t, dir, Options{MaxAge: time.Hour, TombstoneAge: -1, Now: clock})
	if _, err := p.ApplyRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if n := tombs(p); n != 1 {
		t.Fatalf("%d tombstones kept with TombstoneAge < 0", n)
	}
}
