package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

// startNode runs a node in front of a scripted upstream and returns it with
// its gateway's base URL.
func startNode(t *testing.T, script fakeupstream.Script, cfg node.Config) (*node.Node, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	up := fakeupstream.New(script)
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, upLn)
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.Upstream = "http://" + upLn.Addr().String() + "/v1"
	n, err := node.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The tests score by hand what they record: the plugins compile in
	// the background, and score on their own what was closed before.
	if err := n.PluginsReady(ctx); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
		n.Close(context.Background())
	})
	return n, "http://" + ln.Addr().String()
}

func post(t *testing.T, url, body string, hdr ...string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body) // the whole reply, as an agent reads it
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d", url, resp.StatusCode)
	}
}

// TestScoresClosedSteps records a turn the user corrects and one whose tool
// failed, and checks that the node's built-in WASM plugins score them with
// the right sign and an OPD hint, and that open steps are left alone.
func TestScoresClosedSteps(t *testing.T) {
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Text: "The capital of Australia is Sydney."},
		{ToolCalls: []fakeupstream.ToolCall{{ID: "call_1", Name: "exec", Arguments: `{"command":"make"}`}}},
		{Text: "Fixed."},
		{Text: "Done again."},
		{Text: "Bye."},
	}}, node.Config{ScoreInterval: time.Hour})
	ctx := context.Background()
	before := n.Scorer().Scored
	chat := base + "/v1/chat/completions"
	sys := `{"role":"system","content":"You are helpful."}`
	u1 := `{"role":"user","content":"What is the capital of Australia?"}`
	a1 := `{"role":"assistant","content":"The capital of Australia is Sydney."}`
	u2 := `{"role":"user","content":"No, that's wrong. You should have checked: it is Canberra. Now build the project."}`
	tc := `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"exec","arguments":"{\"command\":\"make\"}"}}]}`
	tr := `{"role":"tool","tool_call_id":"call_1","content":"make: *** [all] Error 2\nerror: undefined reference to main (exit status 2)"}`
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`]}`)
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`]}`)
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`,`+tc+`,`+tr+`]}`)

	if scored := scoreAll(t, n, before); scored != 2 {
		t.Fatalf("scored %d steps, want the 2 closed ones", scored)
	}
	steps, err := n.Pool().List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 {
		t.Fatalf("%d steps", len(steps))
	}
	var corrected, failed *core.Step
	for _, s := range steps {
		switch {
		case strings.Contains(s.Action().Content, "Sydney"):
			corrected = s
		case len(s.Action().ToolCalls) == 1:
			failed = s
		default:
			if s.State != core.StateOpen || s.Reward != nil {
				t.Errorf("the last step has no next state yet: state %s, reward %v", s.State, s.Reward)
			}
		}
	}
	for _, c := range []struct {
		name string
		s    *core.Step
	}{{"corrected answer", corrected}, {"failed tool call", failed}} {
		s := c.s
		if s == nil || s.State != core.StateScored || s.Reward == nil || s.Reward.Value == nil {
			t.Fatalf("%s: not scored: %+v", c.name, s)
		}
		if *s.Reward.Value >= 0 {
			t.Errorf("%s: reward %+.2f, want negative; scores %+v", c.name, *s.Reward.Value, s.Reward.Scores)
		}
		if s.Reward.Hint == "" {
			t.Errorf("%s: no hint for on-policy distillation; scores %+v", c.name, s.Reward.Scores)
		}
		if len(s.Reward.Scores) < 3 {
			t.Errorf("%s: %d plugin scores, want one per enabled built-in", c.name, len(s.Reward.Scores))
		}
		for _, sc := range s.Reward.Scores {
			if len(sc.Hash) != 64 {
				t.Errorf("%s: plugin %s has no content hash", c.name, sc.Plugin)
			}
		}
	}
	if !strings.Contains(failed.Reward.Hint, "Error 2") && !strings.Contains(failed.Reward.Hint, "undefined reference") {
		t.Errorf("the tool error should be the failed call's hint, got %q", failed.Reward.Hint)
	}

	// Scoring again finds nothing new.
	if again, _ := n.ScoreClosed(ctx, 100); again != 0 {
		t.Errorf("rescored %d steps", again)
	}

	// Feedback that comes after the step was scored is not lost: the step
	// is scored again, with it.
	post(t, base+"/clawmesh/v1/feedback", `{"step_id":"`+string(corrected.ID)+`","score":1,"text":"/good"}`)
	if again, err := n.ScoreClosed(ctx, 100); err != nil || again != 1 {
		t.Fatalf("after late feedback: rescored %d steps (%v), want 1", again, err)
	}
	s, err := n.Pool().Get(ctx, corrected.ID)
	if err != nil {
		t.Fatal(err)
	}
	var fb *core.Score
	for i, sc := range s.Reward.Scores {
		if sc.Plugin == "feedback" {
			fb = &s.Reward.Scores[i]
		}
	}
	if s.State != core.StateScored || fb == nil || fb.Value == nil || *fb.Value <= 0 {
		t.Errorf("after late feedback: state %s, feedback plugin %+v", s.State, fb)
	}

	// Reloading to another plugin set works live: the next step is scored
	// by the new set alone, weights included.
	if err := n.ReloadPlugins(ctx, []reward.PluginConfig{{Builtin: "feedback", Enabled: true, Weight: 0.5}}); err != nil {
		t.Fatal(err)
	}
	a3 := `{"role":"assistant","content":"Fixed."}`
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`,`+tc+`,`+tr+`,`+a3+`,{"role":"user","content":"/good"}]}`)
	fixed := scoreOne(t, n, "Fixed.")
	if sc := fixed.Reward.Scores; len(sc) != 1 || sc[0].Plugin != "feedback" || sc[0].Weight != 0.5 || sc[0].Value == nil || *sc[0].Value != 1 {
		t.Fatalf("after the reload: scores %+v, want feedback's alone, +1 at weight 0.5", sc)
	}
	if v := fixed.Reward.Value; v == nil || *v != 0.5 {
		t.Errorf("after the reload: reward %v, want 0.5", v)
	}

	// A set with a plugin that cannot be loaded is refused, naming it, and
	// the set in use stays.
	missing := filepath.Join(t.TempDir(), "polite.wasm")
	err = n.ReloadPlugins(ctx, []reward.PluginConfig{{Builtin: "correction", Enabled: true}, {Path: missing, Enabled: true}})
	if !errors.Is(err, reward.ErrUnusable) || !strings.Contains(err.Error(), `"polite"`) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("reload with a missing plugin: %v, want reward.ErrUnusable naming polite", err)
	}
	a4 := `{"role":"assistant","content":"Done again."}`
	post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`,`+tc+`,`+tr+`,`+a3+`,{"role":"user","content":"/good"},`+a4+`,{"role":"user","content":"/bad"}]}`)
	if sc := scoreOne(t, n, "Done again.").Reward.Scores; len(sc) != 1 || sc[0].Plugin != "feedback" || sc[0].Value == nil || *sc[0].Value != -1 {
		t.Fatalf("after a refused reload: scores %+v, want feedback's alone", sc)
	}
}

