package pool

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncCountFS counts the syncs of WAL files, to show group commit at work.
type syncCountFS struct {
	vfs.FS
	syncs *atomic.Int64
}

func (fs syncCountFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return syncCountFile{f, fs.syncs}, nil
}

func (fs syncCountFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs syncCountFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

type syncCountFile struct {
	vfs.File
	syncs *atomic.Int64
}

func (f syncCountFile) Sync() error     { f.syncs.Add(1); return f.File.Sync() }
func (f syncCountFile) SyncData() error { f.syncs.Add(1); return f.File.SyncData() }
func (f syncCountFile) SyncTo(n int64) (bool, error) {
	f.syncs.Add(1)
	return f.File.SyncTo(n)
}

// benchPool opens a pool on disk whose WAL syncs are counted.
func benchPool(b *testing.B) (*Pool, *atomic.Int64) {
	syncs := new(atomic.Int64)
	p := openTest(b, b.TempDir(), Options{FS: syncCountFS{vfs.Default, syncs}})
	return p, syncs
}

func reportPuts(b *testing.B, syncs *atomic.Int64, puts int64) {
	b.ReportMetric(float64(puts)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(float64(syncs.Load())/float64(puts), "fsyncs/step")
}

// BenchmarkPut: one writer, synced Puts of realistic steps (40k-character
// shared system prompt, 12 tools, growing history).
func BenchmarkPut(b *testing.B) {
	p, syncs := benchPool(b)
	gen := NewStepGen("b", 20)
	ctx := context.Background()
	syncs.Store(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.Put(ctx, gen.Step(i)); err != nil {
			b.Fatal(err)
		}
	}
	reportPuts(b, syncs, int64(b.N))
}

// BenchmarkPutParallel64: 64 concurrent writers, synced Puts. Compare
// fsyncs/step with BenchmarkPut: the writes waiting while a commit is on
// the disk share the next commit and its fsync (groupCommit).
func BenchmarkPutParallel64(b *testing.B) {
	p, syncs := benchPool(b)
	gen := NewStepGen("b", 20)
	ctx := context.Background()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((64 + procs - 1) / procs)
	var next, puts atomic.Int64
	syncs.Store(0)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := p.Put(ctx, gen.Step(int(next.Add(1)))); err != nil {
				b.Error(err)
				return
			}
			puts.Add(1)
		}
	})
	reportPuts(b, syncs, puts.Load())
}

// BenchmarkGet reads full steps back (blobs from Pebble's cache).
func BenchmarkGet(b *testing.B) {
	p, _ := benchPool(b)
	gen := NewStepGen("b", 20)
	ctx := context.Background()
	const n = 200
	for i := 0; i < n; i++ {
		if err := p.Put(ctx, gen.Step(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := p.Get(ctx, gen.Step(i%n).ID)
		if err != nil || len(s.Request.Messages) == 0 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
}

func TestBenchIngest(t *testing.T) {
	dir := t.TempDir()
	res, err := BenchIngest(context.Background(), dir, 4, 40)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 40 || res.Writers != 4 || res.Stats.Steps != 40 || res.StepsPerSec <= 0 ||
		res.P50 <= 0 || res.P99 < res.P50 {
		t.Fatalf("result %+v", res)
	}
	if res.Stats.MessagesReferenced <= res.Stats.MessagesStored {
		t.Fatalf("no sharing in the bench steps: %+v", res.Stats)
	}
	if _, err := BenchIngest(context.Background(), t.TempDir(), 0, 1); err == nil {
		t.Fatal("zero writers accepted")
	}
}

func TestStepGenSession(t *testing.T) {
	gen := NewStepGen("g", 5)
	steps := gen.Session(3, 7)
	if len(steps) != 5 {
		t.Fatalf("%d steps, want 5 (PerSession)", len(steps))
	}
	for i, s := range steps {
		a, _ := json.Marshal(s)
		b, _ := json.Marshal(gen.Step(15 + i))
		if string(a) != string(b) {
			t.Fatalf("step %d differs from Step(%d)", i, 15+i)
		}
	}
	if n := len(gen.Session(0, 2)); n != 2 {
		t.Fatalf("%d steps, want 2", n)
	}
}
