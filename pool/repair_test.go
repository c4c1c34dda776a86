package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/batchrepr"

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
	// Damage the largest WAL segment in its middle, and note which steps'
	// records touch the damaged 32 KiB block: those are the only ones the
	// repair may lose.
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var wal string
	var size int64
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.Size() > size {
			wal, size = l, fi.Size()
		}
	}
	if size < 4*walBlock {
		t.Fatalf("WAL files %v: none spans several blocks", logs)
	}
	spans := walSpans(t, wal)
	at := size / 2
	blockStart := at / walBlock * walBlock
	mayLose := map[core.StepID]bool{}
	after := 0 // steps written wholly after the damaged block
	for _, sp := range spans {
		if sp.end > blockStart && sp.start < blockStart+walBlock {
			for _, id := range sp.ids {
				mayLose[id] = true
			}
		} else if sp.start >= blockStart+walBlock {
			after += len(sp.ids)
		}
	}
	if len(mayLose) == 0 || after == 0 {
		t.Fatalf("the damaged block at %d holds steps %v, %d after it: the test needs both", blockStart, mayLose, after)
	}
	f, err := os.OpenFile(wal, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 32), at); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if _, err := Open(dir, Options{}); !errors.Is(err, ErrDamaged) ||
		!strings.Contains(err.Error(), "the write-ahead log segment "+filepath.Base(wal)+" is damaged") || !strings.Contains(err.Error(), "clawmesh pool repair") {
		t.Fatalf("Open of a damaged pool: %v, want ErrDamaged naming %s and saying what to do", err, filepath.Base(wal))
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
	if rep.BadWALRecords != 1 || rep.Steps >= n || rep.Steps < n-len(mayLose) {
		t.Fatalf("repair report %+v: want one damaged stretch, and at most the %d steps of the damaged block lost", rep, len(mayLose))
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
	got := map[core.StepID]bool{}
	for _, s := range steps {
		got[s.ID] = true
		if len(s.Request.Messages) != 2 || !strings.HasSuffix(s.Request.Messages[1].Content, strings.Repeat("x", 500)) || s.Action().Content == "" {
			t.Errorf("salvaged step %s is not whole", s.ID)
		}
	}
	for i := range n {
		id := core.StepID(fmt.Sprintf("s%04d", i))
		if !got[id] && !mayLose[id] {
			t.Errorf("step %s, outside the damaged block, was not salvaged", id)
		}
	}
	if err := sp.Put(ctx, simpleStep("new", "s", t0, core.StateOpen, "x")); err != nil {
		t.Fatalf("put after repair: %v", err)
	}
}

// walBlock is the size of Pebble's WAL blocks.
const walBlock = 32 << 10

// walSpan is where one WAL record lies in its file, and the steps it writes.
type walSpan struct {
	start, end int64
	ids        []core.StepID
}

// walSpans reads an undamaged WAL file record by record.
func walSpans(t *testing.T, path string) []walSpan {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	num, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".log"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	rr := newRecordReader(bytes.NewReader(data), num)
	var spans []walSpan
	for range 1 << 20 {
		start := rr.Offset()
		r, err := rr.Next()
		if errors.Is(err, io.EOF) {
			return spans
		}
		if err != nil {
			t.Fatalf("reading the undamaged WAL: %v", err)
		}
		rec, err := io.ReadAll(r)
		if err != nil {
			t.Fatalf("reading the undamaged WAL: %v", err)
		}
		sp := walSpan{start: start, end: rr.Offset()}
		br := batchrepr.Read(rec)
		for {
			_, k, _, ok, err := br.Next()
			if err != nil || !ok {
				break
			}
			if bytes.HasPrefix(k, prefixStep) {
				sp.ids = append(sp.ids, core.StepID(k[len(prefixStep):]))
			}
		}
		spans = append(spans, sp)
	}
	t.Fatal("the WAL has too many records")
	return nil
}

// TestRepairDamagedTable: 32 bytes overwritten in the middle of a table.
// Reading the damaged range fails and says so (the pool stops recording,
// Health says damaged, and recording does not come back while the table is
// damaged); Repair salvages every step outside the damaged block and the
// pool records again.
func TestRepairDamagedTable(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pool")
	p, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	for i := range n {
		s := simpleStep(core.StepID(fmt.Sprintf("s%04d", i)), "sess", t0.Add(time.Duration(i)*time.Second), core.StateOpen, fmt.Sprintf("%d %s", i, randomText(i, 400)))
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.cur.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	var table string
	var size int64
	for _, tb := range tables {
		if fi, err := os.Stat(tb); err == nil && fi.Size() > size {
			table, size = tb, fi.Size()
		}
	}
	if size < 64<<10 {
		t.Fatalf("tables %v: none is large enough to damage in its middle", tables)
	}
	f, err := os.OpenFile(table, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 32), size/3); err != nil {
		t.Fatal(err)
	}
	f.Close()

	sp, err := OpenServing(dir, Options{ReopenInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Verify(ctx); !errors.Is(err, ErrDamaged) {
		t.Fatalf("Verify of a pool with a damaged table: %v, want ErrDamaged", err)
	}
	h := sp.Health()
	if h.Recording || !h.Damaged || !strings.Contains(h.Paused, "the table "+filepath.Base(table)+" is damaged") || !strings.Contains(h.Paused, "clawmesh pool repair") {
		t.Fatalf("health after reading the damaged table %s: %+v", filepath.Base(table), h)
	}
	time.Sleep(200 * time.Millisecond) // several reopen attempts
	if h := sp.Health(); h.Recording || !h.Damaged {
		t.Fatalf("recording resumed on a pool whose table is still damaged: %+v", h)
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
	// A table block holds a few steps' records, or a few messages: at most
	// a handful of steps may be lost.
	if len(rep.Problems) == 0 || rep.Steps >= n || rep.Steps < n-20 {
		t.Fatalf("repair report %+v: want the damage reported and all but a few of %d steps salvaged", rep, n)
	}
	waitRecording(t, sp)
	defer sp.Close()
	steps, err := sp.List(ctx, Filter{})
	if err != nil || len(steps) != rep.Steps {
		t.Fatalf("the repaired pool lists %d steps (%v), the report says %d", len(steps), err, rep.Steps)
	}
	last := core.StepID(fmt.Sprintf("s%04d", n-1))
	if _, err := sp.Get(ctx, last); err != nil {
		t.Errorf("the last step was not salvaged: %v", err)
	}
	if err := sp.Put(ctx, simpleStep("new", "s", t0, core.StateOpen, "x")); err != nil {
		t.Fatalf("put after repair: %v", err)
	}
}

// randomText is n letters that do not compress much, seeded by i.
func randomText(i, n int) string {
	r := rand.New(rand.NewPCG(uint64(i), 1))
	b := make([]byte, n)
	for j := range b {
		b[j] = 'a' + byte(r.IntN(26))
	}
	return string(b)
}
