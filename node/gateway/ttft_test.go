package gateway

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

// TestTTFTIsFirstToken: a stream's recorded time to first token runs to the
// first event with some of the reply, not to the role-only chunk that comes
// before it. The clock is the test's: it moves on only while the upstream
// holds its first token back.
func TestTTFTIsFirstToken(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var now atomic.Int64
	now.Store(t0.UnixNano())
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}`+"\n\n")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Upstream = up.URL + "/v1"
		c.Now = func() time.Time { return time.Unix(0, now.Load()).UTC() }
	})
	resp, err := http.Post(e.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, `"role":"assistant"`) {
		t.Fatalf("first line %q, %v", line, err)
	}
	now.Store(t0.Add(3 * time.Second).UnixNano()) // the model thinks
	close(release)
	if rest, err := io.ReadAll(rd); err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("rest %q, %v", rest, err)
	}
	steps := e.mem.all(t)
	if len(steps) != 1 {
		t.Fatalf("%d steps", len(steps))
	}
	if got := steps[0].Timings.TTFT; got != 3*time.Second {
		t.Errorf("TTFT %v, want 3s (the first token, not the role chunk)", got)
	}
	if steps[0].Action().Content != "Hi" || steps[0].State != core.StateOpen {
		t.Errorf("step %+v", steps[0])
	}
}
