package reward

import (
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/reward/internal/meter"
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

// compileBuiltin instruments and compiles the correction built-in as the
// runner does (the compilation cache is keyed on the instrumented bytes),
// in a new runtime with cache, and returns the module's size.
func compileBuiltin(b *testing.B, cache wazero.CompilationCache) int {
	bin, err := builtin.Module("correction")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	metered, err := meter.Instrument(bin)
	if err != nil {
		b.Fatal(err)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(cache))
	if _, err := rt.CompileModule(ctx, metered); err != nil {
		b.Fatal(err)
	}
	rt.Close(ctx)
	cache.Close(ctx)
	return len(bin)
}

func benchCompile(b *testing.B, cache func() wazero.CompilationCache) {
	var size int
	for i := 0; i < b.N; i++ {
		size = compileBuiltin(b, cache())
	}
	b.ReportMetric(float64(size)/1e6, "MB/module")
}

// BenchmarkCompileCold instruments and compiles a built-in (2.7 MB of Go
// wasip1) from scratch.
func BenchmarkCompileCold(b *testing.B) {
	benchCompile(b, wazero.NewCompilationCache)
}

// BenchmarkCompileWarm does the same with a warm on-disk compilation cache,
// as a node restart does.
func BenchmarkCompileWarm(b *testing.B) {
	dir := b.TempDir()
	open := func() wazero.CompilationCache {
		c, err := wazero.NewCompilationCacheWithDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	compileBuiltin(b, open())
	b.ResetTimer()
	benchCompile(b, open)
}

// BenchmarkStartBuiltins is the reward runner's start-up as a node does it:
// New with the built-ins' default set (all five read, instrumented and
// compiled, one instance of each started) and an on-disk cache directory,
// then Close. cold: an empty cache directory each time (a first start);
// warm: the directory a previous start filled (a restart).
func BenchmarkStartBuiltins(b *testing.B) {
	ctx := context.Background()
	start := func(b *testing.B, dir string) {
		r, err := New(ctx, Options{Plugins: Builtins(), CacheDir: dir, Strict: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("cold", func(b *testing.B) {
		root := b.TempDir()
		for i := 0; i < b.N; i++ {
			start(b, filepath.Join(root, strconv.Itoa(i)))
		}
	})
	b.Run("warm", func(b *testing.B) {
		dir := b.TempDir()
		start(b, dir)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start(b, dir)
		}
	})
}
