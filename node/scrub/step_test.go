package scrub

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func f64(v float64) *float64 { return &v }

// agentStep is a step with something to scrub in every field that leaves.
func agentStep() *core.Step {
	start := time.Date(2026, 3, 1, 12, 34, 56, 789, time.UTC)
	return &core.Step{
		ID: "01JSTEP", SessionID: "sess-alice", ChainID: "chain-1", ParentID: "01JPARENT",
		Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
		Request: core.Request{
			Model: "qwen3-8b",
			Messages: []core.Message{
				{Role: core.RoleSystem, Content: "You help alice@example.org."},
				{Role: core.RoleUser, Name: "alice", Content: "read ~/notes and call me on +44 20 7946 0958",
					Parts: []core.Part{{Type: "image_url", Raw: json.RawMessage(`{"url":"data:image/png;base64,AAAA"}`)}}},
				{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{
					{ID: "call_1", Type: "function", Name: "read", Arguments: `{"path":"/home/alice/notes.txt"}`},
					{ID: "call_2", Type: "function", Name: "browser", Arguments: `{"url":"https://bank.example/"}`},
				}},
				{Role: core.RoleTool, ToolCallID: "call_1", Content: "buy milk; bob@example.org owes me"},
				{Role: core.RoleTool, ToolCallID: "call_2", Content: "balance 1,234.56 on GB82 WEST 1234 5698 7654 32"},
			},
			Tools:  []core.Tool{{Name: "read", Description: "Reads files under /home/alice.", Parameters: json.RawMessage(`{"type":"object"}`)}},
			Params: json.RawMessage(`{"temperature":0.7,"user":"alice-123","metadata":{"user_id":"u1"},"prompt_cache_key":"k","max_tokens":100}`),
		},
		Response: core.Response{
			ID: "chatcmpl-xyz", Model: "qwen3-8b", Status: 200,
			Choices: []core.Choice{
				{Index: 0, Message: core.Message{Role: core.RoleAssistant, Content: "Mail bob@example.org, password: hunter2"},
					Tokens: []core.TokenLogprob{{Token: "Mail", ID: 1, Logprob: -0.1}}, Fidelity: core.FidelityExact},
				{Index: 1, Message: core.Message{Role: core.RoleAssistant, Content: "Done."},
					Tokens: []core.TokenLogprob{{Token: "Done.", ID: 2, Logprob: -0.2}}, Fidelity: core.FidelityExact},
			},
			Usage:          &core.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15},
			PromptTokenIDs: []int{1, 2, 3},
			Error:          json.RawMessage(`{"message":"upstream at http://10.0.0.5 said no"}`),
		},
		Upstream: "http://10.0.0.5:8000/v1", Model: "qwen3-8b", Adapter: "v3",
		Timings: core.Timings{Start: start, TTFT: time.Second, Total: 2 * time.Second},
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
		NextState: &core.NextState{StepID: "01JNEXT", Messages: []core.Message{
			{Role: core.RoleUser, Content: "no, mail alice@example.org instead"},
		}},
		Feedback: []core.Feedback{{Score: f64(-1), Text: "wrong, it's alice@example.org", At: start.Add(time.Minute)}},
		Reward: &core.Reward{Value: f64(-0.5), Hint: "use alice@example.org", At: start.Add(2 * time.Minute),
			Scores: []core.Score{{Plugin: "correction", Hash: "abc", Value: f64(-1), Weight: 1, Hint: "use alice@example.org", Labels: []string{"re-ask"}, Reason: "user corrected"}}},
		Source: "gateway",
	}
}

