package node_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// TestOpenClawThroughGateway drives the real OpenClaw agent (npm openclaw,
// installed by scripts/setup-openclaw.sh) through a node in front of a
// scripted model, for two user turns of one session, and checks what the
// pool recorded: one session, a chain of steps, the tool result as the first
// step's next state and the user's next message as the second's, with
// OpenClaw's volatile internal-context message kept out of both. Then the
// node's built-in reward plugins score every closed step OpenClaw produced.
func TestOpenClawThroughGateway(t *testing.T) {
	bin := os.Getenv("CLAWMESH_OPENCLAW_BIN")
	nodeDir := os.Getenv("CLAWMESH_NODE_BIN_DIR")
	if bin == "" || nodeDir == "" {
		if os.Getenv("CLAWMESH_REQUIRE_OPENCLAW") != "" {
			t.Fatal("CLAWMESH_REQUIRE_OPENCLAW is set but CLAWMESH_OPENCLAW_BIN or CLAWMESH_NODE_BIN_DIR is not")
		}
		t.Skip("set CLAWMESH_OPENCLAW_BIN and CLAWMESH_NODE_BIN_DIR (scripts/setup-openclaw.sh prints them; scripts/test.sh sets them)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The model: asked to run something, it calls exec; given a tool
	// result, it reports it; otherwise it answers briefly.
	up := fakeupstream.New(fakeupstream.Script{
		Model: "tiny",
		Respond: func(n int, r fakeupstream.Request) fakeupstream.Turn {
			var req struct {
				Messages []struct {
					Role    string          `json:"role"`
					Content json.RawMessage `json:"content"`
				} `json:"messages"`
			}
			json.Unmarshal(r.Body, &req)
			for i := len(req.Messages) - 1; i >= 0; i-- {
				m := req.Messages[i]
				text := string(m.Content)
				if strings.Contains(text, "BEGIN_OPENCLAW_INTERNAL_CONTEXT") {
					continue
				}
				switch {
				case m.Role == "tool":
					return fakeupstream.Turn{Text: "The command printed: " + strings.Trim(text, `"`)}
				case m.Role == "user" && strings.Contains(text, "echo hi"):
					return fakeupstream.Turn{ToolCalls: []fakeupstream.ToolCall{{ID: "call_fake1", Name: "exec", Arguments: `{"command":"echo hi"}`}}}
				case m.Role == "user":
					return fakeupstream.Turn{Text: "Bye!"}
				}
				break
			}
			return fakeupstream.Turn{Text: "OK."}
		},
	})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, upLn)

	data := t.TempDir()
	n, err := node.New(ctx, node.Config{
		DataDir:  data,
		Listen:   "127.0.0.1:0",
		Upstream: "http://" + upLn.Addr().String() + "/v1",
		// Scored as they close, and what is left by a direct call once
		// the turns are recorded.
		ScoreInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	// Scored below by hand: the plugins must be ready (and done with what
	// was closed before) first.
	if err := n.PluginsReady(ctx); err != nil {
		t.Fatal(err)
	}
	before := n.Scorer().Scored
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopNode := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Serve(runCtx, gwLn) }()
	defer func() { stopNode(); <-done }()

	home := t.TempDir()
	cfg := map[string]any{
		"models": map[string]any{"providers": map[string]any{"local": map[string]any{
			"baseUrl": "http://" + gwLn.Addr().String() + "/v1",
			"api":     "openai-completions",
			"apiKey":  "unused",
			"models":  []map[string]any{{"id": "tiny", "name": "tiny"}},
		}}},
		"agents": map[string]any{"defaults": map[string]any{"model": map[string]any{"primary": "local/tiny"}}},
	}
	os.MkdirAll(filepath.Join(home, ".openclaw"), 0o700)
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(home, ".openclaw", "openclaw.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	turn := func(msg string) {
		f := filepath.Join(t.TempDir(), "msg.txt")
		os.WriteFile(f, []byte(msg), 0o600)
		cmd := exec.CommandContext(ctx, bin, "agent", "--local", "--session-id", "e2e", "--json", "--message-file", f)
		cmd.Env = append(os.Environ(), "HOME="+home, "OPENCLAW_STATE_DIR="+filepath.Join(home, ".openclaw"),
			"PATH="+nodeDir+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("openclaw agent: %v\n%s", err, tail(out, 3000))
		}
	}
	turn("please run echo hi")
	turn("thanks, that is all")

	steps, err := n.Pool().List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var main []*core.Step
	for _, s := range steps {
		if s.Turn == core.TurnMain && s.API == core.APIChat {
			main = append(main, s)
		}
	}
	sort.Slice(main, func(i, j int) bool { return main[i].Timings.Start.Before(main[j].Timings.Start) })
	if len(main) != 3 {
		for _, s := range steps {
			t.Logf("step %s session %s parent %s action %q", s.ID, s.SessionID, s.ParentID, s.Action().Content)
		}
		t.Fatalf("recorded %d main chat steps, want 3 (tool call, report, bye)", len(main))
	}
	call, report, bye := main[0], main[1], main[2]
	for _, s := range main {
		if s.SessionID != call.SessionID {
			t.Errorf("step %s in session %s, want %s: the turns were not matched into one session", s.ID, s.SessionID, call.SessionID)
		}
		if len(s.Request.Tools) < 5 {
			t.Errorf("step %s recorded %d tools; OpenClaw sends about a dozen", s.ID, len(s.Request.Tools))
		}
	}
	if report.ParentID != call.ID || bye.ParentID != report.ID {
		t.Errorf("chain: parents %q, %q; want %q, %q", report.ParentID, bye.ParentID, call.ID, report.ID)
	}
	if got := call.Action().ToolCalls; len(got) != 1 || got[0].Name != "exec" {
		t.Fatalf("first step's action = %+v, want one exec call", call.Action())
	}
	ns := call.NextState
	if ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Role != core.RoleTool || !strings.Contains(ns.Messages[0].Content, "hi") {
		t.Errorf("first step's next state = %+v, want the exec tool result alone", ns)
	}
	ns = report.NextState
	if ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Role != core.RoleUser || !strings.Contains(ns.Messages[0].Content, "that is all") {
		t.Errorf("second step's next state = %+v, want the user's next message alone", ns)
	}
	for _, s := range main[:2] {
		if s.NextState == nil {
			continue
		}
		for _, m := range s.NextState.Messages {
			if strings.Contains(m.Content, "OPENCLAW_INTERNAL_CONTEXT") {
				t.Errorf("step %s: OpenClaw's volatile context leaked into the next state", s.ID)
			}
		}
	}
	for _, s := range []*core.Step{call, report} {
		if s.State != core.StateClosed && s.State != core.StateScored { // scored as it closed
			t.Errorf("state %s: the first two steps should be closed", s.State)
		}
	}

	// The built-ins score the real recorded turns: every closed step, one
	// score per enabled built-in, each with its module's hash.
	want := map[string]string{}
	for _, p := range reward.Builtins() {
		if p.Enabled {
			b, err := builtin.Module(p.Builtin)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.Sum256(b)
			want[p.Name] = hex.EncodeToString(h[:])
		}
	}
	closed := 0
	for _, s := range steps {
		if s.State == core.StateClosed || s.State == core.StateScored {
			closed++
		}
	}
	scored := scoreAll(t, n, before)
	if scored != closed || closed < 2 {
		t.Fatalf("scored %d steps, want the %d closed ones (at least the first two main steps)", scored, closed)
	}
	steps, err = n.Pool().List(ctx, pool.Filter{State: core.StateScored})
	if err != nil || len(steps) != closed {
		t.Fatalf("%d scored steps (%v), want %d", len(steps), err, closed)
	}
	for _, s := range steps {
		if s.Reward == nil || len(s.Reward.Scores) != len(want) {
			t.Errorf("step %s (%s, %s): reward %+v, want one score per enabled built-in (%d)", s.ID, s.Turn, s.API, s.Reward, len(want))
			continue
		}
		for _, sc := range s.Reward.Scores {
			if sc.Hash != want[sc.Plugin] {
				t.Errorf("step %s: plugin %q with hash %q, want one of the built-ins with its module's hash", s.ID, sc.Plugin, sc.Hash)
			}
			if sc.Value == nil && sc.Reason == "" {
				t.Errorf("step %s: %s abstained without a reason", s.ID, sc.Plugin)
			}
			t.Logf("step %s (%s): %s %v %q", s.ID, s.Turn, sc.Plugin, scoreText(sc.Value), sc.Reason)
		}
	}
}

func scoreText(v *float64) string {
	if v == nil {
		return "abstain"
	}
	return strconv.FormatFloat(*v, 'f', 2, 64)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
