package adapters_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/serve/servetest"
	"github.com/clawmesh/clawmesh/node/adapters"
)

// The child half of TestInstallCrash: it installs v2 beside an installed
// v1 and dies (exit, no clean-up) at the step CLAWMESH_CRASH_AT names.
func TestInstallCrashChild(t *testing.T) {
	root, at := os.Getenv("CLAWMESH_CRASH_DIR"), os.Getenv("CLAWMESH_CRASH_AT")
	if root == "" {
		t.Skip("run by TestInstallCrash")
	}
	f, h := openFollower(t, root)
	adapters.SetStepHook(f, func(step string) {
		if step == at {
			os.Exit(3)
		}
	})
	if _, err := f.Get(context.Background(), h.manifest(t, 2)); err != nil {
		t.Fatal(err)
	}
	os.Exit(4) // the step was never reached
}

// openFollower opens a follower over the bundles held in root.
func openFollower(t *testing.T, root string) (*adapters.Follower, *held) {
	t.Helper()
	wd, err := weights.OpenDir(filepath.Join(root, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	h := &held{dir: wd}
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(root, "adapters"), Weights: h})
	if err != nil {
		t.Fatal(err)
	}
	return f, h
}

// manifest returns the held manifest of version v.
func (h *held) manifest(t *testing.T, v uint64) *chunks.Manifest {
	t.Helper()
	for _, m := range h.dir.Held() {
		if m.Version == v {
			return m
		}
	}
	t.Fatalf("v%d is not held", v)
	return nil
}

// TestInstallCrash kills an install at each of its steps (a child process
// that exits on the spot) and checks that what is left is servable: v1
// intact, v2 either absent or whole, no temporary directory once a
// follower opens the directory again, and v2 installable after.
func TestInstallCrash(t *testing.T) {
	tiny := servetest.Start(t, "", 1)
	v1dir, v2dir := tiny.Adapter(t, 1, 0.1), tiny.Adapter(t, 2, 0.1)
	for _, step := range []string{"made", "unpacked", "renamed", "synced"} {
		t.Run(step, func(t *testing.T) {
			root := t.TempDir()
			f, h := openFollower(t, root)
			m1, m2 := h.hold(t, v1dir, 1), h.hold(t, v2dir, 2)
			if _, err := f.Get(context.Background(), m1); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestInstallCrashChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "CLAWMESH_CRASH_DIR="+root, "CLAWMESH_CRASH_AT="+step)
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Fatalf("the child did not die at %s: %v\n%s", step, err, out)
			}

			f, _ = openFollower(t, root)
			ents, _ := os.ReadDir(filepath.Join(root, "adapters"))
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".install-") {
					t.Errorf("a temporary directory survived: %s", e.Name())
				}
			}
			for _, m := range []*chunks.Manifest{m1, m2} {
				dir := f.VersionDir(m.Name())
				if _, err := os.Stat(dir); err != nil {
					if m == m1 {
						t.Fatalf("v1 is gone: %v", err)
					}
					continue
				}
				b, err := weights.Pack(dir)
				if err != nil {
					t.Fatalf("%s is there but not whole: %v", m.Name(), err)
				}
				if m2b, _ := chunks.NewManifest(b); m2b.Bundle != m.Bundle {
					t.Fatalf("%s is there but differs from its bundle", m.Name())
				}
			}
			if _, err := f.Get(context.Background(), m2); err != nil {
				t.Fatalf("installing v2 after the crash: %v", err)
			}
		})
	}
}

// TestKeepsNewest: once a version serves, versions older than the newest
// Keep go (bundle and installed copy), but never the one serving.
func TestKeepsNewest(t *testing.T) {
	tiny := servetest.Start(t, "", 1)
	root := t.TempDir()
	wd, err := weights.OpenDir(filepath.Join(root, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	h := &held{dir: wd}
	var ms []*chunks.Manifest
	for v := range 4 {
		ms = append(ms, h.hold(t, tiny.Adapter(t, v+1, 0.1), uint64(v+1)))
	}
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(root, "adapters"), Weights: h, Keep: 1, Retry: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	check := func(serve string, held, installed []string) {
		t.Helper()
		var got []string
		state := func() bool {
			got = got[:0]
			for _, m := range wd.Held() {
				got = append(got, m.Name())
			}
			if f.Status().Serving != serve || !slices.Equal(got, held) {
				return false
			}
			for _, m := range ms {
				_, err := os.Stat(f.VersionDir(m.Name()))
				if (err == nil) != slices.Contains(installed, m.Name()) {
					return false
				}
			}
			return true
		}
		for end := time.Now().Add(time.Minute); !state(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("want %s serving, %v held and %v installed (keep 1); serving %s, held %v", serve, held, installed, f.Status().Serving, got)
			}
		}
	}
	h.latest.Store(ms[0])
	f.Notify()
	check("v1", []string{"v4", "v1"}, []string{"v1"})
	h.latest.Store(ms[3])
	f.Notify()
	check("v4", []string{"v4"}, []string{"v4"})
}
