package adapters_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/swap"
)

// countingDriver loads anything and counts the loads.
type countingDriver struct{ loads atomic.Int32 }

func (d *countingDriver) Kind() string { return "counting" }
func (d *countingDriver) Load(_ context.Context, version, _ string) (swap.Target, error) {
	d.loads.Add(1)
	return swap.Target{Version: version, Model: "m-" + version}, nil
}
func (d *countingDriver) Base(context.Context) (swap.Target, error) {
	return swap.Target{Version: swap.BaseVersion}, nil
}
func (d *countingDriver) Warm(context.Context, swap.Target) error   { return nil }
func (d *countingDriver) Unload(context.Context, swap.Target) error { return nil }

// TestRefusesAnotherBase: a version trained on the tiny base is loaded
// into a server that serves the tiny base, and refused, never loaded,
// where the server serves another model; the status says why.
func TestRefusesAnotherBase(t *testing.T) {
	root := t.TempDir()
	cfg := native.TinyConfig(96)
	tiny, other, ad := filepath.Join(root, "tiny"), filepath.Join(root, "other"), filepath.Join(root, "v1")
	if err := native.CreateTiny(tiny, cfg, 1); err != nil {
		t.Fatal(err)
	}
	deeper := cfg
	deeper.Layers = 3
	if err := native.CreateTiny(other, deeper, 1); err != nil {
		t.Fatal(err)
	}
	if err := native.WriteFreshAdapter(ad, cfg, native.LoRAConfig{}, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, served string
		ok           bool
	}{{"same base", tiny, true}, {"another base", other, false}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			wd, err := weights.OpenDir(filepath.Join(dir, "weights"))
			if err != nil {
				t.Fatal(err)
			}
			h := &held{dir: wd}
			h.latest.Store(h.hold(t, ad, 1))
			d := &countingDriver{}
			f, err := adapters.New(adapters.Config{Dir: filepath.Join(dir, "adapters"), Weights: h, Driver: swap.WithBaseFile(d, c.served), Retry: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { f.Run(ctx); close(done) }()
			var st adapters.Status
			for range 2000 {
				st = f.Status()
				if st.Serving == "v1" || st.Error != "" {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			<-done
			if c.ok {
				if st.Serving != "v1" || d.loads.Load() != 1 {
					t.Fatalf("serving %q after %d loads: %+v", st.Serving, d.loads.Load(), st)
				}
				return
			}
			if st.Serving == "v1" || d.loads.Load() != 0 {
				t.Fatalf("a version of another base was loaded (%d loads), serving %q", d.loads.Load(), st.Serving)
			}
			failed := ""
			for _, v := range st.Versions {
				if v.Version == "v1" {
					failed = v.Failed
				}
			}
			for _, want := range []string{"another base", "3 layers", "2 layers"} {
				if !strings.Contains(failed, want) {
					t.Errorf("v1's failure %q does not say %q", failed, want)
				}
			}
		})
	}
}
