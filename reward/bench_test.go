package reward

import (
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// benchScore measures one plugin's scores per second on one goroutine (one
// core), on the recorded step 01-correction.
func benchScore(b *testing.B, cfg PluginConfig, opts Options) {
	benchScoreStep(b, cfg, opts, readTestSteps(b)["01-correction"])
}

func benchScoreStep(b *testing.B, cfg PluginConfig, opts Options, step *core.Step) {
	opts.Plugins = []PluginConfig{cfg}
	opts.Deadline = time.Second
	r := newTestRunner(b, opts)
	name := r.Plugins()[0].Name
	ctx := context.Background()
	if sc, _ := r.ScorePlugin(ctx, name, step); sc.Value == nil && sc.Reason == "" {
		b.Fatalf("warm-up: %+v", sc)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		r.ScorePlugin(ctx, name, step)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "scores/s")
}

// BenchmarkScoreEmpty is the ABI's own cost: a hand-written plugin that does
// nothing but answer.
func BenchmarkScoreEmpty(b *testing.B) {
	benchScore(b, PluginConfig{Path: writeWasm(b, "const", wasmConst), Enabled: true}, Options{})
}

// BenchmarkScoreBuiltin is a Go plugin of the kit (correction): Go's wasip1
// runtime and the flat layout. The baseline beside it runs the same plugin
// with wazero's own deadline check at every loop head instead of metering.
func BenchmarkScoreBuiltin(b *testing.B) {
	cfg := PluginConfig{Builtin: "correction", Enabled: true}
	b.Run("metered", func(b *testing.B) { benchScore(b, cfg, Options{}) })
	b.Run("loop-checks", func(b *testing.B) { benchScore(b, cfg, Options{loopChecks: true}) })
}

// BenchmarkScoreSmall is a small Go plugin of the kit: the polite example
// (a few substring tests of the user's next message).
func BenchmarkScoreSmall(b *testing.B) {
	if _, err := exec.LookPath("go"); err != nil {
		b.Skip("no go toolchain")
	}
	out, err := Build(context.Background(), "../wasm-rewards/examples/polite", filepath.Join(b.TempDir(), "polite.wasm"), io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	cfg := PluginConfig{Path: out, Enabled: true}
	b.Run("metered", func(b *testing.B) { benchScore(b, cfg, Options{}) })
	b.Run("loop-checks", func(b *testing.B) { benchScore(b, cfg, Options{loopChecks: true}) })
}

// BenchmarkScoreBuiltinLongContext is the built-in on a step whose context
// is what OpenClaw sends: a 40,000-character system prompt and 60 messages
// of history. A plugin reads only what it uses of it.
func BenchmarkScoreBuiltinLongContext(b *testing.B) {
	step := *readTestSteps(b)["01-correction"]
	msgs := []core.Message{{Role: core.RoleSystem, Content: strings.Repeat("You are a careful agent. ", 1600)}}
	for i := 0; i < 30; i++ {
		msgs = append(msgs, core.Message{Role: core.RoleUser, Content: strings.Repeat("please look at the file ", 20)},
			core.Message{Role: core.RoleAssistant, Content: strings.Repeat("done, here is what I found ", 20)})
	}
	step.Request.Messages = append(msgs, step.Request.Messages[1:]...)
	benchScoreStep(b, PluginConfig{Builtin: "correction", Enabled: true}, Options{}, &step)
}

// BenchmarkScoreBuiltinFresh is the same with a new instance per call.
func BenchmarkScoreBuiltinFresh(b *testing.B) {
	benchScore(b, PluginConfig{Builtin: "correction", Enabled: true}, Options{FreshInstances: true})
}

func benchCompile(b *testing.B, cache func() wazero.CompilationCache) {
	bin, err := builtin.Module("correction")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := cache()
		rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(c))
		if _, err := rt.CompileModule(ctx, bin); err != nil {
			b.Fatal(err)
		}
		rt.Close(ctx)
		c.Close(ctx)
	}
	b.ReportMetric(float64(len(bin))/(1<<20), "MiB/module")
}

// BenchmarkCompileCold compiles a built-in (3 MiB of Go wasip1) from scratch.
func BenchmarkCompileCold(b *testing.B) {
	benchCompile(b, wazero.NewCompilationCache)
}

// BenchmarkCompileWarm compiles it with a warm on-disk compilation cache, as
// a node restart does.
func BenchmarkCompileWarm(b *testing.B) {
	dir := b.TempDir()
	open := func() wazero.CompilationCache {
		c, err := wazero.NewCompilationCacheWithDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	bin, _ := builtin.Module("correction")
	ctx := context.Background()
	c := open()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(c))
	if _, err := rt.CompileModule(ctx, bin); err != nil {
		b.Fatal(err)
	}
	rt.Close(ctx)
	c.Close(ctx)
	benchCompile(b, open)
}
