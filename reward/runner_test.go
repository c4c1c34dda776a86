package reward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

func TestDeterminism(t *testing.T) {
	path := hostilePlugin(t)
	cfg := []PluginConfig{{Name: "h", Path: path, Enabled: true}}
	labels := func(r *Runner, mode string) []string {
		sc := scoreWithin(t, r, "h", stepSaying(mode))
		if sc.Reason != mode || len(sc.Labels) == 0 {
			t.Fatalf("%s: %+v", mode, sc)
		}
		return sc.Labels
	}
	// Clock and random bytes come from the host and are the same for every
	// call, on a reused instance and on a fresh runner.
	r1 := newTestRunner(t, Options{Plugins: cfg})
	first := labels(r1, "clock")
	for i := 0; i < 3; i++ {
		labels(r1, "mathrand") // moves guest-side state along
		if got := labels(r1, "clock"); !reflect.DeepEqual(got, first) {
			t.Fatalf("call %d: %v, first %v", i, got, first)
		}
	}
	if !strings.HasPrefix(first[1], "2022-01-01T00:00:00") {
		t.Errorf("wall clock %q, want the fixed epoch", first[1])
	}
	r2 := newTestRunner(t, Options{Plugins: cfg})
	if got := labels(r2, "clock"); !reflect.DeepEqual(got, first) {
		t.Fatalf("second runner: %v, first %v", got, first)
	}
	// With fresh instances, state kept in the guest does not survive either.
	r3 := newTestRunner(t, Options{Plugins: cfg, FreshInstances: true})
	m0, c0 := labels(r3, "mathrand"), labels(r3, "counter")
	for i := 0; i < 3; i++ {
		if m, c := labels(r3, "mathrand"), labels(r3, "counter"); !reflect.DeepEqual(m, m0) || !reflect.DeepEqual(c, c0) {
			t.Fatalf("fresh instances: %v %v, first %v %v", m, c, m0, c0)
		}
	}
	// Built-ins give the same score on every run.
	steps := readTestSteps(t)
	b := newTestRunner(t, Options{Plugins: Builtins()})
	for id, s := range steps {
		x, y := b.Score(context.Background(), s), b.Score(context.Background(), s)
		x.At, y.At = time.Time{}, time.Time{}
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("%s: %+v then %+v", id, x, y)
		}
	}
}

func TestCombine(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	at := time.Unix(100, 0)
	cases := []struct {
		name   string
		scores []core.Score
		value  *float64
		hint   string
	}{
		{"all abstain", []core.Score{{Weight: 1}, {Weight: 2, Hint: "h"}}, nil, "h"},
		{"weighted sum", []core.Score{{Value: f(0.5), Weight: 1}, {Value: f(-0.1), Weight: 2}, {Weight: 5}}, f(0.3), ""},
		{"clamped", []core.Score{{Value: f(0.8), Weight: 1}, {Value: f(0.9), Weight: 1}}, f(1), ""},
		{"clamped low", []core.Score{{Value: f(-1), Weight: 3}}, f(-1), ""},
		{"hint by weight", []core.Score{{Hint: "light", Weight: 0.5}, {Hint: "", Weight: 3}, {Hint: "heavy", Weight: 2}, {Hint: "tie", Weight: 2}}, nil, "heavy"},
	}
	for _, c := range cases {
		rw := Combine(c.scores, at)
		if (rw.Value == nil) != (c.value == nil) || rw.Value != nil && fmt.Sprintf("%.6f", *rw.Value) != fmt.Sprintf("%.6f", *c.value) {
			t.Errorf("%s: value %v, want %v", c.name, fmtVal(rw.Value), fmtVal(c.value))
		}
		if rw.Hint != c.hint || !rw.At.Equal(at) || len(rw.Scores) != len(c.scores) {
			t.Errorf("%s: %+v", c.name, rw)
		}
	}
}

