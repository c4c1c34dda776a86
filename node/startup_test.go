package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func fakeModel(t testing.TB, ctx context.Context) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go fakeupstream.New(fakeupstream.Script{}).Run(ctx, ln)
	return "http://" + ln.Addr().String() + "/v1"
}

// TestGatewayServesWhilePluginsCompile starts a node on an empty data
// directory: the gateway is listening when Serve starts, a call made then
// is answered and recorded, and it is scored once the plugins are ready.
// The log says that the plugins are being compiled, and when they are
// ready; a second start, with the compilation cached, says only the
// latter, and so does a node on another data directory given the first
// one's cache (Config.PluginCache, by default in the user's cache
// directory).
func TestGatewayServesWhilePluginsCompile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up := fakeModel(t, ctx)
	data := t.TempDir()
	userCache := t.TempDir() // empty: the first start compiles
	t.Setenv("XDG_CACHE_HOME", userCache)
	startOn := func(data, cache string) (*node.Node, string, *lockedBuffer, func()) {
		var logs lockedBuffer
		n, err := node.New(ctx, node.Config{DataDir: data, Upstream: up, ScoreInterval: 50 * time.Millisecond, PluginCache: cache,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- n.Serve(runCtx, ln) }()
		return n, "http://" + ln.Addr().String(), &logs, func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
			if err := n.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	}
	start := func() (*node.Node, string, *lockedBuffer, func()) { return startOn(data, "") }
	n, url, logs, stop := start()
	// The call goes out at once, whether or not the plugins are ready.
	post(t, url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "X-Session-Done", "true")
	steps, err := n.Pool().List(ctx, pool.Filter{})
	if err != nil || len(steps) != 1 {
		t.Fatalf("%d steps (%v), want the call recorded", len(steps), err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 2*time.Minute)
	defer waitCancel()
	if err := n.PluginsReady(waitCtx); err != nil {
		t.Fatalf("plugins: %v", err)
	}
	for i := 0; ; i++ {
		s, err := n.Pool().Get(ctx, steps[0].ID)
		if err == nil && s.State == core.StateScored && s.Reward != nil && len(s.Reward.Scores) > 0 {
			break
		}
		if i == 600 {
			t.Fatalf("the call made at start was never scored: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if l := logs.String(); !strings.Contains(l, "compiling the reward plugins (first start only)") || !strings.Contains(l, "reward plugins ready") {
		t.Errorf("first start's log:\n%s", l)
	}

	_, _, logs, stop = start()
	n2Ready := func() bool { return strings.Contains(logs.String(), "reward plugins ready") }
	for i := 0; !n2Ready() && i < 1200; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if l := logs.String(); strings.Contains(l, "compiling the reward plugins") || !n2Ready() {
		t.Errorf("second start's log (the compilation cached):\n%s", l)
	}

	other := t.TempDir()
	_, _, logs, stop = startOn(other, filepath.Join(userCache, "clawmesh", "wazero"))
	for i := 0; !n2Ready() && i < 1200; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if l := logs.String(); strings.Contains(l, "compiling the reward plugins") || !n2Ready() {
		t.Errorf("log of a node sharing the cache:\n%s", l)
	}
	if _, err := os.Stat(filepath.Join(other, "cache", "wazero")); !os.IsNotExist(err) {
		t.Errorf("a node given a cache made its own: %v", err)
	}
}

// TestStopWhilePluginsCompile stops a node at once, while its plugins
// compile: Serve and Close return no error, and nothing is logged as a
// failure.
func TestStopWhilePluginsCompile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	up := fakeModel(t, context.Background())
	var logs lockedBuffer
	n, err := node.New(ctx, node.Config{DataDir: t.TempDir(), Upstream: up, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := n.Serve(ctx, ln); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if err := n.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	if l := logs.String(); strings.Contains(l, "level=ERROR") || strings.Contains(l, "unusable") || strings.Contains(l, "context canceled") {
		t.Errorf("stopping during start-up logged a failure:\n%s", l)
	}
}

// TestUnusablePluginFoundWhileServing: a plugin file that is WebAssembly
// but has none of the plugin exports passes the check at start, is found
// unusable as it compiles, and stops the gateway with an error naming it.
func TestUnusablePluginFoundWhileServing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	empty := filepath.Join(t.TempDir(), "empty.wasm")
	os.WriteFile(empty, []byte("\x00asm\x01\x00\x00\x00"), 0o600)
	n, err := node.New(ctx, node.Config{DataDir: t.TempDir(), Upstream: fakeModel(t, ctx),
		Plugins: []reward.PluginConfig{{Builtin: "feedback", Enabled: true}, {Path: empty, Enabled: true}}})
	if err != nil {
		t.Fatalf("New: %v (the module is only found unusable as it compiles)", err)
	}
	defer n.Close(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, ln) }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the node kept serving with an unusable plugin")
	}
	if !errors.Is(err, reward.ErrUnusable) || !strings.Contains(err.Error(), `"empty"`) {
		t.Errorf("Serve: %v, want reward.ErrUnusable naming empty", err)
	}
}

// TestMessagesSayItOnce: what a client or a command reads says what was
// wrong once, without the package that found it: a bad request through
// the gateway, and a step the node does not have asked for through the
// admin API.
func TestMessagesSayItOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := node.New(ctx, node.Config{DataDir: t.TempDir(), Upstream: fakeModel(t, ctx), NoScoring: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	base := "http://" + ln.Addr().String()

	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	json.Unmarshal(body, &e)
	if resp.StatusCode != 400 || e.Error.Message == "" || strings.Contains(e.Error.Message, "wire:") {
		t.Errorf("bad request: %d %s", resp.StatusCode, body)
	}

	c := &node.Client{Base: base, Token: n.AdminToken(), HTTP: http.DefaultClient}
	_, err = c.Get(ctx, "nosuch")
	if !errors.Is(err, pool.ErrNotFound) || !errors.Is(err, node.ErrRemote) || strings.Count(err.Error(), "not found") != 1 {
		t.Errorf("a missing step: %v, want pool.ErrNotFound and node.ErrRemote, said once", err)
	}
}
