package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

// buildHostile compiles reward/testdata/hostile (a plugin that misbehaves
// as the last user message of the step's context asks) into t's temp dir.
func buildHostile(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH to build the hostile plugin")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log bytes.Buffer
	out := filepath.Join(t.TempDir(), "hostile.wasm")
	if _, err := reward.Build(ctx, filepath.Join("..", "reward", "testdata", "hostile"), out, &log); err != nil {
		t.Fatalf("building the hostile plugin: %v\n%s", err, log.String())
	}
	return out
}

// postWithin is post with a bound on the whole call: a gateway that hangs
// fails the test instead of hanging it. It returns the reply's body.
func postWithin(t *testing.T, c *http.Client, url, body string) []byte {
	t.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: reading the reply: %v", url, err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d: %s", url, resp.StatusCode, b)
	}
	return b
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestNodeKeepsServingWithHostilePlugins runs a node whose plugin set holds
// the built-ins and two instances of a hostile plugin (an infinite loop, a
// memory bomb, os.Exit, a crashing goroutine, a panic and a sandbox escape
// attempt, chosen by the user's message), with the background scorer running
// every 50 ms. Conversations whose first turn the user corrects are driven
// through the gateway while it scores; every call must succeed, every closed
// step must end up scored with the built-ins' verdicts and the hostile
// plugins abstaining with the reason, and the gateway must still answer
// afterwards.
func TestNodeKeepsServingWithHostilePlugins(t *testing.T) {
	start := time.Now()
	hostile := buildHostile(t)
	plugins := reward.Builtins()
	var builtins []string
	for _, p := range plugins {
		if p.Enabled {
			builtins = append(builtins, p.Name)
		}
	}
	hostiles := []string{"hostile", "hostile-heavy"}
	plugins = append(plugins,
		reward.PluginConfig{Name: hostiles[0], Path: hostile, Enabled: true},
		reward.PluginConfig{Name: hostiles[1], Path: hostile, Weight: 3, Enabled: true})
	const answer = "The capital of Australia is Sydney."
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: answer}}},
		node.Config{Plugins: plugins, ScoreInterval: 50 * time.Millisecond})
	ctx := context.Background()
	client := &http.Client{Timeout: 15 * time.Second}

	// The first user message of each session picks the hostile plugin's
	// behaviour on that session's first step; "ok" makes it score 0.25,
	// after all the failures before it.
	modes := []struct{ mode, reason string }{
		{"spin", "deadline exceeded"},
		// The memory bomb grows to the 64 MiB cap 1 MiB at a time; on a
		// busy machine the 100 ms deadline may stop it first.
		{"oom", "out of memory|deadline exceeded"},
		{"exit", "exited with code 3"},
		{"fatal", "panic: boom in a goroutine"},
		{"panic", "plugin panicked"},
		{"escape", "contained:"},
		{"ok", ""},
	}
	sys := `{"role":"system","content":"You are helpful."}`
	a1 := `{"role":"assistant","content":"` + answer + `"}`
	u2 := `{"role":"user","content":"No, that's wrong. You should have checked: it is Canberra. Now build the project."}`
	calls := 0
	for _, m := range modes {
		chat := base + "/s/hostile-" + m.mode + "/v1/chat/completions"
		u1 := `{"role":"user","content":"` + m.mode + `"}`
		// The turn the user corrects, then the continuation that closes it:
		// the scorer picks the closed step up while the next sessions run.
		postWithin(t, client, chat, `{"model":"m","messages":[`+sys+`,`+u1+`]}`)
		postWithin(t, client, chat, `{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`]}`)
		calls += 2
	}

	// Wait for the background scorer (no direct ScoreClosed call), calling
	// the gateway all along.
	var scored []*core.Step
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		steps, err := n.Pool().List(ctx, pool.Filter{State: core.StateScored})
		if err != nil {
			t.Fatal(err)
		}
		if len(steps) >= len(modes) {
			scored = steps
			break
		}
		if time.Now().After(deadline) {
			all, _ := n.Pool().List(ctx, pool.Filter{})
			for _, s := range all {
				t.Logf("step %s session %s state %s reward %+v", s.ID, s.SessionID, s.State, s.Reward)
			}
			t.Fatalf("after 20 s, %d of %d closed steps scored", len(steps), len(modes))
		}
		postWithin(t, client, fmt.Sprintf("%s/s/bystander-%d/v1/chat/completions", base, i),
			`{"model":"m","messages":[{"role":"user","content":"still there?"}]}`)
		calls++
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d gateway calls, all answered; %d steps scored after %v", calls, len(scored), time.Since(start).Round(time.Millisecond))

	bySession := map[core.SessionID]*core.Step{}
	for _, s := range scored {
		bySession[s.SessionID] = s
	}
	for _, m := range modes {
		s := bySession[core.SessionID("hostile-"+m.mode)]
		if s == nil {
			t.Errorf("%s: the corrected step was not scored", m.mode)
			continue
		}
		if got := s.Request.Messages[len(s.Request.Messages)-1].Content; got != m.mode || s.NextState == nil {
			t.Errorf("%s: scored the wrong step (last user message %q, next state %+v)", m.mode, got, s.NextState)
		}
		rw := s.Reward
		if rw == nil || rw.Value == nil {
			t.Errorf("%s: no combined reward: %+v", m.mode, rw)
			continue
		}
		scores := map[string]core.Score{}
		for _, sc := range rw.Scores {
			scores[sc.Plugin] = sc
			if len(sc.Hash) != 64 {
				t.Errorf("%s: plugin %s has no content hash (%q)", m.mode, sc.Plugin, sc.Hash)
			}
		}
		if len(rw.Scores) != len(builtins)+len(hostiles) {
			t.Errorf("%s: %d scores, want one per enabled plugin (%d)", m.mode, len(rw.Scores), len(builtins)+len(hostiles))
		}
		scoredBuiltins := 0
		for _, b := range builtins {
			sc, ok := scores[b]
			switch {
			case !ok:
				t.Errorf("%s: no score from the built-in %s", m.mode, b)
			case sc.Value != nil:
				scoredBuiltins++
			case sc.Reason == "":
				t.Errorf("%s: built-in %s abstained without a reason", m.mode, b)
			}
		}
		if scoredBuiltins == 0 {
			t.Errorf("%s: every built-in abstained: %+v", m.mode, rw.Scores)
		}
		for _, h := range hostiles {
			sc, ok := scores[h]
			switch {
			case !ok:
				t.Errorf("%s: no entry for %s", m.mode, h)
			case m.reason == "":
				if sc.Value == nil || *sc.Value != 0.25 {
					t.Errorf("%s: %s on a good input after its failures: value %v reason %q, want 0.25", m.mode, h, sc.Value, sc.Reason)
				}
			case sc.Value != nil:
				t.Errorf("%s: %s scored %v, want an abstention", m.mode, h, *sc.Value)
			case !containsAny(sc.Reason, strings.Split(m.reason, "|")):
				t.Errorf("%s: %s abstained with %q, want a reason containing %q", m.mode, h, sc.Reason, m.reason)
			default:
				t.Logf("%s: %s abstained: %s", m.mode, h, sc.Reason)
			}
		}
		// The hostile plugins' abstentions take nothing away: the user's
		// correction still makes the reward negative, with a hint.
		if m.reason != "" && *rw.Value >= 0 {
			t.Errorf("%s: reward %+.2f, want negative (the user corrected the answer); scores %+v", m.mode, *rw.Value, rw.Scores)
		}
		if rw.Hint == "" {
			t.Errorf("%s: no hint; scores %+v", m.mode, rw.Scores)
		}
	}

	// The gateway still answers, both a new session and a continuation.
	reply := postWithin(t, client, base+"/s/after/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello again"}]}`)
	var got struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(reply, &got); err != nil || len(got.Choices) != 1 || got.Choices[0].Message.Content != answer {
		t.Errorf("after scoring: reply %s (%v)", reply, err)
	}
	u1 := `{"role":"user","content":"spin"}`
	a2 := `{"role":"assistant","content":"` + answer + `"}`
	postWithin(t, client, base+"/s/hostile-spin/v1/chat/completions",
		`{"model":"m","messages":[`+sys+`,`+u1+`,`+a1+`,`+u2+`,`+a2+`,{"role":"user","content":"thanks"}]}`)

	// /metrics counts the hostile plugins' failures, and none of the
	// built-ins'.
	fams := scrape(t, base+"/metrics", "")
	for _, h := range hostiles {
		if got := value(t, fams, "clawmesh_plugin_failures_total", "plugin", h); got < 3 {
			t.Errorf("%s: %v failures counted, want at least the deadline, the exit and the panics", h, got)
		}
	}
	for _, b := range builtins {
		if got := value(t, fams, "clawmesh_plugin_failures_total", "plugin", b); got != 0 {
			t.Errorf("built-in %s: %v failures counted", b, got)
		}
	}
}
