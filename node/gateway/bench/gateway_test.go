package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node/gateway/storetest"
	"github.com/clawmesh/clawmesh/pool"
)

// TestGatewayRuns runs the gateway benchmark briefly with both stores and
// checks that it measured every series without errors. It asserts nothing
// about speed.
func TestGatewayRuns(t *testing.T) {
	for _, mem := range []bool{false, true} {
		r, err := Gateway(context.Background(), GatewayOptions{Rate: 100, Duration: 400 * time.Millisecond, Warmup: 100 * time.Millisecond, DataDir: t.TempDir(), Memory: mem, Metrics: mem})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Series) != 3 {
			t.Fatalf("%d series", len(r.Series))
		}
		if r.GC.Goal == 0 || r.GC.PauseMax > r.GC.PauseSum {
			t.Errorf("memory=%v: GC %+v", mem, r.GC)
		}
		for _, s := range r.Series {
			if s.Direct.N == 0 || s.Through.N == 0 || s.Direct.Errors+s.Through.Errors > 0 {
				t.Errorf("memory=%v %s: %+v", mem, s.Name, s)
			}
			if s.Through.P50 <= 0 || s.Through.P99 < s.Through.P50 {
				t.Errorf("memory=%v %s: percentiles %v %v", mem, s.Name, s.Through.P50, s.Through.P99)
			}
		}
		var b bytes.Buffer
		r.Print(&b)
		for _, want := range []string{"added p50", "bare Go reverse proxy", "goal: added p50 <= +0.300ms, p99 <= +2.000ms", "streaming: last byte   added p50", "Go GC in this process"} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("print has no %q: %s", want, b.String())
			}
		}
	}
}

// TestMemStoreConformance: the memory store of --memory keeps the pool's
// rules, so the gateway does the same work against it.
func TestMemStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store { return &memStore{steps: map[core.StepID]*core.Step{}} })
}

// TestGatewayRealistic runs the realistic mode briefly and checks, in the
// pool it leaves, that the calls formed the chains the load meant: every
// call but a session's first continues the one before, every step but a
// session's last was closed with a next state, and the last ones were
// closed by X-Session-Done.
func TestGatewayRealistic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not", "yet")
	r, err := Gateway(context.Background(), GatewayOptions{Rate: 50, Duration: 600 * time.Millisecond, Warmup: 100 * time.Millisecond,
		DataDir: dir, Realistic: true, Turns: 3, SessionsAtOnce: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Series {
		if s.Direct.N == 0 || s.Through.N == 0 || s.Direct.Errors+s.Through.Errors > 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	if r.RequestBytes < 40000 || r.Fsync.N == 0 || r.Fsync.P50 <= 0 {
		t.Errorf("request bytes %d, fsync %+v", r.RequestBytes, r.Fsync)
	}
	p, err := pool.Open(dir, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	steps, err := p.List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	bySession := map[core.SessionID][]*core.Step{}
	for _, s := range steps {
		bySession[s.SessionID] = append(bySession[s.SessionID], s)
	}
	whole := 0
	for id, ss := range bySession {
		if len(ss) != 3 {
			continue // cut by the end of the run
		}
		whole++
		sort.Slice(ss, func(i, j int) bool { return len(ss[i].Request.Messages) < len(ss[j].Request.Messages) })
		for i, s := range ss {
			if i > 0 && s.ParentID != ss[i-1].ID {
				t.Errorf("session %s turn %d: parent %q, want %q", id, i, s.ParentID, ss[i-1].ID)
			}
			if s.State != core.StateClosed || (i < 2) != (s.NextState != nil) {
				t.Errorf("session %s turn %d: %s, next state %+v", id, i, s.State, s.NextState)
			}
		}
	}
	if whole == 0 {
		t.Fatalf("no whole session among %d steps in %d sessions", len(steps), len(bySession))
	}
}

// TestBareProxy: the baseline passes a call through to the server and
// back, a streamed reply whole.
func TestBareProxy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up := fakeupstream.New(fakeupstream.Script{Chunks: 4})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, ln)
	base, err := bareProxy(ctx, "http://"+ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
		resp, err := http.Post(base+"/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%v: status %d, %v: %s", stream, resp.StatusCode, err, b)
		}
		if stream && !bytes.Contains(b, []byte("data: [DONE]")) {
			t.Fatalf("streamed reply not whole: %s", b)
		}
		if !stream && !bytes.Contains(b, []byte(`"choices"`)) {
			t.Fatalf("reply: %s", b)
		}
	}
}
