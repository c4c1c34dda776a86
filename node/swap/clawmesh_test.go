package swap

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/engine"
	"github.com/clawmesh/clawmesh/trainer/engine/native"
	"github.com/clawmesh/clawmesh/trainer/serve"
	"github.com/clawmesh/clawmesh/trainer/tokenizer"
)

// tinyTok learns the tiny tokenizer once: it is immutable and shared.
var tinyTok = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.Tiny(tokenizer.TinyOptions{})
})

// tinyServe is a real `clawmesh serve` of the tiny native model on
// 127.0.0.1, and a way to make adapters for it.
type tinyServe struct {
	url string // with /v1
	srv *serve.Server
	eng *native.Engine
}

// startTinyServe serves the tiny model until the test ends. token, if set,
// is required of clients.
func startTinyServe(t testing.TB, token string) *tinyServe {
	t.Helper()
	tok, err := tinyTok()
	if err != nil {
		t.Fatal(err)
	}
	cfg := native.TinyConfig(tok.VocabSize())
	if id, ok := tok.TokenID("<|im_end|>"); ok {
		cfg.EOS = []int{id}
	}
	eng, err := native.NewTiny(cfg, 7, native.Options{Name: "tiny", Seed: 7, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	srv, err := serve.New(serve.Config{Model: eng, Tokenizer: tok, MaxConcurrent: 2, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &tinyServe{url: "http://" + ln.Addr().String() + "/v1", srv: srv, eng: eng}
}

// adapter exports an adapter for the tiny model, one optimizer step away
// from the fresh one (so that it changes the policy), to a new directory.
func (s *tinyServe) adapter(t testing.TB) string {
	t.Helper()
	f, err := s.eng.Fork()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	toks := []int{1, 2, 3, 4, 5, 6}
	ts := engine.TrainSample{Tokens: toks, LossMask: make([]bool, len(toks)), Advantages: make([]float32, len(toks))}
	for i := 1; i < len(toks); i++ {
		ts.LossMask[i], ts.Advantages[i] = true, 1
	}
	ctx := context.Background()
	if _, err := f.TrainStep(ctx, []engine.TrainSample{ts}, engine.Recipe{LR: 0.05, MaxGradNorm: -1}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := f.ExportAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The header the driver reads is the one the server writes.
func TestAdapterHeaderMatchesServe(t *testing.T) {
	if AdapterHeader != serve.AdapterHeader {
		t.Fatalf("AdapterHeader %q, serve writes %q", AdapterHeader, serve.AdapterHeader)
	}
	if configFile != adapter.ConfigFile || weightsFile != adapter.WeightsFile {
		t.Fatalf("adapter files %q, %q; PEFT bundles hold %q, %q", configFile, weightsFile, adapter.ConfigFile, adapter.WeightsFile)
	}
}

// TestClawmeshServe drives a real `clawmesh serve`: what the conformance
// suite cannot say of a server that swaps one version atomically.
func TestClawmeshServe(t *testing.T) {
	ctx := ctxT(t)
	s := startTinyServe(t, "s3cret")
	d, err := New("clawmesh", Config{Upstream: s.url, Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.adapter(t)

	t.Run("wrong token", func(t *testing.T) {
		bad, err := New("clawmesh", Config{Upstream: s.url, Token: "nope"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bad.Load(ctx, "v1", dir); !errors.Is(err, ErrUpstream) || !contains(err, "401", "token") {
			t.Fatalf("Load with a wrong token: %v, want ErrUpstream naming the token", err)
		}
		if got := s.srv.Adapter(); got != serve.DefaultAdapter {
			t.Fatalf("a refused request changed the adapter to %q", got)
		}
	})

	t.Run("refused adapter", func(t *testing.T) {
		// An adapter shaped for another model: the engine refuses it.
		other := writeAdapter(t, 4, []string{"q_proj"}, 1)
		if _, err := d.Load(ctx, "v0", other); !errors.Is(err, ErrRefused) || !contains(err, "v0") {
			t.Fatalf("Load of an adapter for another model: %v, want ErrRefused", err)
		}
		if got := s.srv.Adapter(); got != serve.DefaultAdapter {
			t.Fatalf("after a refused load the server serves %q", got)
		}
	})

	base, err := d.Base(ctx)
	if err != nil || base != (Target{Version: BaseVersion}) {
		t.Fatalf("Base before any load: %+v, %v", base, err)
	}
	v1, err := d.Load(ctx, "v1", dir)
	if err != nil {
		t.Fatal(err)
	}
	if v1 != (Target{Version: "v1"}) {
		t.Fatalf("Load: %+v, want the version and no model rewrite", v1)
	}
	if got := s.srv.Adapter(); got != "v1" {
		t.Fatalf("the server serves %q after Load", got)
	}
	if err := d.Warm(ctx, v1); err != nil {
		t.Fatal(err)
	}
	// The server swapped atomically: the base is gone, and cannot come
	// back while it runs.
	if err := d.Warm(ctx, base); !errors.Is(err, ErrWarm) || !contains(err, `"v1"`) {
		t.Fatalf("Warm(base) after the swap: %v, want ErrWarm naming v1", err)
	}
	if _, err := d.Base(ctx); !errors.Is(err, ErrUnsupported) || !contains(err, "restart", "v1") {
		t.Fatalf("Base after a load: %v, want ErrUnsupported saying to restart", err)
	}
	// Loading the same version again (a node restart) is harmless.
	if _, err := d.Load(ctx, "v1", dir); err != nil {
		t.Fatalf("Load again: %v", err)
	}
}
