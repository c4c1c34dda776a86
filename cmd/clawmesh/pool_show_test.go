package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/pool"
)

func fptr(v float64) *float64 { return &v }

func fakeHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestPoolShowScoredStep puts a scored step in a pool and checks that
// `clawmesh pool show` prints its reward: the combined value and hint, and
// each plugin's score (or abstention with its reason), weight, hint and
// content hash; both from the pool on disk and through a running node.
func TestPoolShowScoredStep(t *testing.T) {
	data := t.TempDir()
	const id = "step-scored-1"
	const hint = "You should have checked: it is Canberra."
	scores := []core.Score{
		{Plugin: "correction", Hash: fakeHash("correction"), Value: fptr(-0.8), Weight: 1, Labels: []string{"correction"}, Reason: "corrected: No, that's wrong."},
		{Plugin: "hint", Hash: fakeHash("hint"), Weight: 1, Hint: hint, Reason: "hint only"},
		{Plugin: "hostile", Hash: fakeHash("hostile"), Weight: 2, Reason: "deadline exceeded"},
		{Plugin: "polite", Hash: fakeHash("polite"), Value: fptr(0.5), Weight: 1},
	}
	step := &core.Step{
		ID: id, SessionID: "sess-show", ChainID: "chain-show", Turn: core.TurnMain, API: core.APIChat,
		State: core.StateScored, Source: "gateway", Model: "m",
		Request: core.Request{Model: "m", Messages: []core.Message{
			{Role: core.RoleSystem, Content: "You are helpful."},
			{Role: core.RoleUser, Content: "What is the capital of Australia?"},
		}},
		Response: core.Response{Status: 200, Choices: []core.Choice{{Message: core.Message{
			Role: core.RoleAssistant, Content: "The capital of Australia is Sydney."}, FinishReason: "stop",
			Tokens: []core.TokenLogprob{{Token: "The", ID: 785, Logprob: -0.1}}}}},
		NextState: &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "No, that's wrong. " + hint}}},
		Reward:    &core.Reward{Value: fptr(-0.3), Hint: hint, Scores: scores, At: time.Date(2025, 6, 2, 9, 14, 5, 0, time.UTC)},
		Timings:   core.Timings{Start: time.Date(2025, 6, 2, 9, 14, 3, 0, time.UTC), Total: 850 * time.Millisecond},
	}
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Put(context.Background(), step); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	check := func(how, out string) {
		t.Helper()
		lines := strings.Split(out, "\n")
		at := -1
		for i, l := range lines {
			if strings.HasPrefix(l, "reward ") {
				at = i
				break
			}
		}
		if at < 0 {
			t.Fatalf("%s: no reward line:\n%s", how, out)
		}
		if l := lines[at]; !strings.Contains(l, "-0.30") || !strings.Contains(l, "hint: "+hint) {
			t.Errorf("%s: reward line %q: want -0.30 and the hint", how, l)
		}
		if len(lines) < at+1+len(scores) {
			t.Fatalf("%s: %d lines after the reward, want one per plugin score:\n%s", how, len(lines)-at-1, out)
		}
		for i, sc := range scores {
			l := lines[at+1+i]
			f := strings.Fields(l)
			value := "abstain"
			if sc.Value != nil {
				value = fmt.Sprintf("%+.2f", *sc.Value)
			}
			if len(f) < 4 || f[0] != sc.Plugin || f[1] != value || f[2] != fmt.Sprintf("w=%.2f", sc.Weight) {
				t.Errorf("%s: score line %q: want plugin %s, %s, weight %.2f", how, l, sc.Plugin, value, sc.Weight)
				continue
			}
			// The hash is shown abbreviated to its first 12 hex digits.
			if f[3] != sc.Hash[:12] {
				t.Errorf("%s: %s: hash %q, want %q (the start of %s)", how, sc.Plugin, f[3], sc.Hash[:12], sc.Hash)
			}
			if sc.Reason != "" && !strings.Contains(l, "("+sc.Reason+")") {
				t.Errorf("%s: %s: line %q lacks the reason %q", how, sc.Plugin, l, sc.Reason)
			}
			if len(sc.Labels) > 0 && !strings.Contains(l, "labels: "+strings.Join(sc.Labels, ",")) {
				t.Errorf("%s: %s: score line %q does not show the labels %q", how, sc.Plugin, l, sc.Labels)
			}
			if sc.Hint != "" && !strings.Contains(l, "hint: "+sc.Hint) {
				t.Errorf("%s: %s: line %q lacks the hint %q", how, sc.Plugin, l, sc.Hint)
			}
		}
		if !strings.Contains(out, "finish stop, 1 token recorded,") {
			t.Errorf("%s: the action's header does not say \"1 token recorded\":\n%s", how, out)
		}
		if !strings.Contains(out, "step     "+id) || !strings.Contains(out, "state    scored") {
			t.Errorf("%s: header:\n%s", how, out)
		}
	}

	stopped, errs, code := runCLI(t, "pool", "show", id, "--data", data)
	if code != 0 {
		t.Fatalf("pool show: code %d, %s", code, errs)
	}
	check("stopped", stopped)

	// --json carries the whole reward.
	js, errs, code := runCLI(t, "pool", "show", "--json", "--data", data, id)
	if code != 0 {
		t.Fatalf("pool show --json: code %d, %s", code, errs)
	}
	var got core.Step
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatalf("pool show --json: %v\n%s", err, js)
	}
	if rw := got.Reward; rw == nil || rw.Value == nil || *rw.Value != -0.3 || rw.Hint != hint || len(rw.Scores) != len(scores) {
		t.Fatalf("pool show --json: reward %+v", got.Reward)
	}
	for i, sc := range got.Reward.Scores {
		w := scores[i]
		if sc.Plugin != w.Plugin || sc.Hash != w.Hash || (sc.Value == nil) != (w.Value == nil) || sc.Value != nil && *sc.Value != *w.Value ||
			sc.Weight != w.Weight || sc.Hint != w.Hint || sc.Reason != w.Reason {
			t.Errorf("pool show --json: score %d %+v, want %+v", i, sc, w)
		}
	}

	// The same through a running node's admin API.
	runTestNode(t, data, "http://127.0.0.1:9/v1")
	running, errs, code := runCLI(t, "pool", "show", id, "--data", data)
	if code != 0 {
		t.Fatalf("pool show while running: code %d, %s", code, errs)
	}
	check("running", running)
	if running != stopped {
		t.Errorf("pool show differs through the running node:\n%s\nvs\n%s", running, stopped)
	}
	ls, _, code := runCLI(t, "pool", "ls", "--data", data)
	if code != 0 || !strings.Contains(ls, id) || !strings.Contains(ls, "-0.30") {
		t.Errorf("pool ls: %q", ls)
	}
}

