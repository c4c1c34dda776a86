package pool

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// gateFS holds the next WAL sync, once armed, until it is released.
type gateFS struct {
	vfs.FS
	g *gate
}

type gate struct {
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // closed when the held sync starts
	release chan struct{} // closing it lets the held sync go on
}

func (g *gate) arm() {
	g.mu.Lock()
	g.armed = true
	g.entered = make(chan struct{})
	g.release = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) wait() {
	g.mu.Lock()
	if !g.armed {
		g.mu.Unlock()
		return
	}
	g.armed = false
	entered, release := g.entered, g.release
	g.mu.Unlock()
	close(entered)
	<-release
}

func (fs gateFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return gateFile{f, fs.g}, nil
}

func (fs gateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs gateFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

type gateFile struct {
	vfs.File
	g *gate
}

func (f gateFile) Sync() error     { f.g.wait(); return f.File.Sync() }
func (f gateFile) SyncData() error { f.g.wait(); return f.File.SyncData() }
func (f gateFile) SyncTo(n int64) (bool, error) {
	f.g.wait()
	return f.File.SyncTo(n)
}

// Synced writes that arrive while the commits in flight wait on the disk
// are committed together, in one commit with one sync, when one of them is
// done; each returns only after a sync that covers it, and all of them
// survive a crash.
func TestGroupCommitSharesOneSync(t *testing.T) {
	mem := vfs.NewCrashableMem()
	g := new(gate)
	p := openTest(t, "/pool", Options{FS: gateFS{mem, g}})
	ctx := context.Background()
	gen := NewStepGen("g", 1)
	if err := p.Put(ctx, gen.Step(0)); err != nil { // the shared blobs are stored
		t.Fatal(err)
	}
	in, done, err := p.enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done()
	commits := func() int {
		in.group.mu.Lock()
		defer in.group.mu.Unlock()
		return in.group.commits
	}
	queued := func() int {
		in.group.mu.Lock()
		defer in.group.mu.Unlock()
		return len(in.group.queue)
	}
	before := commits()

	g.arm()
	const n = 8
	errs := make(chan error, n+1)
	returned := make(chan struct{}, n+1)
	put := func(i int) {
		errs <- p.Put(ctx, gen.Step(i))
		returned <- struct{}{}
	}
	// Steps on distinct write locks (stripes), so that none waits for
	// another's lock rather than for the commit.
	ids := []int{1}
	used := map[uint64]bool{p.stripeIndex(gen.Step(1).ID): true}
	for i := 2; len(ids) < 1+n; i++ {
		if k := p.stripeIndex(gen.Step(i).ID); !used[k] {
			used[k] = true
			ids = append(ids, i)
		}
	}
	go put(ids[0])
	<-g.entered // the first write's sync is held
	for _, i := range ids[1:] {
		go put(i)
	}
	// The first groupsInFlight-1 of them commit at once (Pebble holds
	// them behind the sync); the others queue.
	wantQueued := n - (groupsInFlight - 1)
	for tries := 0; queued() < wantQueued; tries++ {
		if tries == 10000 {
			t.Fatalf("%d writes queued behind the commits in progress, want %d", queued(), wantQueued)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-returned:
		t.Fatal("a write returned before its sync")
	default:
	}
	close(g.release)
	for i := 0; i < n+1; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got, want := commits()-before, groupsInFlight+1; got != want {
		t.Fatalf("%d commits for the held write and %d more, want %d", got, n, want)
	}

	crashed, err := Open("/pool", Options{FS: mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})})
	if err != nil {
		t.Fatal(err)
	}
	defer crashed.Close()
	for _, i := range append([]int{0}, ids...) {
		s, err := crashed.Get(ctx, gen.Step(i).ID)
		if err != nil {
			t.Fatalf("step %d after a crash: %v", i, err)
		}
		if len(s.Request.Messages) != 2 {
			t.Fatalf("step %d after a crash: %d messages", i, len(s.Request.Messages))
		}
	}
}