func TestStep(t *testing.T) {
	s, _ := New(Options{Names: []string{"alice"}})
	in := agentStep()
	orig, _ := json.Marshal(in)
	p := s.NewPass()
	var tb Table
	out, err := p.Step(&tb, in, &StepOptions{Key: testKey, Tools: []string{"read"}})
	if err != nil {
		t.Fatal(err)
	}
	if after, _ := json.Marshal(in); string(after) != string(orig) {
		t.Fatal("Step changed its input")
	}
	if err := out.Validate(); err != nil {
		t.Fatalf("scrubbed step does not validate: %v", err)
	}
	raw, _ := json.Marshal(out)
	js := string(raw)
	for _, leak := range []string{"alice", "bob@", "7946", "GB82", "hunter2", "10.0.0.5", "chatcmpl", "4bf92f", "sess-", "01JSTEP", "01JPARENT", "01JNEXT", "chain-1", "alice-123", "prompt_cache_key", "base64", "12:34"} {
		if strings.Contains(js, leak) {
			t.Errorf("scrubbed step still holds %q:\n%s", leak, js)
		}
	}
	// Ids: keyed hashes, stable for the key, another key another hash.
	if out.ID != core.StepID(HashID(testKey, "step", "01JSTEP")) || len(out.ID) != 24 ||
		out.ParentID != core.StepID(HashID(testKey, "step", "01JPARENT")) || out.NextState.StepID != core.StepID(HashID(testKey, "step", "01JNEXT")) {
		t.Errorf("ids: %s %s %s", out.ID, out.ParentID, out.NextState.StepID)
	}
	if HashID([]byte("another key, 32 bytes long......"), "step", "01JSTEP") == string(out.ID) {
		t.Error("the id hash does not depend on the key")
	}
	if HashID(testKey, "session", "x") == HashID(testKey, "step", "x") {
		t.Error("the id hash does not depend on the kind")
	}
	// Times rounded to the hour; durations gone.
	want := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if !out.Timings.Start.Equal(want) || out.Timings.TTFT != 0 || !out.Reward.At.Equal(want) || !out.Feedback[0].At.Equal(want) {
		t.Errorf("times: %+v, reward at %v, feedback at %v", out.Timings, out.Reward.At, out.Feedback[0].At)
	}
	msgs := out.Request.Messages
	if msgs[1].Name != "" || len(msgs[1].Parts) != 1 || msgs[1].Parts[0].Type != "image_url" || msgs[1].Parts[0].Raw != nil {
		t.Errorf("user message: %+v", msgs[1])
	}
	// The allowed tool's result leaves scrubbed, the other's is withheld.
	if msgs[3].Content != "buy milk; <EMAIL_2> owes me" || msgs[4].Content != Withheld {
		t.Errorf("tool results: %q, %q", msgs[3].Content, msgs[4].Content)
	}
	if args := msgs[2].ToolCalls[0].Arguments; args != `{"path":"/home/<USER_1>/notes.txt"}` || !json.Valid([]byte(args)) {
		t.Errorf("arguments: %s", args)
	}
	if got := string(out.Request.Params); got != `{"max_tokens":100,"temperature":0.7}` {
		t.Errorf("params: %s", got)
	}
	// The prompt changed: its token ids go. Choice 0 changed: its tokens
	// go and it is marked; choice 1 did not: it keeps them.
	c0, c1 := out.Response.Choices[0], out.Response.Choices[1]
	if out.Response.PromptTokenIDs != nil || c0.Tokens != nil || c0.Fidelity != core.FidelityScrubbed || c0.Message.Content != "Mail <EMAIL_2>, password: <SECRET_1>" {
		t.Errorf("choice 0: %+v, prompt ids %v", c0, out.Response.PromptTokenIDs)
	}
	if len(c1.Tokens) != 1 || c1.Fidelity != core.FidelityExact {
		t.Errorf("choice 1: %+v", c1)
	}
	// The same address is the same placeholder everywhere in the step.
	if out.NextState.Messages[0].Content != "no, mail <EMAIL_1> instead" || out.Reward.Hint != "use <EMAIL_1>" || out.Feedback[0].Text != "wrong, it's <EMAIL_1>" {
		t.Errorf("next state %q, hint %q, feedback %q", out.NextState.Messages[0].Content, out.Reward.Hint, out.Feedback[0].Text)
	}
	sc := out.Reward.Scores[0]
	if sc.Plugin != "correction" || sc.Hash != "abc" || *sc.Value != -1 || *out.Reward.Value != -0.5 || out.Adapter != "v3" || out.Model != "qwen3-8b" {
		t.Errorf("kept fields: %+v, adapter %q", sc, out.Adapter)
	}
	if out.Upstream != "" || out.TraceID != "" || out.Response.ID != "" || out.Response.Error != nil {
		t.Errorf("dropped fields remain: %q %q %q %s", out.Upstream, out.TraceID, out.Response.ID, out.Response.Error)
	}
	// Every tool allowed.
	all, _ := p.Step(&Table{}, in, &StepOptions{Key: testKey, Tools: []string{"*"}})
	if c := all.Request.Messages[4].Content; c != "balance 1,234.56 on <IBAN_1>" {
		t.Errorf("with tools *: %q", c)
	}
	if _, err := p.Step(&Table{}, in, &StepOptions{Key: testKey[:8]}); err != ErrKey {
		t.Errorf("a short key: %v", err)
	}
}

// TestStepUnchanged: a step with nothing to scrub keeps its tokens and its
// prompt's token ids.
func TestStepUnchanged(t *testing.T) {
	s, _ := New(Options{})
	in := &core.Step{ID: "a", SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
		Request: core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: "What is 2+2?"}}},
		Response: core.Response{PromptTokenIDs: []int{5, 6}, Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "4"},
			Tokens: []core.TokenLogprob{{Token: "4", ID: 19, Logprob: -0.01}}, Fidelity: core.FidelityExact}}}}
	out, err := s.NewPass().Step(&Table{}, in, &StepOptions{Key: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Response.PromptTokenIDs) != 2 || out.Response.Choices[0].Fidelity != core.FidelityExact || len(out.Response.Choices[0].Tokens) != 1 {
		t.Errorf("%+v", out.Response)
	}
}

// TestJSONStaysValid: a replacement that would break the JSON falls back
// to scrubbing each string alone.
func TestJSONStaysValid(t *testing.T) {
	s, _ := New(Options{})
	p := s.NewPass()
	for _, in := range []string{
		`{"cmd":"export TOKEN=abc\"def123456789X && run","to":"a@b.org"}`,
		`{"k":"password=p\\\"q r","email":"x@example.com"}`,
		`["10.0.0.7", "+44 20 7946 0958", {"n": 1}]`,
	} {
		changed := false
		out := p.jsonText(&Table{}, in, &changed)
		if !json.Valid([]byte(out)) {
			t.Errorf("%s → invalid JSON %s", in, out)
		}
		if !changed || out == in {
			t.Errorf("%s: nothing scrubbed", in)
		}
	}
}
