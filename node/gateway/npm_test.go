package gateway

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

// TestNpmOpenAISDK streams a chat with tool calls through the gateway with
// the openai npm SDK and checks it assembles the same reply as directly.
func TestNpmOpenAISDK(t *testing.T) {
	ctx, dir := npmSDK(t)
	e := newEnv(t, agentScript, nil)
	run := func(base string) map[string]any {
		cmd := exec.CommandContext(ctx, "node", "stream_chat.mjs", base+"/v1")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("node printed %s: %v", out, err)
		}
		return v
	}
	viaGW, direct := run(e.url), run(e.directURL)
	a, _ := json.Marshal(viaGW)
	b, _ := json.Marshal(direct)
	if string(a) != string(b) {
		t.Fatalf("npm SDK saw different replies:\n gw     %s\n direct %s", a, b)
	}
	calls, _ := viaGW["tool_calls"].([]any)
	if viaGW["content"] != "Let me check." || len(calls) != 2 || viaGW["finish_reason"] != "tool_calls" {
		t.Errorf("npm SDK reply %s", a)
	}
	steps := e.mem.all(t)
	if len(steps) != 1 || len(steps[0].Action().ToolCalls) != 2 || steps[0].Action().ToolCalls[0].Arguments != `{"command":"ls"}` {
		t.Errorf("recorded %+v", steps)
	}
	if ua := lastRequest(t, e.up).Header.Get("User-Agent"); ua == "" {
		t.Error("client headers not forwarded")
	}
}

// npmSDK returns the directory of the openai npm SDK's scripts, installed,
// and a context bounding the test; it skips the test without Node.js.
func npmSDK(t *testing.T) (context.Context, string) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on PATH")
	}
	dir, err := filepath.Abs(filepath.Join("testdata", "npm"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	return ctx, dir
}

// TestNpmOpenAISDKCutStream: an upstream that dies mid-stream makes the
// openai npm SDK's stream end in an error through the gateway, as it does
// talking to the upstream directly, never as a finished reply; the step is
// failed.
func TestNpmOpenAISDKCutStream(t *testing.T) {
	ctx, dir := npmSDK(t)
	e := newEnv(t, fakeupstream.Script{Chunks: 6, Turns: []fakeupstream.Turn{{Text: "once upon a", CutAfter: 3}}}, nil)
	run := func(base string) (content, errMsg string) {
		cmd := exec.CommandContext(ctx, "node", "stream_cut.mjs", base+"/v1")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
		var v struct {
			Content string  `json:"content"`
			Error   *string `json:"error"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("node printed %s: %v", out, err)
		}
		if v.Error == nil {
			return v.Content, ""
		}
		return v.Content, *v.Error
	}
	direct, directErr := run(e.directURL)
	if directErr == "" {
		t.Fatalf("the SDK saw no error talking to the cut upstream directly (got %q): the test proves nothing", direct)
	}
	got, gotErr := run(e.url)
	if gotErr == "" {
		t.Fatalf("through the gateway the SDK took a cut stream for a finished reply: %q", got)
	}
	if got != direct {
		t.Errorf("the SDK assembled %q through the gateway, %q directly", got, direct)
	}
	steps := e.mem.all(t)
	if len(steps) != 1 || steps[0].State != core.StateFailed || steps[0].Action().Content != direct {
		t.Fatalf("recorded %+v, want one failed step with %q", steps, direct)
	}
	t.Logf("the SDK's error: %s", gotErr)
}
