package reward

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// stepSaying is a closed step whose last user message is text.
func stepSaying(text string) *core.Step {
	return &core.Step{
		ID: "s1", SessionID: "sess", Turn: core.TurnMain, API: core.APIChat, State: core.StateClosed,
		Request: core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: text}}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{
			Role: core.RoleAssistant, Content: "ok"}}}},
		NextState: &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "thanks"}}},
	}
}

// scoreWithin scores and fails the test if the call does not return at all
// within a very generous bound (a hang, not a slow machine).
func scoreWithin(t *testing.T, r *Runner, name string, s *core.Step) core.Score {
	t.Helper()
	type res struct{ sc core.Score }
	ch := make(chan res, 1)
	go func() {
		sc, _ := r.ScorePlugin(context.Background(), name, s)
		ch <- res{sc}
	}()
	select {
	case v := <-ch:
		return v.sc
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s: the call never returned", name)
		return core.Score{}
	}
}

func TestHandWrittenPlugins(t *testing.T) {
	plugins := map[string][]byte{
		"const":           wasmConst,
		"junk":            wasmJunk,
		"out-of-range":    wasmOutOfRange,
		"unreachable":     wasmUnreachable,
		"loop":            wasmLoop,
		"huge-result":     wasmWithScore(i64c(int64(resultAt)<<32 | 0x7fffffff)),
		"oob-result":      wasmWithScore(i64c(int64(0x7fff0000)<<32 | 100)),
		"no-score":        wasmMissing("clawmesh_score"),
		"no-alloc":        wasmMissing("clawmesh_alloc"),
		"no-memory":       wasmMissing("memory"),
		"unknown-import":  wasmImporting("env", "nope"),
		"unknown-host-fn": wasmImporting("clawmesh", "exec"),
		"judge-forbidden": wasmImporting("clawmesh", "judge"),
		"abi-3":           wasmABI(3),
		"flat":            wasmFlat(flatResultBytes(0.75, "look first", "flat"), 2),
		"flat-oob":        wasmFlat(flatResultBytes(0.75, "look first", "flat")[:44], 2),
		"flat-as-json":    wasmFlat(flatResultBytes(0.75, "", "flat"), 1),
		"grow":            wasmGrow(64),
		"not-wasm":        []byte("\x00asm but not really"),
		"alloc-oob":       alloc(0x7ffffff0),
		"command":         wasmCommand(),
	}
	want := map[string]string{ // plugin → reason substring; "" = scores
		"const":           "",
		"junk":            "bad result",
		"out-of-range":    "outside [-1, 1]",
		"unreachable":     "trap: wasm error: unreachable",
		"loop":            "deadline exceeded",
		"huge-result":     "exceeds",
		"oob-result":      "out of bounds",
		"no-score":        "missing export clawmesh_score",
		"no-alloc":        "missing export clawmesh_alloc",
		"no-memory":       "missing export memory",
		"unknown-import":  "start:",
		"unknown-host-fn": "unknown import clawmesh.exec",
		"judge-forbidden": "judge not permitted",
		"abi-3":           "unsupported abi version 3",
		"flat":            "",
		"flat-oob":        "out of bounds",
		"flat-as-json":    "bad result",
		"grow":            "",
		"not-wasm":        "compile:",
		"alloc-oob":       "out of bounds",
		"command":         "start: module is a WASI command (exports _start)",
	}
	var cfgs []PluginConfig
	for n, b := range plugins {
		cfgs = append(cfgs, PluginConfig{Name: n, Path: writeWasm(t, n, b), Enabled: true})
	}
	// A generous deadline for all but "loop", which runs into its short one
	// and is contained by it.
	r := newTestRunner(t, Options{Plugins: cfgs, MemoryLimit: 64 << 16})
	short := newTestRunner(t, Options{Plugins: cfgs, Deadline: 200 * time.Millisecond, MemoryLimit: 64 << 16})
	step := stepSaying("hello")
	for n, reason := range want {
		run := r
		if n == "loop" {
			run = short
		}
		sc := scoreWithin(t, run, n, step)
		if reason == "" {
			if sc.Value == nil || *sc.Value <= 0 {
				t.Errorf("%s: want a positive score, got %+v", n, sc)
			}
			continue
		}
		if sc.Value != nil || !strings.Contains(sc.Reason, reason) {
			t.Errorf("%s: want abstain with %q, got value %v reason %q", n, reason, fmtVal(sc.Value), sc.Reason)
		}
	}
	// One bad plugin affects nothing else: the whole set still combines the
	// good ones (const 0.5, grow 1 → clamped 1).
	if err := r.Reload(context.Background(), withoutPlugin(cfgs, "loop")); err != nil {
		t.Fatal(err)
	}
	rw := r.Score(context.Background(), step)
	if rw.Value == nil || *rw.Value != 1 || len(rw.Scores) != len(plugins)-1 {
		t.Fatalf("combined: %v over %d scores", fmtVal(rw.Value), len(rw.Scores))
	}
	// A trapped instance is discarded; the plugin still works next time.
	for i := 0; i < 3; i++ {
		if sc := scoreWithin(t, r, "const", step); sc.Value == nil {
			t.Fatalf("const after traps: %+v", sc)
		}
	}
}

// alloc is a plugin whose clawmesh_alloc returns ptr.
func alloc(ptr int32) []byte {
	m := abiPlugin(`{"score":1}`, nil)
	m.funcs[1].body = i32c(ptr)
	return m.bytes()
}

func TestHostilePlugin(t *testing.T) {
	path := hostilePlugin(t)
	r := newTestRunner(t, Options{
		Plugins:     []PluginConfig{{Name: "hostile", Path: path, Enabled: true}, {Name: "const", Path: writeWasm(t, "const", wasmConst), Enabled: true}},
		MemoryLimit: 32 << 20,
	})
	cases := []struct{ mode, reason string }{
		{"spin", "deadline exceeded"},
		{"oom", "out of memory"},
		{"exit", "exited with code 3"},
		{"fatal", "panic: boom in a goroutine"},
		{"panic", "plugin panicked"},
		{"escape", "contained:"},
	}
	for _, c := range cases {
		sc := scoreWithin(t, r, "hostile", stepSaying(c.mode))
		if sc.Value != nil || !strings.Contains(sc.Reason, c.reason) {
			t.Errorf("%s: want abstain with %q, got value %v reason %q", c.mode, c.reason, fmtVal(sc.Value), sc.Reason)
		}
		t.Logf("%s: %s", c.mode, sc.Reason)
		// Every other plugin is unaffected, and so is the hostile one on a
		// good input.
		if sc := scoreWithin(t, r, "const", stepSaying(c.mode)); sc.Value == nil {
			t.Errorf("after %s: const abstained: %s", c.mode, sc.Reason)
		}
		if sc := scoreWithin(t, r, "hostile", stepSaying("ok")); sc.Value == nil || *sc.Value != 0.25 {
			t.Errorf("after %s: hostile on a good input: %v %s", c.mode, fmtVal(sc.Value), sc.Reason)
		}
	}
	// Output beyond the cap is dropped, the call still scores.
	if sc := scoreWithin(t, r, "hostile", stepSaying("chatty")); sc.Value == nil || *sc.Value != -0.25 {
		t.Errorf("chatty: %v %s", fmtVal(sc.Value), sc.Reason)
	}
}

func withoutPlugin(cfgs []PluginConfig, name string) []PluginConfig {
	var out []PluginConfig
	for _, c := range cfgs {
		if c.Name != name {
			out = append(out, c)
		}
	}
	return out
}
