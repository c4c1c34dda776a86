package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/clawmesh/clawmesh/internal/core"
)

// diskFault injects err into the writes (and syncs, creations) of files
// whose names end in one of suffixes, while on.
type diskFault struct {
	on       atomic.Bool
	err      error
	suffixes []string
	hits     atomic.Int64
}

func (f *diskFault) MaybeError(op errorfs.Op) error {
	if !f.on.Load() {
		return nil
	}
	switch op.Kind {
	case errorfs.OpCreate, errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFileSync, errorfs.OpFileSyncData,
		errorfs.OpFileSyncTo, errorfs.OpFilePreallocate, errorfs.OpReuseForWrite:
	default:
		return nil
	}
	for _, s := range f.suffixes {
		if strings.HasSuffix(op.Path, s) {
			f.hits.Add(1)
			return f.err
		}
	}
	return nil
}

func (f *diskFault) String() string { return fmt.Sprintf("%v on %v", f.err, f.suffixes) }

// within runs fn and fails the test if it has not returned after limit: a
// watchdog against hangs, not a measure of speed.
func within(t *testing.T, limit time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("%s hung (no return after %v)", what, limit)
	}
}

// waitRecording polls Health until the pool records again (bounded).
func waitRecording(t *testing.T, p *Pool) {
	t.Helper()
	for i := 0; i < 600; i++ {
		if p.Health().Recording {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("recording did not resume: %+v", p.Health())
}

// TestDiskFaults: ENOSPC and EIO on the WAL and on flushes, and a
// read-only or vanished filesystem, in the middle of concurrent writes. No
// write hangs; the failed ones report ErrPaused and Health says why;
// recording resumes by itself once the fault clears; and the pool, opened
// again from disk, holds every step a write acknowledged.
func TestDiskFaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		suffixes []string
		flush    bool // force a flush while the fault is on
	}{
		{"ENOSPC on the WAL", syscall.ENOSPC, []string{".log"}, false},
		{"EIO on the WAL", syscall.EIO, []string{".log"}, false},
		{"ENOSPC on flushes", syscall.ENOSPC, []string{".sst"}, true},
		{"EIO on flushes", syscall.EIO, []string{".sst"}, true},
		// A filesystem remounted read-only, and one whose device is gone.
		{"EROFS on the WAL", syscall.EROFS, []string{".log"}, false},
		{"ENXIO on flushes", syscall.ENXIO, []string{".sst"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			fault := &diskFault{err: tc.err, suffixes: tc.suffixes}
			p, err := Open(dir, Options{FS: errorfs.Wrap(vfs.Default, fault), ReopenInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if p != nil {
					p.Close()
				}
			}()
			var mu sync.Mutex
			var acked []core.StepID
			var refused atomic.Int64
			write := func(w, i int) {
				id := core.StepID(fmt.Sprintf("w%d-%04d", w, i))
				err := p.Put(ctx, simpleStep(id, core.SessionID(fmt.Sprintf("s%d", w)), t0.Add(time.Duration(i)*time.Millisecond), core.StateOpen, string(id)))
				switch {
				case err == nil:
					mu.Lock()
					acked = append(acked, id)
					mu.Unlock()
				case errors.Is(err, ErrPaused):
					refused.Add(1)
				default:
					t.Errorf("put %s: %v, want nil or ErrPaused", id, err)
				}
			}
			run := func(from, to int) {
				var wg sync.WaitGroup
				for w := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := from; i < to; i++ {
							write(w, i)
						}
					}()
				}
				wg.Wait()
			}
			within(t, time.Minute, "writes before the fault", func() { run(0, 20) })
			fault.on.Store(true)
			within(t, time.Minute, "writes during the fault", func() {
				if tc.flush {
					p.mu.Lock()
					in := p.cur
					p.mu.Unlock()
					if in != nil {
						_, _ = in.db.AsyncFlush()
					}
				}
				run(20, 60)
			})
			if fault.hits.Load() == 0 {
				t.Fatal("the fault was never hit: the test proves nothing")
			}
			h := p.Health()
			if h.Recording || !strings.Contains(h.Paused, tc.err.Error()) {
				t.Fatalf("health during the fault: %+v, want paused with %q", h, tc.err)
			}
			if refused.Load() == 0 {
				t.Fatal("no write was refused during the fault")
			}
			fault.on.Store(false)
			within(t, time.Minute, "recovery", func() { waitRecording(t, p) })
			within(t, time.Minute, "writes after the fault", func() { run(60, 70) })
			if err := p.Close(); err != nil {
				t.Logf("close: %v", err)
			}
			p = nil

			// Every acknowledged step is on disk.
			q := openTest(t, dir, Options{})
			for _, id := range acked {
				if _, err := q.Get(ctx, id); err != nil {
					t.Errorf("acknowledged step %s lost: %v", id, err)
				}
			}
			t.Logf("%d writes acknowledged, %d refused", len(acked), refused.Load())
		})
	}
}

