package modelserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/model/serve/servetest"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/swap"
)

// fast is the supervisor's timing in these tests.
var fast = modelserver.Timing{Poll: 20 * time.Millisecond, Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	StartTimeout: 30 * time.Second, StopGrace: 5 * time.Second, Settle: 200 * time.Millisecond, Drain: time.Minute}

// childConfig is a llama-server config whose program is this test binary
// as a child server (see child).
func childConfig(t *testing.T) modelserver.Config {
	t.Helper()
	t.Setenv(childEnv, "1")
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("not read"), 0o600); err != nil {
		t.Fatal(err)
	}
	return modelserver.Config{Kind: modelserver.KindLlamaServer, Model: model, Bin: os.Args[0], Dir: dir, Timing: fast,
		Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

// tlog writes a test's log.
type tlog struct{ t *testing.T }

func (w tlog) Write(b []byte) (int, error) { w.t.Log(strings.TrimSpace(string(b))); return len(b), nil }

func start(t *testing.T, cfg modelserver.Config) *modelserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := modelserver.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitFor polls cond for at most a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// chat makes one chat call to upstream (…/v1) and returns the reply's
// text, whole.
func chat(ctx context.Context, upstream string, stream bool) (string, error) {
	body, _ := json.Marshal(map[string]any{"stream": stream, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	req, _ := http.NewRequestWithContext(ctx, "POST", upstream+"/chat/completions", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !stream {
		var r struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) == 0 {
			return "", fmt.Errorf("not a chat completion: %v", err)
		}
		return r.Choices[0].Message.Content, nil
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return text.String(), nil
		}
		var ch struct {
			Choices []struct{ Delta struct{ Content string } }
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return "", err
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Delta.Content)
		}
	}
	return "", fmt.Errorf("the stream ended without [DONE]: %v", sc.Err())
}

// TestRestartsOnCrash: a server killed is started again, with the same
// arguments, and answers at the same upstream; its output goes to its log
// file, each start marked.
func TestRestartsOnCrash(t *testing.T) {
	s := start(t, childConfig(t))
	st := s.Status()
	if len(st) != 1 || st[0].State != modelserver.StateReady || st[0].PID == 0 {
		t.Fatalf("status after start: %+v", st)
	}
	first := st[0].PID
	ctx := context.Background()
	if got, err := chat(ctx, s.Upstream(), false); err != nil || !strings.Contains(got, fmt.Sprint("pid ", first)) {
		t.Fatalf("before the crash: %q %v", got, err)
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server started again", func() bool {
		st := s.Status()
		return st[0].PID != first && st[0].State == modelserver.StateReady
	})
	st = s.Status()
	if st[0].Starts != 2 {
		t.Fatalf("status after the restart: %+v", st)
	}
	got, err := chat(ctx, s.Upstream(), true)
	if err != nil || !strings.Contains(got, fmt.Sprint("pid ", st[0].PID)) {
		t.Fatalf("after the restart: %q %v", got, err)
	}
	log, err := os.ReadFile(st[0].Log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "child: listening on"); n != 2 || strings.Count(string(log), "\n--- ") < 2 {
		t.Fatalf("log %s: want two starts:\n%s", st[0].Log, log)
	}
	if filepath.Base(filepath.Dir(st[0].Log)) != "logs" {
		t.Fatalf("log file %s is not in a logs directory", st[0].Log)
	}
}

// TestGivesUp: a server that exits at every start is started again a
// bounded number of times, then Start fails, quoting the end of its log.
func TestGivesUp(t *testing.T) {
	cfg := childConfig(t)
	t.Setenv("CHILD_FAIL", "1")
	cfg.Timing.MaxRestarts = 2
	_, err := modelserver.Start(context.Background(), cfg)
	if !errors.Is(err, modelserver.ErrFailed) || !strings.Contains(err.Error(), "failing at start, as asked") || !strings.Contains(err.Error(), "3 times in a row") {
		t.Fatalf("Start: %v", err)
	}
	log, _ := os.ReadFile(filepath.Join(cfg.Dir, "logs", "llama-server-base.log"))
	if n := strings.Count(string(log), "failing at start"); n != 3 {
		t.Fatalf("%d starts logged, want 3:\n%s", n, log)
	}
}