// scoreAll scores the closed steps left (the background scorer scores a
// step the gateway closes as it closes it; ScoreClosed, what is left) and
// returns how many steps were scored since the scorer's count was before.
func scoreAll(t *testing.T, n *node.Node, before uint64) int {
	t.Helper()
	ctx := context.Background()
	// ScoreClosed leaves the steps handed to the background scorer, which
	// may still be compiling its plugins on a loaded machine: the passes
	// wait for it, up to a bound.
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := n.ScoreClosed(ctx, 1000); err != nil {
			t.Fatal(err)
		}
		left, err := n.Pool().List(ctx, pool.Filter{State: core.StateClosed})
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			return int(n.Scorer().Scored - before)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d closed steps are left after a minute of passes", len(left))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scoreOne scores the closed steps and returns the one whose action says
// action.
func scoreOne(t *testing.T, n *node.Node, action string) *core.Step {
	t.Helper()
	ctx := context.Background()
	// The background scorer may hold the step (ScoreClosed leaves the
	// steps handed to it): wait for its verdict, up to a bound.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := n.ScoreClosed(ctx, 100); err != nil {
			t.Fatal(err)
		}
		steps, err := n.Pool().List(ctx, pool.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		var found *core.Step // the first that answered it
		for _, s := range steps {
			if s.Action().Content == action {
				found = s
				break
			}
		}
		switch {
		case found == nil:
			t.Fatalf("no step answered %q", action)
		case found.State == core.StateScored && found.Reward != nil:
			return found
		case found.State != core.StateClosed || time.Now().After(deadline):
			t.Fatalf("step %q: state %s, reward %+v", action, found.State, found.Reward)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNodeRefusesUnusablePlugin: a node whose configuration enables a
// plugin that cannot be loaded does not start, and says which and why.
func TestNodeRefusesUnusablePlugin(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "polite", "polite.wasm")
	_, err := node.New(context.Background(), node.Config{
		DataDir:  t.TempDir(),
		Upstream: "http://127.0.0.1:9/v1",
		Plugins:  []reward.PluginConfig{{Builtin: "feedback", Enabled: true}, {Path: missing, Enabled: true}},
	})
	if !errors.Is(err, reward.ErrUnusable) || !strings.Contains(err.Error(), `"polite"`) || !strings.Contains(err.Error(), missing+": no such file") {
		t.Fatalf("New: %v, want reward.ErrUnusable naming polite and its path", err)
	}
	// Disabled, it is no reason not to start.
	n, err := node.New(context.Background(), node.Config{
		DataDir:  t.TempDir(),
		Upstream: "http://127.0.0.1:9/v1",
		Plugins:  []reward.PluginConfig{{Builtin: "feedback", Enabled: true}, {Path: missing}},
	})
	if err != nil {
		t.Fatalf("New with the plugin disabled: %v", err)
	}
	n.Close(context.Background())
}

// TestJudgeModel checks which model the node's judge asks: the configured
// judge model, else the model the judged step asked for (never none: a
// server such as Ollama refuses a request without one).
func TestJudgeModel(t *testing.T) {
	for _, c := range []struct{ judgeModel, want string }{{"", "agent-model"}, {"judge-model", "judge-model"}} {
		var mu sync.Mutex
		var models []string
		script := fakeupstream.Script{Respond: func(_ int, r fakeupstream.Request) fakeupstream.Turn {
			var body struct {
				Model    string
				Messages []struct{ Content string }
			}
			json.Unmarshal(r.Body, &body)
			if len(body.Messages) > 0 && strings.Contains(body.Messages[0].Content, "You are judging one turn") {
				mu.Lock()
				models = append(models, body.Model)
				mu.Unlock()
				return fakeupstream.Turn{Text: "Score: 1"}
			}
			return fakeupstream.Turn{Text: "Canberra."}
		}}
		n, base := startNode(t, script, node.Config{
			ScoreInterval: time.Hour,
			JudgeModel:    c.judgeModel,
			Plugins:       []reward.PluginConfig{{Builtin: "judge", Enabled: true, Judge: true}},
		})
		chat := base + "/v1/chat/completions"
		u1 := `{"role":"user","content":"What is the capital of Australia?"}`
		post(t, chat, `{"model":"agent-model","messages":[`+u1+`]}`)
		post(t, chat, `{"model":"agent-model","messages":[`+u1+`,{"role":"assistant","content":"Canberra."},{"role":"user","content":"thanks"}]}`)
		s := scoreOne(t, n, "Canberra.")
		mu.Lock()
		if sc := s.Reward.Scores; len(sc) != 1 || sc[0].Value == nil || *sc[0].Value != 1 {
			t.Errorf("judge model %q: scores %+v, want the judge's +1", c.judgeModel, sc)
		}
		if len(models) != 3 {
			t.Errorf("judge model %q: %d judge calls, want 3", c.judgeModel, len(models))
		}
		for _, m := range models {
			if m != c.want {
				t.Errorf("judge model %q: a judge call asked for model %q, want %q", c.judgeModel, m, c.want)
			}
		}
		mu.Unlock()
	}
}

// TestRestartResumesChains: a node stopped between two turns of a
// conversation (an upgrade, a reboot) does not lose the first turn's next
// state: the node started on the same data resumes the open chains, for
// sessions matched by message prefix and for explicit ones alike.
func TestRestartResumesChains(t *testing.T) {
	up := fakeupstream.New(fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "first"}}})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upCtx, upCancel := context.WithCancel(context.Background())
	defer upCancel()
	go up.Run(upCtx, upLn)
	data := t.TempDir()
	cfg := node.Config{DataDir: data, Upstream: "http://" + upLn.Addr().String() + "/v1", NoScoring: true}
	run := func(calls func(chat string)) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		n, err := node.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- n.Serve(ctx, ln) }()
		calls("http://" + ln.Addr().String() + "/v1/chat/completions")
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := n.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	sys := `{"role":"system","content":"You are helpful."}`
	u1 := `{"role":"user","content":"hello"}`
	a1 := `{"role":"assistant","content":"first"}`
	run(func(chat string) {
		post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`]}`)
		post(t, chat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"pinned"}]}`, "X-Session-Id", "pinned")
	})
	run(func(chat string) {
		post(t, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,{"role":"user","content":"and then?"}]}`)
		post(t, chat, `{"model":"m","messages":[{"role":"user","content":"pinned"},`+a1+`,{"role":"user","content":"more"}]}`, "X-Session-Id", "pinned")
	})

	p, err := pool.Open(data+"/pool", pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	steps, err := p.List(context.Background(), pool.Filter{})
	if err != nil || len(steps) != 4 {
		t.Fatalf("%d steps (%v)", len(steps), err)
	}
	byText := map[string]*core.Step{}
	for _, s := range steps {
		byText[s.Request.Messages[len(s.Request.Messages)-1].Content] = s
	}
	for _, c := range []struct{ first, next string }{{"hello", "and then?"}, {"pinned", "more"}} {
		s, cont := byText[c.first], byText[c.next]
		if s == nil || cont == nil {
			t.Fatalf("steps %v", byText)
		}
		if s.State != core.StateClosed || s.NextState == nil || len(s.NextState.Messages) != 1 || s.NextState.Messages[0].Content != c.next || s.NextState.StepID != cont.ID {
			t.Errorf("%s: state %s, next state %+v: want %q from the call after the restart", c.first, s.State, s.NextState, c.next)
		}
		if cont.SessionID != s.SessionID || cont.ParentID != s.ID || cont.ChainID != s.ChainID {
			t.Errorf("%s: continuation in session %s chain %s parent %s, want %s %s %s", c.first, cont.SessionID, cont.ChainID, cont.ParentID, s.SessionID, s.ChainID, s.ID)
		}
		if cont.State != core.StateOpen {
			t.Errorf("%s: the continuation is %s, want open (its chain goes on)", c.next, cont.State)
		}
	}
}