// freeSpaceFS reports free as the free space of its filesystem.
type freeSpaceFS struct {
	vfs.FS
	free atomic.Int64
}

func (f *freeSpaceFS) GetDiskUsage(path string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: uint64(f.free.Load()), TotalBytes: 100 << 30}, nil
}

// TestFreeSpaceGuard: below MinFree free bytes writes are refused with
// ErrPaused (reads go on), retention drops shipped steps to make room, and
// writes resume above MinFree and a quarter, not before.
func TestFreeSpaceGuard(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	clock := func() time.Time { return now }
	fs := &freeSpaceFS{FS: vfs.Default}
	fs.free.Store(10 << 30)
	p := openTest(t, t.TempDir(), Options{FS: fs, MinFree: 1 << 30, Now: clock})
	for i, st := range []core.State{core.StateOpen, core.StateScored} {
		if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprint("a", i)), "s", t0.Add(time.Duration(i)*time.Second), st, "x")); err != nil {
			t.Fatal(err)
		}
	}
	b, err := p.Seal(ctx, SealSpec{Steps: []core.StepID{"a1"}, Payload: []byte("payload")})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.MarkShipped(ctx, b.ID); err != nil {
		t.Fatal(err)
	}

	fs.free.Store(512 << 20)
	now = now.Add(2 * time.Second) // the guard looks at most once a second
	if err := p.Put(ctx, simpleStep("b", "s", t0, core.StateOpen, "b")); !errors.Is(err, ErrPaused) {
		t.Fatalf("put below the low-water mark: %v, want ErrPaused", err)
	}
	if h := p.Health(); h.Recording || !strings.Contains(h.Paused, "low disk space") || h.FreeBytes != 512<<20 {
		t.Fatalf("health %+v", h)
	}
	if _, err := p.Get(ctx, "a0"); err != nil {
		t.Fatalf("reads stop with writes: %v", err)
	}
	if n, err := p.ApplyRetention(ctx); err != nil || n != 1 {
		t.Fatalf("retention under low space dropped %d, %v; want the shipped step", n, err)
	}
	if _, err := p.Get(ctx, "a1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("shipped step after retention under low space: %v", err)
	}
	if _, err := p.Get(ctx, "a0"); err != nil {
		t.Fatalf("an unshipped step was dropped: %v", err)
	}

	fs.free.Store(1<<30 + 100<<20) // above the low mark, under the high one
	now = now.Add(2 * time.Second)
	if err := p.Put(ctx, simpleStep("b", "s", t0, core.StateOpen, "b")); !errors.Is(err, ErrPaused) {
		t.Fatalf("put between the marks: %v, want ErrPaused", err)
	}
	fs.free.Store(2 << 30)
	now = now.Add(2 * time.Second)
	if err := p.Put(ctx, simpleStep("b", "s", t0, core.StateOpen, "b")); err != nil {
		t.Fatalf("put above the high-water mark: %v", err)
	}
	if h := p.Health(); !h.Recording || h.Paused != "" {
		t.Fatalf("health after: %+v", h)
	}
}

// TestPebbleErrorsThrottled: Pebble's error lines reach the log at most
// pebbleErrorsPerMinute a minute; the next line let through says how many
// were left out.
func TestPebbleErrorsThrottled(t *testing.T) {
	now := t0
	var buf bytes.Buffer
	l := pebbleLogger{log: slog.New(slog.NewTextHandler(&buf, nil)), limit: &logLimit{now: func() time.Time { return now }}}
	for i := range 100 {
		l.Errorf("write failed %d", i)
	}
	if got := strings.Count(buf.String(), "write failed"); got != pebbleErrorsPerMinute {
		t.Fatalf("%d lines logged in a minute, want %d", got, pebbleErrorsPerMinute)
	}
	now = now.Add(time.Minute)
	l.Errorf("write failed again")
	if !strings.Contains(buf.String(), "write failed again") || !strings.Contains(buf.String(), fmt.Sprintf("left_out=%d", 100-pebbleErrorsPerMinute)) {
		t.Fatalf("the next minute's first line does not count those left out:\n%s", buf.String())
	}
}