// TestStops: Close stops the server (SIGTERM: it says so in its log) and
// its address.
func TestStops(t *testing.T) {
	s := start(t, childConfig(t))
	st := s.Status()[0]
	up := s.Upstream()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if alive(st.PID) {
		t.Fatalf("pid %d still runs after Close", st.PID)
	}
	if _, err := chat(context.Background(), up, false); err == nil {
		t.Fatal("the upstream still answers after Close")
	}
	log, _ := os.ReadFile(st.Log)
	if !strings.Contains(string(log), "child: stopping") {
		t.Fatalf("the server was not asked to stop:\n%s", log)
	}
}

// TestBadConfig: what Start refuses, and says.
func TestBadConfig(t *testing.T) {
	good := childConfig(t)
	for _, tc := range []struct {
		name string
		edit func(*modelserver.Config)
		want string
	}{
		{"kind", func(c *modelserver.Config) { c.Kind = "vllm" }, `unknown model server "vllm"`},
		{"no model", func(c *modelserver.Config) { c.Model = "" }, "no model"},
		{"missing model", func(c *modelserver.Config) { c.Model = filepath.Join(c.Dir, "nope.gguf") }, "nope.gguf"},
		{"program", func(c *modelserver.Config) { c.Bin = "no-such-llama-server" }, "--serve-bin"},
	} {
		c := good
		tc.edit(&c)
		_, err := modelserver.Start(context.Background(), c)
		if !errors.Is(err, modelserver.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestBlueGreen: with llama-server, a version is served by a second
// process started with --lora; calls stream through the old one while it
// starts and after the route moves; the old process is stopped only once
// they have finished, and none fails or mixes two processes. A crash of
// the live process starts it again with the same adapter.
func TestBlueGreen(t *testing.T) {
	cfg := childConfig(t)
	t.Setenv("CHILD_CHUNKS", "8")
	t.Setenv("CHILD_CHUNK_DELAY", "25ms")
	var route atomic.Pointer[swap.Target]
	route.Store(&swap.Target{Version: swap.BaseVersion})
	cfg.Route = func() swap.Target { return *route.Load() }
	var exported atomic.Int32
	cfg.ExportLoRA = func(dir, out string) error {
		exported.Add(1)
		return os.WriteFile(out, []byte("lora of "+dir), 0o600)
	}
	s := start(t, cfg)
	drv, err := s.Driver()
	if err != nil {
		t.Fatal(err)
	}
	basePID := s.Status()[0].PID
	ctx := context.Background()

	var (
		mu      sync.Mutex
		replies []string
		fails   []error // before the crash
		cut     int     // by the crash
		crashed atomic.Bool
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000 && !stop.Load(); i++ {
				up := route.Load().Upstream
				if up == "" {
					up = s.Upstream()
				}
				got, err := chat(ctx, up, true)
				mu.Lock()
				switch {
				case err != nil && crashed.Load():
					cut++
				case err != nil:
					fails = append(fails, fmt.Errorf("%s: %w", up, err))
				default:
					replies = append(replies, got)
				}
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(replies) }
	waitFor(t, "calls on the base server", func() bool { return count() >= 4 })

	var pids []int
	for _, v := range []string{"v1", "v2"} {
		adapter := t.TempDir()
		tg, err := drv.Load(ctx, v, adapter)
		if err != nil {
			t.Fatal(err)
		}
		if tg.Version != v || tg.Upstream == "" || tg.Upstream == route.Load().Upstream {
			t.Fatalf("target of %s: %+v", v, tg)
		}
		if err := drv.Warm(ctx, tg); err != nil {
			t.Fatal(err)
		}
		if n := len(s.PIDs()); n != 2 {
			t.Fatalf("while %s comes in: %d processes, want the old and the new", v, n)
		}
		old := route.Swap(&tg)
		if err := drv.Unload(ctx, *old); err != nil {
			t.Fatal(err)
		}
		n := count()
		waitFor(t, "calls on "+v, func() bool { return count() >= n+8 })
		waitFor(t, "the old process stopped", func() bool { return len(s.PIDs()) == 1 })
		pids = append(pids, s.PIDs()[0])
	}
	waitFor(t, "the base process gone", func() bool { return !alive(basePID) })
	// The adapter of the process stopped goes; the live one's stays.
	waitFor(t, "v1.gguf removed", func() bool {
		_, err := os.Stat(filepath.Join(cfg.Dir, "gguf", "v1.gguf"))
		return errors.Is(err, os.ErrNotExist)
	})
	if _, err := os.Stat(filepath.Join(cfg.Dir, "gguf", "v2.gguf")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(fails) > 0 {
		b, _ := os.ReadFile(filepath.Join(cfg.Dir, "logs", "llama-server-base.log"))
		t.Fatalf("%d calls failed during the swaps, first: %v\n%s", len(fails), fails[0], b)
	}
	mu.Unlock()
	// The live one crashes: started again with v2's adapter.
	crashed.Store(true)
	syscall.Kill(pids[1], syscall.SIGKILL)
	waitFor(t, "v2's process started again", func() bool {
		st := s.Status()
		return len(st) == 1 && st[0].PID != pids[1] && st[0].State == modelserver.StateReady
	})
	stop.Store(true)
	wg.Wait()
	got, err := chat(ctx, route.Load().Upstream, false)
	if err != nil || !strings.Contains(got, "v2.gguf") {
		t.Fatalf("after the crash: %q %v", got, err)
	}

	per := map[string]int{}
	for _, r := range replies {
		parts := strings.Split(strings.TrimSuffix(r, ";"), ";")
		who, _, _ := strings.Cut(parts[0], " #")
		for _, p := range parts {
			if w, _, _ := strings.Cut(p, " #"); w != who {
				t.Fatalf("a reply mixes two processes: %q", r)
			}
		}
		if len(parts) != 8 {
			t.Fatalf("a reply is cut: %q", r)
		}
		switch {
		case strings.Contains(who, "v1.gguf"):
			per["v1"]++
		case strings.Contains(who, "v2.gguf"):
			per["v2"]++
		default:
			per["base"]++
		}
	}
	if per["base"] == 0 || per["v1"] == 0 || per["v2"] == 0 {
		t.Fatalf("replies per version: %v", per)
	}
	if exported.Load() != 2 {
		t.Fatalf("%d exports, want 2", exported.Load())
	}
	t.Logf("%d replies: %v; %d cut by the crash", len(replies), per, cut)
}

// TestMLX: with mlx, the node runs mlx_lm.server (a stand-in here) with
// --model, --host and --port, and a version goes into service through
// swap's mlx driver: each call names the version's mlx-lm adapter
// directory. A restarted server needs nothing more.
func TestMLX(t *testing.T) {
	cfg := childConfig(t)
	cfg.Kind = modelserver.KindMLX
	s := start(t, cfg)
	drv, err := s.Driver()
	if err != nil {
		t.Fatal(err)
	}
	if drv.Kind() != "mlx" || s.UpstreamKind() != "mlx" {
		t.Fatalf("kinds: driver %s, upstream %s", drv.Kind(), s.UpstreamKind())
	}
	tiny := servetest.Start(t, "", 1)
	ctx := context.Background()
	tg, err := drv.Load(ctx, "v1", tiny.Adapter(t, 1, 0.1))
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Warm(ctx, tg); err != nil {
		t.Fatal(err)
	}
	var fields map[string]string
	if err := json.Unmarshal([]byte(tg.Fields), &fields); err != nil || !strings.HasSuffix(fields["adapters"], ".mlx") {
		t.Fatalf("target %+v: %v", tg, err)
	}
	log, _ := os.ReadFile(s.Status()[0].Log)
	if !strings.Contains(string(log), "--model "+cfg.Model+" --host 127.0.0.1 --port ") {
		t.Fatalf("mlx_lm.server's command line:\n%s", log)
	}
}