// TestFailedCallsAreNotTrained: calls the upstream refused (4xx, 5xx) are
// recorded failed: counted by state, listed by state, never scored or
// sealed into a batch.
func TestFailedCallsAreNotTrained(t *testing.T) {
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Status: 400, ErrorBody: `{"error":{"message":"prompt too long","type":"invalid_request_error"}}`},
		{Status: 503},
		{Text: "fine"},
	}}, node.Config{ScoreInterval: time.Hour, Share: share.Policy{Mode: share.ModeAll}})
	ctx := context.Background()
	for i, want := range []int{400, 503, 200} {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"q`+string(rune('a'+i))+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("call %d: status %d, want %d", i, resp.StatusCode, want)
		}
	}
	// The good call's step closes when its session is done; the failed
	// ones are never candidates.
	if err := n.Pool().Update(ctx, mustOne(t, n, core.StateOpen).ID, func(s *core.Step) error { s.State = core.StateClosed; return nil }); err != nil {
		t.Fatal(err)
	}
	if scored, err := n.ScoreClosed(ctx, 100); err != nil || scored != 1 {
		t.Fatalf("scored %d, %v: want only the good call", scored, err)
	}
	if _, err := n.Outbox().SealAll(ctx); err != nil {
		t.Fatal(err)
	}
	failed, err := n.Pool().List(ctx, pool.Filter{State: core.StateFailed})
	if err != nil || len(failed) != 2 {
		t.Fatalf("failed steps: %d, %v", len(failed), err)
	}
	for _, s := range failed {
		if s.Reward != nil || s.Response.Status < 400 {
			t.Errorf("failed step %s: status %d, reward %v", s.ID, s.Response.Status, s.Reward)
		}
	}
	st, err := n.Pool().Stats(ctx)
	if err != nil || st.ByState[core.StateFailed] != 2 || st.ByState[core.StateBatched]+st.ByState[core.StateHeld] != 1 {
		t.Fatalf("stats %v, %v: want 2 failed and the good step batched or held", st.ByState, err)
	}
}

func mustOne(t *testing.T, n *node.Node, st core.State) *core.Step {
	t.Helper()
	steps, err := n.Pool().List(context.Background(), pool.Filter{State: st})
	if err != nil || len(steps) != 1 {
		t.Fatalf("%d %s steps, %v; want 1", len(steps), st, err)
	}
	return steps[0]
}
