package reward

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// logRecords is a slog.Handler that keeps every record.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecords) WithGroup(string) slog.Handler            { return h }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

// find returns the records with message msg, each as its attributes.
func (h *logRecords) find(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.recs {
		if r.Message != msg {
			continue
		}
		attrs := map[string]string{"level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		out = append(out, attrs)
	}
	return out
}

func (h *logRecords) reset() {
	h.mu.Lock()
	h.recs = nil
	h.mu.Unlock()
}

// clock is a settable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestSetAsideAfterFailures runs a plugin that is slow to start and fails
// every call (each call then starts a replacement instance): after
// FailureLimit failures in a row it abstains at once, without running, until
// the time it gives; a retry that fails sets it aside twice as long; a
// Reload gives it a new chance.
func TestSetAsideAfterFailures(t *testing.T) {
	logs := &logRecords{}
	clk := &clock{t: time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC)}
	cfg := []PluginConfig{{Name: "failing", Path: writeWasm(t, "failing", wasmSlowStartFailing(200_000)), Enabled: true}}
	r := newTestRunner(t, Options{Plugins: cfg, FailureLimit: 3, Now: clk.now, Logger: slog.New(logs)})
	ran := func() int { return len(logs.find("plugin log")) }
	step := stepSaying("hello")
	score := func(wantRan int, wantReason string) {
		t.Helper()
		sc := scoreWithin(t, r, "failing", step)
		if sc.Value != nil || !strings.Contains(sc.Reason, wantReason) {
			t.Fatalf("value %v reason %q, want an abstention with %q", fmtVal(sc.Value), sc.Reason, wantReason)
		}
		if got := ran(); got != wantRan {
			t.Fatalf("the plugin ran %d times, want %d (reason %q)", got, wantRan, sc.Reason)
		}
	}
	for i := 1; i <= 3; i++ {
		score(i, "trap: wasm error: unreachable")
	}
	retry := clk.now().Add(backoffBase)
	aside := "disabled after 3 consecutive failures, retry at " + retry.Format(time.RFC3339) + " (last: trap"
	score(3, aside)
	score(3, aside)
	if w := logs.find("plugin set aside after consecutive failures; it abstains until then"); len(w) != 1 || w[0]["level"] != "WARN" || w[0]["plugin"] != "failing" {
		t.Errorf("set-aside log records: %v, want one warning naming the plugin", w)
	}
	// Until the retry time nothing runs; then one call does, fails, and
	// the plugin is set aside twice as long.
	clk.add(backoffBase - time.Second)
	score(3, aside)
	clk.add(time.Second)
	score(4, "trap: wasm error: unreachable")
	retry = clk.now().Add(2 * backoffBase)
	score(4, "disabled after 4 consecutive failures, retry at "+retry.Format(time.RFC3339))
	// The period doubles up to backoffMax.
	for range 12 {
		clk.add(backoffMax)
		scoreWithin(t, r, "failing", step)
	}
	if sc := scoreWithin(t, r, "failing", step); !strings.Contains(sc.Reason, "retry at "+clk.now().Add(backoffMax).Format(time.RFC3339)) {
		t.Errorf("after many failed retries: %q, want a retry backoffMax later", sc.Reason)
	}
	// A reload starts afresh.
	n := ran()
	if err := r.Reload(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	score(n+1, "trap: wasm error: unreachable")

	// A call that succeeds ends the count: the hostile plugin exits on
	// "exit" and scores 0.25 on "ok".
	h := newTestRunner(t, Options{Plugins: []PluginConfig{{Name: "hostile", Path: hostilePlugin(t), Enabled: true}},
		FailureLimit: 3, Now: clk.now})
	verdict := func(mode string) string {
		sc := scoreWithin(t, h, "hostile", stepSaying(mode))
		if sc.Value != nil {
			return "scored"
		}
		return sc.Reason
	}
	for _, c := range []struct{ mode, want string }{
		{"exit", "exited with code 3"}, {"exit", "exited with code 3"}, {"ok", "scored"},
		{"exit", "exited with code 3"}, {"exit", "exited with code 3"}, {"ok", "scored"},
		{"exit", "exited with code 3"}, {"exit", "exited with code 3"}, {"exit", "exited with code 3"},
		{"ok", "disabled after 3 consecutive failures"},
	} {
		if got := verdict(c.mode); !strings.Contains(got, c.want) {
			t.Fatalf("%s: %q, want %q", c.mode, got, c.want)
		}
	}
	clk.add(backoffBase)
	if got := verdict("ok"); got != "scored" {
		t.Fatalf("retry after the period: %q, want a score", got)
	}
	if got := verdict("exit"); !strings.Contains(got, "exited with code 3") {
		t.Fatalf("after a success the count starts again: %q", got)
	}
}

// TestStrictRefusesUnusable checks Options.Strict: New fails on an enabled
// plugin that cannot be loaded, naming it and why; Reload fails the same
// way and keeps the current set; a disabled unusable plugin is accepted.
func TestStrictRefusesUnusable(t *testing.T) {
	ctx := context.Background()
	missing := writeWasm(t, "gone", wasmConst)
	os.Remove(missing)
	constPath := writeWasm(t, "const", wasmConst)
	for _, c := range []struct {
		cfg  PluginConfig
		want string
	}{
		{PluginConfig{Path: missing, Enabled: true}, `"gone": read: open ` + missing + ": no such file or directory"},
		{PluginConfig{Name: "notwasm", Path: writeWasm(t, "notwasm", []byte("hello")), Enabled: true}, `"notwasm": compile:`},
		{PluginConfig{Name: "cmd", Path: writeWasm(t, "cmd", wasmCommand()), Enabled: true}, `"cmd": start: module is a WASI command`},
		{PluginConfig{Name: "judging", Path: writeWasm(t, "judging", wasmImporting("clawmesh", "judge")), Enabled: true}, `"judging": judge not permitted`},
	} {
		_, err := New(ctx, Options{Plugins: []PluginConfig{{Path: constPath, Enabled: true}, c.cfg}, Strict: true, CacheDir: cacheDir()})
		if !errors.Is(err, ErrUnusable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with %s: %v, want ErrUnusable with %q", c.cfg.Path, err, c.want)
		}
	}
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: constPath, Enabled: true}, {Path: missing, Enabled: false}}, Strict: true})
	err := r.Reload(ctx, []PluginConfig{{Path: constPath, Enabled: true, Weight: 2}, {Path: missing, Enabled: true}})
	if !errors.Is(err, ErrUnusable) || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("reload with a missing plugin: %v", err)
	}
	rw := r.Score(ctx, stepSaying("hi"))
	if len(rw.Scores) != 1 || rw.Scores[0].Plugin != "const" || rw.Scores[0].Weight != 1 {
		t.Fatalf("after a refused reload: %+v, want the first set (const, weight 1)", rw.Scores)
	}
	// Not strict: the plugin is loaded and abstains with the reason.
	lax := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: missing, Enabled: true}}})
	if sc := scoreWithin(t, lax, "gone", stepSaying("hi")); sc.Value != nil || !strings.Contains(sc.Reason, "no such file") {
		t.Fatalf("not strict: %+v", sc)
	}
}