// TestPoolLsFailedStep: pool ls --state failed lists a call the upstream
// refused with the status and the upstream's message where its reply would
// be, and pool stats counts it.
func TestPoolLsFailedStep(t *testing.T) {
	data := t.TempDir()
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 6, 2, 9, 14, 3, 0, time.UTC)
	for _, s := range []*core.Step{
		{ID: "failed-1", SessionID: "s1", Turn: core.TurnMain, API: core.APIChat, State: core.StateFailed, Source: "gateway",
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: "a very long prompt"}}},
			Response: core.Response{Status: 400, Error: json.RawMessage(`{"message":"prompt is too long","type":"invalid_request_error"}`)},
			Timings:  core.Timings{Start: at}},
		{ID: "good-1", SessionID: "s2", Turn: core.TurnMain, API: core.APIChat, State: core.StateClosed, Source: "gateway",
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: "hi"}}},
			Response: core.Response{Status: 200, Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "hello"}}}},
			Timings:  core.Timings{Start: at.Add(time.Second)}},
	} {
		if err := p.Put(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	out := cli(t, "pool", "ls", "--state", "failed", "--data", data)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "failed-1 ") || !strings.HasSuffix(lines[1], "(error 400: prompt is too long)") {
		t.Errorf("pool ls --state failed:\n%s", out)
	}
	if out := cli(t, "pool", "stats", "--data", data); !strings.Contains(out, "failed 1 closed 1") {
		t.Errorf("pool stats:\n%s", out)
	}
}
