package adapters_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/swap"
)

// recordingDriver loads anything and remembers what, from where.
type recordingDriver struct {
	mu    sync.Mutex
	loads [][2]string // version, dir
}

func (d *recordingDriver) Kind() string { return "recording" }
func (d *recordingDriver) Load(_ context.Context, version, dir string) (swap.Target, error) {
	// The drivers' rule for version names.
	if err := swap.CheckVersion(version); err != nil {
		return swap.Target{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.loads = append(d.loads, [2]string{version, dir})
	return swap.Target{Version: version, Model: "m-" + version}, nil
}
func (d *recordingDriver) Base(context.Context) (swap.Target, error) {
	return swap.Target{Version: swap.BaseVersion}, nil
}
func (d *recordingDriver) Warm(context.Context, swap.Target) error   { return nil }
func (d *recordingDriver) Unload(context.Context, swap.Target) error { return nil }
func (d *recordingDriver) last() [2]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.loads) == 0 {
		return [2]string{}
	}
	return d.loads[len(d.loads)-1]
}

// layer is a personal adapter as the follower sees it.
type layer struct {
	mu        sync.Mutex
	name, dir string
	fail      error
	stacked   [][2]string // version, sharedDir
}

func (l *layer) Current() (string, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.name, l.dir
}
func (l *layer) Stacked(version, sharedDir, p, pdir string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail != nil {
		return "", l.fail
	}
	l.stacked = append(l.stacked, [2]string{version, sharedDir})
	return filepath.Join("/stacked", adapters.StackName(version, p)), nil
}
func (l *layer) set(name, dir string, fail error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.name, l.dir, l.fail = name, dir, fail
}

// TestPersonalStacked: with a personal version, the follower loads the
// shared version stacked with it (one adapter, named v1-p1), reports the
// two parts apart, and goes back to the shared version alone when the
// personal one is gone or does not stack.
func TestPersonalStacked(t *testing.T) {
	root := t.TempDir()
	cfg := native.TinyConfig(96)
	ad := filepath.Join(root, "v1")
	if err := native.WriteFreshAdapter(ad, cfg, native.LoRAConfig{}, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	wd, err := weights.OpenDir(filepath.Join(root, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	h := &held{dir: wd}
	h.latest.Store(h.hold(t, ad, 1))
	d := &recordingDriver{}
	l := &layer{name: "p1", dir: "/personal/p1"}
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(root, "adapters"), Weights: h, Driver: d, Retry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.SetPersonal(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wait := func(route string) adapters.Status {
		t.Helper()
		for range 2000 {
			if f.Route().Version == route {
				return f.Status()
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("route %q, want %q (status %+v)", f.Route().Version, route, f.Status())
		return adapters.Status{}
	}
	st := wait("v1-p1")
	if st.Serving != "v1" || st.Personal != "p1" {
		t.Fatalf("status serving %q personal %q, want v1 and p1", st.Serving, st.Personal)
	}
	if got := d.last(); got != [2]string{"v1-p1", "/stacked/v1-p1"} {
		t.Fatalf("loaded %v, want the stacked adapter", got)
	}
	if len(l.stacked) != 1 || l.stacked[0] != [2]string{"v1", f.VersionDir("v1")} {
		t.Fatalf("stacked on %v, want v1's installed directory", l.stacked)
	}

	l.set("", "", nil) // reset
	f.Notify()
	if st := wait("v1"); st.Personal != "" {
		t.Fatalf("personal %q after reset", st.Personal)
	}
	if got := d.last(); got != [2]string{"v1", f.VersionDir("v1")} {
		t.Fatalf("loaded %v, want v1 alone", got)
	}

	l.set("p2", "/personal/p2", errors.New("shapes differ"))
	f.Notify()
	time.Sleep(50 * time.Millisecond)
	if f.Route().Version != "v1" {
		t.Fatalf("route %q: a personal version that does not stack must leave the shared one serving", f.Route().Version)
	}
	l.set("p2", "/personal/p2", nil)
	f.Notify()
	wait("v1-p2")

	// Pinned to the base model, the personal adapter serves alone.
	if err := f.Pin(adapters.Base); err != nil {
		t.Fatal(err)
	}
	wait("base-p2")
	if got := d.last(); got != [2]string{"base-p2", "/personal/p2"} {
		t.Fatalf("loaded %v, want the personal adapter alone on the base", got)
	}
}
