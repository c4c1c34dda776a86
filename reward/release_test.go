package reward

import (
	"context"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// loaded says, per plugin of the current set, whether it holds compiled
// code or idle instances.
func loaded(t *testing.T, r *Runner) map[string]bool {
	t.Helper()
	s, err := r.acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer s.release()
	out := map[string]bool{}
	for _, p := range s.order {
		p.lmu.Lock()
		out[p.cfg.Name] = p.code != nil || len(p.free) > 0
		p.lmu.Unlock()
	}
	return out
}

func TestIdlePluginsReleasedAndScoreAgain(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var releases []int
	r := newTestRunner(t, Options{Plugins: Builtins(), ReleaseAfter: time.Hour, Now: clock.Now,
		OnRelease: func(n int) { releases = append(releases, n) }})
	ctx := context.Background()
	steps := readTestSteps(t)
	scoreAll := func() map[string]any {
		out := map[string]any{}
		for id, s := range steps {
			out[string(id)] = r.Score(ctx, s).Scores
		}
		return out
	}
	before := scoreAll()
	for name, ok := range loaded(t, r) {
		if !ok {
			t.Fatalf("plugin %s not loaded after scoring", name)
		}
	}
	if n := r.releaseIdle(ctx); n != 0 {
		t.Fatalf("released %d plugins used just now", n)
	}

	clock.Add(2 * time.Hour)
	n := r.releaseIdle(ctx)
	if n != len(builtin.Names()) || !reflect.DeepEqual(releases, []int{n}) {
		t.Fatalf("released %d plugins (OnRelease told %v), want all %d", n, releases, len(builtin.Names()))
	}
	for name, ok := range loaded(t, r) {
		if ok {
			t.Errorf("plugin %s still holds code or instances after its release", name)
		}
	}
	if n := r.releaseIdle(ctx); n != 0 {
		t.Fatalf("released %d plugins twice", n)
	}

	// Released plugins are made again on demand and score as before.
	after := scoreAll()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("scores changed after the plugins were released:\nbefore %+v\nafter  %+v", before, after)
	}
	got := loaded(t, r)
	for _, c := range Builtins() {
		if got[c.Name] != c.Enabled {
			t.Errorf("plugin %s (enabled %v) loaded %v after scoring again", c.Name, c.Enabled, got[c.Name])
		}
	}

	// A plugin with a call in progress is not released.
	s, _ := r.acquire()
	p := s.all["hint"]
	inst, err := p.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(2 * time.Hour)
	r.releaseIdle(ctx)
	if !loaded(t, r)["hint"] {
		t.Error("a plugin with a call in progress lost its code")
	}
	p.put(inst)
	p.done()
	s.release()
}

func TestReleasedPluginWhoseFileChanged(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	hint, err := builtin.Module("hint")
	if err != nil {
		t.Fatal(err)
	}
	path := writeWasm(t, "p", hint)
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Name: "p", Path: path, Enabled: true}}, ReleaseAfter: time.Hour, Now: clock.Now})
	ctx := context.Background()
	step := readTestSteps(t)["09-directive"]
	sc, _ := r.ScorePlugin(ctx, "p", step)
	if sc.Hint == "" {
		t.Fatalf("hint gave no hint: %+v", sc)
	}
	clock.Add(2 * time.Hour)
	if n := r.releaseIdle(ctx); n != 1 {
		t.Fatalf("released %d plugins, want 1", n)
	}
	other, err := builtin.Module("feedback")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, other, 0o644); err != nil {
		t.Fatal(err)
	}
	sc, _ = r.ScorePlugin(ctx, "p", step)
	if sc.Value != nil || !strings.Contains(sc.Reason, "has changed since the plugin was loaded") {
		t.Fatalf("a plugin whose file changed while released scored: %+v", sc)
	}
}
