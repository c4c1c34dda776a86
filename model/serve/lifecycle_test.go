package serve

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/model/engine"
)

const longStream = `{"messages":[{"role":"user","content":"go on"}],"max_tokens":300,"stream":true,"seed":1}`

// readEvents reads SSE data lines until [DONE] or EOF (bounded by the
// response).
func readEvents(t *testing.T, sc *bufio.Scanner, first func()) (events int, done bool) {
	t.Helper()
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if line == "data: [DONE]" {
			return events, true
		}
		if strings.HasPrefix(line, `data: {"error"`) {
			t.Errorf("error event: %s", line)
		}
		events++
		if events == 1 && first != nil {
			first()
		}
	}
	return events, false
}

func TestGracefulShutdownFinishesStreams(t *testing.T) {
	e, tok := newTinyEngine(t, 11)
	s, err := New(Config{Model: e, Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(longStream))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// Shut down as soon as the stream has begun; it must still complete.
	events, complete := readEvents(t, bufio.NewScanner(resp.Body), cancel)
	if !complete {
		t.Fatalf("stream cut by shutdown after %d events", events)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := http.Get(base + "/v1/models"); err == nil {
		t.Error("server still accepting after shutdown")
	}
	if err := s.LoadAdapter(context.Background(), t.TempDir(), "v1"); err != ErrClosed {
		t.Errorf("LoadAdapter after Run: %v", err)
	}
}

// endless is a fake engine that generates until its context ends or
// MaxTokens is reached.
type endless struct{ scripted }

func (f *endless) Generate(ctx context.Context, prompt []int, o engine.GenOptions) ([]int, []float32, error) {
	var toks []int
	for len(toks) < o.MaxTokens {
		if err := ctx.Err(); err != nil {
			return toks, nil, err
		}
		toks = append(toks, 'a')
		if err := o.OnToken('a', -1); err != nil {
			return toks, nil, err
		}
	}
	return toks, nil, nil
}

func TestClientDisconnectFreesSlot(t *testing.T) {
	tok := testTokenizer(t)
	f := &endless{scripted{info: engine.ModelInfo{Name: "endless", MaxPosition: 1 << 30}}}
	_, base := startServer(t, Config{Model: f, Tokenizer: tok, MaxConcurrent: 1, MaxTokens: 1 << 28})
	// Clients leave mid-stream. With one slot, each later request can run
	// only if the abandoned generation stopped; otherwise it would go on
	// for 2^28 tokens and the deadline below fails the test.
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelAll()
	for range 3 {
		rctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(rctx, "POST", base+"/v1/chat/completions",
			strings.NewReader(`{"messages":[{"role":"user","content":"go on"}],"stream":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for j := 0; j < 3 && sc.Scan(); j++ {
		}
		cancel()
		resp.Body.Close()
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("a request after abandoned streams: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
