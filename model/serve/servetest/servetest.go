// Package servetest runs a real `clawmesh serve` of the tiny native model
// on 127.0.0.1 for other packages' tests, and makes adapters for it.
package servetest

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/serve"
)

// Tiny is a running server of the tiny model.
type Tiny struct {
	URL string // with /v1
	Srv *serve.Server
	Eng *native.Engine
}

// Start serves the tiny model until the test ends. token, if set, is
// required of clients; maxConcurrent bounds requests served at once (0: 2).
func Start(t testing.TB, token string, maxConcurrent int) *Tiny {
	t.Helper()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := native.NewTiny(cfg, 7, native.Options{Name: "tiny", Seed: 7, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	if maxConcurrent == 0 {
		maxConcurrent = 2
	}
	srv, err := serve.New(serve.Config{Model: eng, Tokenizer: txt.Tokenizer, MaxConcurrent: maxConcurrent, Token: token})
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
	return &Tiny{URL: "http://" + ln.Addr().String() + "/v1", Srv: srv, Eng: eng}
}

// Adapter exports an adapter for the tiny model, steps optimizer steps
// with learning rate lr away from the fresh one (so that it changes the
// policy), to a new directory.
func (s *Tiny) Adapter(t testing.TB, steps int, lr float64) string {
	t.Helper()
	f, err := s.Eng.Fork()
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
	for range steps {
		if _, err := f.TrainStep(ctx, []engine.TrainSample{ts}, engine.Recipe{LR: lr, MaxGradNorm: -1}); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := f.ExportAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}