func TestReload(t *testing.T) {
	ctx := context.Background()
	constPath := writeWasm(t, "const", wasmConst)
	loop := writeWasm(t, "loop", wasmLoop)
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: constPath, Enabled: true}}})
	step := stepSaying("hi")
	if rw := r.Score(ctx, step); rw.Value == nil || *rw.Value != 0.5 || rw.Scores[0].Plugin != "const" {
		t.Fatalf("before reload: %+v", rw)
	}
	// Calls in flight on the old set finish on it while the new set is swapped in.
	var wg sync.WaitGroup
	var scored atomic.Int32
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				if rw := r.Score(ctx, step); len(rw.Scores) == 1 {
					scored.Add(1)
				}
			}
		}()
	}
	if err := r.Reload(ctx, []PluginConfig{
		{Path: constPath, Enabled: true, Weight: 2},
		{Name: "off", Path: loop, Enabled: false},
		{Builtin: "feedback", Enabled: true},
	}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if scored.Load() != 8*20 {
		t.Fatalf("%d of %d scores during reload", scored.Load(), 8*20)
	}
	rw := r.Score(ctx, step)
	if rw.Value == nil || *rw.Value != 1 || len(rw.Scores) != 2 || rw.Scores[0].Weight != 2 {
		t.Fatalf("after reload: %+v", rw)
	}
	// A disabled plugin can still be run by name (and is stopped at its
	// deadline).
	if sc, _ := r.ScorePlugin(ctx, "off", step); sc.Reason != "deadline exceeded" {
		t.Fatalf("disabled plugin by name: %+v", sc)
	}
	// A bad config leaves the current set in place.
	for _, bad := range [][]PluginConfig{
		{{Path: constPath, Enabled: true}, {Path: constPath, Enabled: true}},
		{{Builtin: "nope", Enabled: true}},
		{{Path: constPath, Builtin: "hint"}},
		{{Path: constPath, Weight: -1}},
	} {
		if err := r.Reload(ctx, bad); !errors.Is(err, ErrConfig) {
			t.Errorf("reload %+v: %v, want ErrConfig", bad, err)
		}
	}
	if got := len(r.Plugins()); got != 3 {
		t.Fatalf("after bad reloads: %d plugins", got)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if rw := r.Score(ctx, step); len(rw.Scores) != 0 {
		t.Fatalf("closed runner scored: %+v", rw)
	}
	if err := r.Reload(ctx, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("reload after close: %v", err)
	}
}

func TestJudge(t *testing.T) {
	steps := readTestSteps(t)
	step := steps["01-correction"]
	cases := []struct {
		name    string
		replies []string // cycled
		fail    bool
		votes   string
		want    *float64
		reason  string
	}{
		{name: "unanimous good", replies: []string{"Fine.\nScore: 1"}, want: ptr(1)},
		{name: "majority bad", replies: []string{"Score: -1", "Score: 1", "The user corrected it. Score: -1"}, want: ptr(-1)},
		{name: "tie is zero", replies: []string{"Score: 1", "Score: -1", "no idea"}, want: ptr(0)},
		{name: "boxed", replies: []string{`\boxed{-1}`}, votes: "5", want: ptr(-1)},
		{name: "unparseable", replies: []string{"I cannot say"}, reason: "no usable vote in 3 tries"},
		{name: "judge down", fail: true, reason: "no usable vote in 3 tries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var prompts []string
			judge := func(ctx context.Context, prompt string) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				if _, ok := ctx.Deadline(); !ok {
					t.Error("judge called without a deadline")
				}
				prompts = append(prompts, prompt)
				if c.fail {
					return "", errors.New("upstream down")
				}
				return c.replies[(len(prompts)-1)%len(c.replies)], nil
			}
			cfg := PluginConfig{Builtin: "judge", Enabled: true, Judge: true}
			if c.votes != "" {
				cfg.Config = map[string]string{"votes": c.votes}
			}
			r := newTestRunner(t, Options{Plugins: []PluginConfig{cfg}, Judge: judge})
			sc := scoreWithin(t, r, "judge", step)
			if (sc.Value == nil) != (c.want == nil) || sc.Value != nil && *sc.Value != *c.want {
				t.Fatalf("value %v, want %v (%s)", fmtVal(sc.Value), fmtVal(c.want), sc.Reason)
			}
			if !strings.Contains(sc.Reason, c.reason) {
				t.Fatalf("reason %q, want %q", sc.Reason, c.reason)
			}
			n := 3
			if c.votes != "" {
				n = 5
			}
			if len(prompts) != n {
				t.Fatalf("%d judge calls, want %d", len(prompts), n)
			}
			if !strings.Contains(prompts[0], "Sydney") || !strings.Contains(prompts[0], "Canberra") {
				t.Fatalf("prompt does not show the turn and its next state:\n%s", prompts[0])
			}
		})
	}
	// Without permission the judge plugin abstains and the judge is never asked.
	called := false
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Builtin: "judge", Enabled: true}},
		Judge: func(context.Context, string) (string, error) { called = true; return "Score: 1", nil }})
	if sc := scoreWithin(t, r, "judge", step); sc.Value != nil || sc.Reason != "judge not permitted" || called {
		t.Fatalf("unpermitted judge: %+v called=%v", sc, called)
	}
}

func ptr(v float64) *float64 { return &v }

// TestBuiltinsReproducible rebuilds one built-in from its source and checks
// that the embedded module matches it byte for byte (only with the Go
// release that built the embedded modules).
func TestBuiltinsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain")
	}
	v, err := exec.Command(gobin, "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(v)); got != builtin.GoVersion() {
		t.Skipf("embedded built-ins were built with %s, this is %s", builtin.GoVersion(), got)
	}
	out := filepath.Join(t.TempDir(), "hint.wasm")
	cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w -buildid=", "-o", out, ".")
	cmd.Dir = "../wasm-rewards/builtin/hint"
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	built, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := builtin.Module("hint")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, embedded) {
		t.Fatal("wasm-rewards/builtin/hint.wasm.gz does not match its source: run wasm-rewards/build.sh")
	}
}
