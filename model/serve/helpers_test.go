package serve

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/tokenizer"
)

// tinyTok learns the tiny tokenizer once: it is immutable and shared.
var tinyTok = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.Tiny(tokenizer.TinyOptions{})
})

func testTokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tinyTok()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// tinyConfig is the tiny model shaped for the tiny tokenizer, ending turns
// on <|im_end|>.
func tinyConfig(t testing.TB, tok *tokenizer.Tokenizer) native.Config {
	t.Helper()
	cfg := native.TinyConfig(tok.VocabSize())
	id, ok := tok.TokenID("<|im_end|>")
	if !ok {
		t.Fatal("tiny tokenizer has no <|im_end|>")
	}
	cfg.EOS = []int{id}
	return cfg
}

func newTinyEngine(t testing.TB, seed uint64) (*native.Engine, *tokenizer.Tokenizer) {
	t.Helper()
	tok := testTokenizer(t)
	e, err := native.NewTiny(tinyConfig(t, tok), seed, native.Options{Seed: seed, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, tok
}

// startServer serves cfg on 127.0.0.1 until the test ends.
func startServer(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s, "http://" + ln.Addr().String()
}

func sdk(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// trainAdapter forks e, takes one large optimizer step pushing toward
// toks, and exports the adapter to a new directory.
func trainAdapter(t testing.TB, e *native.Engine, toks []int, adv float32) string {
	t.Helper()
	f, err := e.Fork()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := len(toks)
	s := engine.TrainSample{Tokens: toks, LossMask: make([]bool, n), Advantages: make([]float32, n)}
	for i := 1; i < n; i++ {
		s.LossMask[i], s.Advantages[i] = true, adv
	}
	ctx := context.Background()
	for range 3 {
		if _, err := f.TrainStep(ctx, []engine.TrainSample{s}, engine.Recipe{LR: 0.05, MaxGradNorm: -1}); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := f.ExportAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// apiStatus returns the HTTP status of an SDK error (0 if none).
func apiStatus(err error) int {
	var ae *openai.Error
	if errors.As(err, &ae) {
		return ae.StatusCode
	}
	return 0
}
