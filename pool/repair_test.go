package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// TestRepairDamagedWAL: 32 bytes overwritten in the middle of the WAL make
// Open fail with ErrDamaged and OpenServing start paused; Repair moves the
// damaged pool aside, salvages every record that checks out, and the pool
// opens and records again.
func TestRepairDamagedWAL(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pool")
	p, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		s := simpleStep(core.StepID(fmt.Sprintf("s%04d", i)), "sess", t0.Add(time.Duration(i)*time.Second), core.StateOpen, fmt.Sprintf("%d %s", i, strings.Repeat("x", 500)))
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage every WAL segment in its middle (the live one and any older
	// one Pebble has not replayed into a table yet).
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	damaged := 0
	for _, l := range logs {
		f, err := os.OpenFile(l, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if fi, _ := f.Stat(); fi.Size() >= 64<<10 {
			if _, err := f.WriteAt(make([]byte, 32), fi.Size()/2); err != nil {
				t.Fatal(err)
			}
			damaged++
		}
		f.Close()
	}
	if damaged == 0 {
		t.Fatalf("WAL files %v: none spans several blocks", logs)
	}

	if _, err := Open(dir, Options{}); !errors.Is(err, ErrDamaged) {
		t.Fatalf("Open of a damaged pool: %v, want ErrDamaged", err)
	}
	sp, err := OpenServing(dir, Options{ReopenInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if h := sp.Health(); h.Recording || !h.Damaged {
		t.Fatalf("health of a damaged pool: %+v", h)
	}
	if err := sp.Put(ctx, simpleStep("new", "s", t0, core.StateOpen, "x")); !errors.Is(err, ErrPaused) {
		t.Fatalf("put into a damaged pool: %v, want ErrPaused", err)
	}

	var rep RepairReport
	for range 100 { // the serving pool's attempts may hold the lock a moment
		if rep, err = Repair(ctx, dir, time.Now()); !errors.Is(err, ErrLocked) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("repair: %+v", rep)
	if rep.BadWALRecords == 0 || rep.Steps == 0 || rep.Steps >= n {
		t.Fatalf("repair report %+v: want some steps salvaged and the damaged records counted", rep)
	}
	if _, err := os.Stat(rep.Moved); err != nil {
		t.Fatalf("the damaged pool is not kept: %v", err)
	}
	waitRecording(t, sp)
	defer sp.Close()
	steps, err := sp.List(ctx, Filter{})
	if err != nil || len(steps) != rep.Steps {
		t.Fatalf("the repaired pool lists %d steps (%v), the report says %d", len(steps), err, rep.Steps)
	}
	for _, s := range steps {
		if len(s.Request.Messages) != 2 || !strings.HasSuffix(s.Request.Messages[1].Content, strings.Repeat("x", 500)) || s.Action().Content == "" {
			t.Errorf("salvaged step %s is not whole", s.ID)
		}
	}
	if err := sp.Put(ctx, simpleStep("new", "s", t0, core.StateOpen, "x")); err != nil {
		t.Fatalf("put after repair: %v", err)
	}
}