// TestLogBudgetShared checks that a call's log budget (maxLog) is shared by
// stdout, stderr and clawmesh.log: the hostile plugin's "chatty" mode
// prints 10 MiB to stdout, then logs 1 MiB through clawmesh.log; the node's
// log gets maxLog bytes of it in all, none of them the clawmesh.log call's,
// and the call still scores. The next call has a budget of its own.
func TestLogBudgetShared(t *testing.T) {
	logs := &logRecords{}
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Name: "hostile", Path: hostilePlugin(t), Enabled: true}},
		Logger: slog.New(logs)})
	for call := 1; call <= 2; call++ {
		logs.reset()
		sc := scoreWithin(t, r, "hostile", stepSaying("chatty"))
		if sc.Value == nil || *sc.Value != -0.25 {
			t.Fatalf("call %d: %v %q, want -0.25", call, fmtVal(sc.Value), sc.Reason)
		}
		out, logged := 0, 0
		for _, a := range logs.find("plugin output") {
			out += len(a["line"]) + 1 // the newline that ended it
		}
		for _, a := range logs.find("plugin log") {
			logged += len(a["msg"])
		}
		t.Logf("call %d: %d bytes of output, %d of clawmesh.log", call, out, logged)
		if out+logged > maxLog || out < maxLog-1024 {
			t.Errorf("call %d: %d bytes of output and %d of clawmesh.log logged, want %d in all", call, out, logged, maxLog)
		}
		if logged != 0 {
			t.Errorf("call %d: clawmesh.log got %d bytes after stdout had used the budget", call, logged)
		}
	}
}

// TestInputLimit checks the 16 MiB input limit: a step whose input would be
// larger is not sent to the plugin, which abstains with the size; one just
// under it is sent, and the plugin answers.
func TestInputLimit(t *testing.T) {
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Builtin: "feedback", Enabled: true}}})
	sc := scoreWithin(t, r, "feedback", stepSaying(strings.Repeat("x", maxInput)))
	if sc.Value != nil || !strings.HasPrefix(sc.Reason, "input of ") || !strings.HasSuffix(sc.Reason, " bytes exceeds 16777216") {
		t.Errorf("a %d-byte message: %v %q, want an abstention with the input's size", maxInput, fmtVal(sc.Value), sc.Reason)
	}
	sc = scoreWithin(t, r, "feedback", stepSaying(strings.Repeat("x", maxInput-4096)))
	if sc.Reason != "no explicit feedback" {
		t.Errorf("a message just under the limit: %v %q, want the plugin's own abstention", fmtVal(sc.Value), sc.Reason)
	}
}

// TestHashIsOfTheOriginalModule checks that a score carries the SHA-256 of
// the .wasm as written (before the runner instruments it), for a plugin
// from a file and for a built-in.
func TestHashIsOfTheOriginalModule(t *testing.T) {
	r := newTestRunner(t, Options{Plugins: []PluginConfig{
		{Name: "const", Path: writeWasm(t, "const", wasmConst), Enabled: true},
		{Builtin: "feedback", Enabled: true},
	}})
	want := sha256.Sum256(wasmConst)
	rw := r.Score(context.Background(), stepSaying("hi"))
	if len(rw.Scores) != 2 || rw.Scores[0].Hash != hex.EncodeToString(want[:]) {
		t.Fatalf("scores %+v, want const's hash %x", rw.Scores, want)
	}
	if h := rw.Scores[1].Hash; h != builtinHash(t, "feedback") {
		t.Fatalf("feedback's hash %s, want %s", h, builtinHash(t, "feedback"))
	}
}