// TestCrashAnyPoint: a crash (as kill -9, or the power going) at any
// point of a load during which the WAL's disk fails and comes back keeps
// every step a write acknowledged. The pool runs on Pebble's crashable
// in-memory filesystem; at points chosen by a seed (printed, to replay a
// failure) the test takes a crash image of it, keeping a random share of
// what was written but not synced, and opens a pool on each image.
func TestCrashAnyPoint(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	fault := &diskFault{err: syscall.ENOSPC, suffixes: []string{".log"}}
	p, err := Open("pool", Options{FS: errorfs.Wrap(mem, fault), ReopenInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	var mu sync.Mutex
	acked := map[core.StepID]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := core.StepID(fmt.Sprintf("w%d-%05d", w, i))
				s := simpleStep(id, core.SessionID(fmt.Sprintf("s%d", w)), t0.Add(time.Duration(i)*time.Millisecond), core.StateOpen, string(id))
				err := p.Put(ctx, s)
				switch {
				case err == nil:
					mu.Lock()
					acked[id] = true
					mu.Unlock()
				case errors.Is(err, ErrPaused):
					time.Sleep(time.Millisecond) // the store is being reopened
				default:
					t.Errorf("put %s: %v, want nil or ErrPaused", id, err)
					return
				}
			}
		}()
	}
	type image struct {
		fs    *vfs.MemFS
		acked []core.StepID
		fault bool
	}
	var images []image
	for i := range 12 {
		time.Sleep(time.Duration(5+rng.IntN(40)) * time.Millisecond)
		// The disk fails for the middle third of the crash points; the
		// last third are taken once recording has resumed.
		fault.on.Store(i >= 4 && i < 8)
		if i == 8 {
			within(t, time.Minute, "recovery", func() { waitRecording(t, p) })
		}
		mu.Lock()
		before := make([]core.StepID, 0, len(acked))
		for id := range acked {
			before = append(before, id)
		}
		mu.Unlock()
		clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
		images = append(images, image{clone, before, fault.on.Load()})
	}
	close(stop)
	within(t, time.Minute, "the writers", wg.Wait)
	if fault.hits.Load() == 0 {
		t.Fatal("the fault was never hit: the test proves nothing")
	}
	for i, im := range images {
		q, err := Open("pool", Options{FS: im.fs})
		if err != nil {
			t.Fatalf("crash image %d (disk failing: %v): open: %v", i, im.fault, err)
		}
		lost := 0
		for _, id := range im.acked {
			if _, err := q.Get(ctx, id); err != nil {
				if lost++; lost <= 3 {
					t.Errorf("crash image %d (disk failing: %v): acknowledged step %s lost: %v", i, im.fault, id, err)
				}
			}
		}
		t.Logf("crash image %d (disk failing: %v): %d acknowledged steps, %d lost", i, im.fault, len(im.acked), lost)
		q.Close()
	}
	if first, last := images[4], images[len(images)-1]; len(last.acked) <= len(first.acked) {
		t.Errorf("no write was acknowledged after the disk came back (%d, then %d)", len(first.acked), len(last.acked))
	}
}

// TestLowSpaceRetentionFreesDisk: under the free-space guard, retention
// drops the shipped steps and gives their space on disk back (their
// tables are rewritten without them), not only hides them.
func TestLowSpaceRetentionFreesDisk(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	fs := &freeSpaceFS{FS: vfs.Default}
	fs.free.Store(10 << 30)
	p := openTest(t, t.TempDir(), Options{FS: fs, MinFree: 1 << 30, Now: func() time.Time { return now }})
	rng := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string { // incompressible
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a' + byte(rng.IntN(26))
		}
		return string(b)
	}
	const steps = 200
	for i := range steps {
		st := core.StateShipped
		if i%10 == 0 {
			st = core.StateScored // kept: it has not left the device
		}
		if err := p.Put(ctx, simpleStep(core.StepID(fmt.Sprintf("a%03d", i)), "s", t0.Add(time.Duration(i)*time.Second), st, text(20<<10))); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.Lock()
	in := p.cur
	p.mu.Unlock()
	if err := in.db.Flush(); err != nil {
		t.Fatal(err)
	}
	disk := func() int64 { // the tables' bytes: the WAL's are bounded by the memtable
		return in.db.Metrics().Total().TablesSize
	}
	before := disk()
	fs.free.Store(512 << 20)
	now = now.Add(2 * time.Second) // the guard looks at most once a second
	n, err := p.ApplyRetention(ctx)
	if err != nil || n != steps-steps/10 {
		t.Fatalf("retention under low space dropped %d, %v; want the %d shipped steps", n, err, steps-steps/10)
	}
	after := disk()
	t.Logf("tables: %d bytes before, %d after", before, after)
	if after > before/4 {
		t.Fatalf("retention dropped 90%% of the steps but the pool's tables still take %d of %d bytes", after, before)
	}
	for i := 0; i < steps; i += 10 {
		if _, err := p.Get(ctx, core.StepID(fmt.Sprintf("a%03d", i))); err != nil {
			t.Fatalf("a step not shipped was dropped: %v", err)
		}
	}
}
