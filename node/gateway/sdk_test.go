package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	aopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

var agentScript = fakeupstream.Script{Chunks: 4, Turns: []fakeupstream.Turn{
	{Text: "Let me check.", ToolCalls: []fakeupstream.ToolCall{
		{Name: "exec", Arguments: `{"command":"ls"}`},
		{Name: "read", Arguments: `{"path":"notes.txt"}`},
	}},
	{Text: "You have two files."},
	{Text: "You are welcome."},
}}

func openaiClient(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
}

// chatStream runs one streaming chat call and returns the accumulated
// completion and every chunk's raw JSON.
func chatStream(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams) (openai.ChatCompletion, []string) {
	t.Helper()
	st := c.Chat.Completions.NewStreaming(context.Background(), p)
	var acc openai.ChatCompletionAccumulator
	var raws []string
	for st.Next() {
		ch := st.Current()
		acc.AddChunk(ch)
		raws = append(raws, ch.RawJSON())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return acc.ChatCompletion, raws
}

// TestChatChainStreaming drives a tool-using conversation through the
// gateway with the OpenAI SDK, streaming, and checks the SDK saw exactly
// what it sees directly, and that the pool holds a chain whose next states
// are the tool results and then the user's reply.
func TestChatChainStreaming(t *testing.T) {
	e := newEnv(t, agentScript, nil)
	gw, direct := openaiClient(e.url), openaiClient(e.directURL)

	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are helpful."), openai.UserMessage("What files do I have?")}
	tools := []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "exec"})}
	var got []openai.ChatCompletion
	for turn := 0; turn < 3; turn++ {
		p := openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs, Tools: tools}
		viaGW, rawGW := chatStream(t, gw, p)
		_, rawDirect := chatStream(t, direct, p)
		if len(rawGW) != len(rawDirect) {
			t.Fatalf("turn %d: %d chunks through the gateway, %d direct", turn, len(rawGW), len(rawDirect))
		}
		for i := range rawGW {
			if rawGW[i] != rawDirect[i] {
				t.Fatalf("turn %d chunk %d differs:\n gw     %s\n direct %s", turn, i, rawGW[i], rawDirect[i])
			}
		}
		got = append(got, viaGW)
		m := viaGW.Choices[0].Message
		msgs = append(msgs, m.ToParam())
		switch turn {
		case 0:
			if len(m.ToolCalls) != 2 {
				t.Fatalf("tool calls %+v", m.ToolCalls)
			}
			msgs = append(msgs, openai.ToolMessage("a.txt b.txt", m.ToolCalls[0].ID), openai.ToolMessage("hello", m.ToolCalls[1].ID))
		case 1:
			msgs = append(msgs, openai.UserMessage("Thanks!"))
		}
	}

	steps := e.mem.all(t)
	if len(steps) != 3 {
		t.Fatalf("%d steps recorded, want 3", len(steps))
	}
	s0, s1, s2 := steps[0], steps[1], steps[2]
	for i, s := range steps {
		if s.API != core.APIChat || s.Source != "gateway" || s.Adapter != "v7" || s.Turn != core.TurnMain || s.Upstream != e.upURL+"/v1" {
			t.Errorf("step %d: api %q source %q adapter %q turn %q upstream %q", i, s.API, s.Source, s.Adapter, s.Turn, s.Upstream)
		}
		if s.SessionID != s0.SessionID || s.ChainID != s0.ChainID {
			t.Errorf("step %d: session/chain %s/%s, want %s/%s", i, s.SessionID, s.ChainID, s0.SessionID, s0.ChainID)
		}
		if s.Timings.Start.IsZero() || s.Timings.Total <= 0 || s.Timings.TTFT <= 0 || s.Timings.TTFT > s.Timings.Total {
			t.Errorf("step %d timings %+v", i, s.Timings)
		}
		if err := s.Validate(); err != nil {
			t.Errorf("step %d: %v", i, err)
		}
	}
	if s1.ParentID != s0.ID || s2.ParentID != s1.ID {
		t.Errorf("parents: %q %q, want %q %q", s1.ParentID, s2.ParentID, s0.ID, s1.ID)
	}
	if a := s0.Action(); a.Content != "Let me check." || len(a.ToolCalls) != 2 || a.ToolCalls[1].Arguments != `{"path":"notes.txt"}` {
		t.Errorf("step 0 action %+v", a)
	}
	if len(s0.Request.Messages) != 2 || s0.Request.Messages[1].Content != "What files do I have?" {
		t.Errorf("step 0 request %+v", s0.Request.Messages)
	}
	if s0.State != core.StateClosed || s0.NextState == nil || len(s0.NextState.Messages) != 2 ||
		s0.NextState.Messages[0].Role != core.RoleTool || s0.NextState.Messages[0].Content != "a.txt b.txt" || s0.NextState.StepID != s1.ID {
		t.Errorf("step 0: state %v next state %+v", s0.State, s0.NextState)
	}
	if s1.State != core.StateClosed || s1.NextState == nil || len(s1.NextState.Messages) != 1 || s1.NextState.Messages[0].Content != "Thanks!" {
		t.Errorf("step 1: state %v next state %+v", s1.State, s1.NextState)
	}
	if s2.State != core.StateOpen || s2.NextState != nil || s2.Action().Content != "You are welcome." {
		t.Errorf("step 2: state %v next %+v action %+v", s2.State, s2.NextState, s2.Action())
	}
	if s2.Response.Usage == nil || s2.Response.Usage.PromptTokens != 10 {
		t.Errorf("usage not recorded: %+v", s2.Response.Usage)
	}
	// The gateway asked for usage; the client, which did not, got no usage
	// chunk (the chunk lists above are equal), and the upstream got the ask.
	var up struct {
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(lastRequest(t, e.up).Body, &up); err != nil || !up.StreamOptions.IncludeUsage {
		t.Errorf("upstream was not asked for usage: %s", lastRequest(t, e.up).Body)
	}
	if got[2].Choices[0].Message.Content != "You are welcome." {
		t.Errorf("final reply %q", got[2].Choices[0].Message.Content)
	}
}

// TestChatNonStreaming compares non-streaming replies byte for byte.
func TestChatNonStreaming(t *testing.T) {
	e := newEnv(t, agentScript, nil)
	p := openai.ChatCompletionNewParams{Model: "qwen3", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	gc, dc := openaiClient(e.url), openaiClient(e.directURL)
	a, err := gc.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dc.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if a.RawJSON() != b.RawJSON() {
		t.Fatalf("bodies differ:\n gw     %s\n direct %s", a.RawJSON(), b.RawJSON())
	}
	s := e.mem.all(t)[0]
	if s.Response.Status != 200 || s.Model != "qwen3" || len(s.Action().ToolCalls) != 2 || s.Response.Usage == nil {
		t.Errorf("recorded %+v", s.Response)
	}
}

// TestLogprobsAddedAndStripped: with an upstream that can give logprobs and
// token ids, the gateway asks for them, records them, and the client that
// did not ask gets the very bytes it would get directly.
func TestLogprobsAddedAndStripped(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Chunks: 3, VLLM: true, Turns: []fakeupstream.Turn{{Text: "one two three"}}},
		func(c *Config) { c.Caps = wireCaps(true, true) })
	for _, stream := range []bool{false, true} {
		body := `{"model":"m","stream":` + map[bool]string{false: "false", true: "true"}[stream] + `,"messages":[{"role":"user","content":"count"}]}`
		st, _, viaGW := post(t, e.url+"/v1/chat/completions", body, nil)
		_, _, direct := post(t, e.directURL+"/v1/chat/completions", body, nil)
		if st != 200 || !bytes.Equal(viaGW, direct) {
			t.Fatalf("stream=%v: status %d, bodies differ:\n gw     %s\n direct %s", stream, st, viaGW, direct)
		}
		var up map[string]any
		if err := json.Unmarshal(lastRequest(t, e.up).Body, &up); err != nil {
			t.Fatal(err)
		}
		if up["logprobs"] != true || up["return_token_ids"] != true {
			t.Errorf("stream=%v: upstream body lacks logprobs/token ids: %s", stream, lastRequest(t, e.up).Body)
		}
		steps := e.mem.all(t)
		s := steps[len(steps)-1]
		c := s.Response.Choices[0]
		if len(c.Tokens) != 3 || c.Tokens[0].Logprob >= 0 || c.Tokens[0].ID != 1000 || c.Fidelity != core.FidelityExact {
			t.Errorf("stream=%v: tokens %+v fidelity %q", stream, c.Tokens, c.Fidelity)
		}
	}
	// A client that asks for logprobs gets them.
	_, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","logprobs":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	if !bytes.Contains(b, []byte(`"logprobs":{"content"`)) || bytes.Contains(b, []byte(`"token_ids":[`)) {
		t.Errorf("client asked for logprobs only, got %s", b)
	}
}

// TestOllamaParallelToolCalls: parallel calls all at index 0 are recorded as
// separate calls.
func TestOllamaParallelToolCalls(t *testing.T) {
	sc := agentScript
	sc.OllamaToolIndex = true
	e := newEnv(t, sc, nil)
	p := openai.ChatCompletionNewParams{Model: "qwen3", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go")}}
	_, rawGW := chatStream(t, openaiClient(e.url), p)
	_, rawDirect := chatStream(t, openaiClient(e.directURL), p)
	if len(rawGW) != len(rawDirect) {
		t.Fatalf("%d vs %d chunks", len(rawGW), len(rawDirect))
	}
	a := e.mem.all(t)[0].Action()
	if len(a.ToolCalls) != 2 || a.ToolCalls[0].Name != "exec" || a.ToolCalls[1].Name != "read" || a.ToolCalls[1].Arguments != `{"path":"notes.txt"}` {
		t.Errorf("recorded tool calls %+v", a.ToolCalls)
	}
}

func TestResponsesSDK(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "Hi there.", ToolCalls: []fakeupstream.ToolCall{{Name: "exec", Arguments: `{"command":"date"}`}}}}}, nil)
	p := responses.ResponseNewParams{Model: "m", Instructions: openai.String("Be brief."), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}}
	gc, dc := openaiClient(e.url), openaiClient(e.directURL)
	sameResponse(t, gc, dc, p)
	evGW, _ := responsesEvents(t, gc, p)
	evDirect, _ := responsesEvents(t, dc, p)
	if len(evGW) != len(evDirect) || evGW[len(evGW)-1] != evDirect[len(evDirect)-1] {
		t.Fatalf("streams differ: %d vs %d events", len(evGW), len(evDirect))
	}
	for i, s := range e.mem.all(t) {
		a := s.Action()
		if s.API != core.APIResponses || a.Content != "Hi there." || len(a.ToolCalls) != 1 || a.ToolCalls[0].Arguments != `{"command":"date"}` {
			t.Errorf("step %d: api %q action %+v", i, s.API, a)
		}
		if len(s.Request.Messages) != 2 || s.Request.Messages[0].Role != core.RoleSystem || s.Request.Messages[1].Content != "hello" {
			t.Errorf("step %d request %+v", i, s.Request.Messages)
		}
	}
}

func TestAnthropicSDK(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "Sure thing.", Reasoning: "hmm",
		ToolCalls: []fakeupstream.ToolCall{{ID: "toolu_1", Name: "exec", Arguments: `{"command":"ls"}`}}}}}, nil)
	client := func(base string) anthropic.Client {
		return anthropic.NewClient(aopt.WithBaseURL(base), aopt.WithAPIKey("sk-ant"), aopt.WithMaxRetries(0))
	}
	p := anthropic.MessageNewParams{Model: "claude-x", MaxTokens: 256, System: []anthropic.TextBlockParam{{Text: "Be nice."}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("list files"))}}
	gc, dc := client(e.url), client(e.directURL)
	m1, err := gc.Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := dc.Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if m1.RawJSON() != m2.RawJSON() {
		t.Fatalf("bodies differ:\n%s\n%s", m1.RawJSON(), m2.RawJSON())
	}
	var accs [2]anthropic.Message
	var raws [2][]string
	for i, base := range []string{e.url, e.directURL} {
		cl := client(base)
		st := cl.Messages.NewStreaming(context.Background(), p)
		for st.Next() {
			ev := st.Current()
			raws[i] = append(raws[i], ev.RawJSON())
			if err := accs[i].Accumulate(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if len(raws[0]) != len(raws[1]) || accs[0].RawJSON() != accs[1].RawJSON() {
		t.Fatalf("streams differ: %d vs %d events", len(raws[0]), len(raws[1]))
	}
	for i := range raws[0] {
		if raws[0][i] != raws[1][i] {
			t.Fatalf("event %d differs:\n%s\n%s", i, raws[0][i], raws[1][i])
		}
	}
	// x-api-key went upstream untouched (no gateway token configured).
	if k := lastRequest(t, e.up).Header.Get("X-Api-Key"); k != "sk-ant" {
		t.Errorf("upstream x-api-key %q", k)
	}
	for i, s := range e.mem.all(t) {
		a := s.Action()
		if s.API != core.APIMessages || a.Content != "Sure thing." || a.Reasoning != "hmm" || len(a.ToolCalls) != 1 ||
			a.ToolCalls[0].ID != "toolu_1" || a.ToolCalls[0].Arguments != `{"command":"ls"}` {
			t.Errorf("step %d: action %+v", i, a)
		}
		if len(s.Request.Messages) != 2 || s.Request.Messages[0].Role != core.RoleSystem {
			t.Errorf("step %d request %+v", i, s.Request.Messages)
		}
	}
}

// TestChatNChoices: n > 1, streaming (choices interleaved) and not, reaches
// the client as it would directly, and every choice is recorded.
func TestChatNChoices(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Chunks: 3, Turns: []fakeupstream.Turn{{Text: "alpha beta gamma"}, {Text: "alpha beta gamma"}}}, nil)
	for i, stream := range []string{"true", "false"} {
		body := `{"model":"m","n":2,"stream":` + stream + `,"messages":[{"role":"user","content":"q` + stream + `"}]}`
		st, _, viaGW := post(t, e.url+"/v1/chat/completions", body, nil)
		_, _, direct := post(t, e.directURL+"/v1/chat/completions", body, nil)
		if st != 200 || !bytes.Equal(viaGW, direct) {
			t.Fatalf("stream=%s: status %d, bodies differ:\n gw     %s\n direct %s", stream, st, viaGW, direct)
		}
		s := e.mem.all(t)[i]
		if len(s.Response.Choices) != 2 || s.Response.Choices[0].Message.Content != "alpha beta gamma" || s.Response.Choices[1].Message.Content != "alpha beta gamma (1)" {
			t.Errorf("stream=%s: recorded choices %+v", stream, s.Response.Choices)
		}
	}
}

// TestResponsesPreviousResponseID continues a Responses conversation the
// way the SDK does with server-side state: the second call names the first
// response and sends only the user's next message. The gateway records the
// second step with the whole context, in the same chain, and the user's
// message becomes the first step's next state.
func TestResponsesPreviousResponseID(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Text: "Hi there.", ToolCalls: []fakeupstream.ToolCall{{Name: "exec", Arguments: `{"command":"date"}`}}},
		{Text: "You are welcome."},
	}}, nil)
	gc := openaiClient(e.url)
	r1, err := gc.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m",
		Instructions: openai.String("Be brief."), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m",
		Instructions: openai.String("Be brief."), PreviousResponseID: openai.String(r1.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("thanks")}}); err != nil {
		t.Fatal(err)
	}
	steps := e.mem.all(t)
	if len(steps) != 2 {
		t.Fatalf("%d steps", len(steps))
	}
	first, second := steps[0], steps[1]
	var roles []string
	for _, m := range second.Request.Messages {
		roles = append(roles, m.Role+":"+m.Content)
	}
	want := []string{"system:Be brief.", "user:hello", "assistant:Hi there.", "user:thanks"}
	if strings.Join(roles, "|") != strings.Join(want, "|") {
		t.Fatalf("second step's context %q, want %q", roles, want)
	}
	if tc := second.Request.Messages[2].ToolCalls; len(tc) != 1 || tc[0].Name != "exec" {
		t.Errorf("the first reply's tool call is not in the context: %+v", second.Request.Messages[2])
	}
	if second.SessionID != first.SessionID || second.ChainID != first.ChainID || second.ParentID != first.ID {
		t.Errorf("second step: session %s chain %s parent %s; first: session %s chain %s id %s",
			second.SessionID, second.ChainID, second.ParentID, first.SessionID, first.ChainID, first.ID)
	}
	if ns := first.NextState; ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Content != "thanks" || ns.StepID != second.ID {
		t.Errorf("first step's next state %+v", first.NextState)
	}

	// A previous_response_id the gateway never saw: the call is recorded
	// with what it sent, as a new chain.
	if _, err := gc.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m",
		PreviousResponseID: openai.String("resp_unknown"),
		Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("again")}}); err != nil {
		t.Fatal(err)
	}
	steps = e.mem.all(t)
	if third := steps[2]; len(third.Request.Messages) != 1 || third.Request.Messages[0].Content != "again" || third.ChainID == first.ChainID {
		t.Errorf("unknown previous response: context %+v chain %s", third.Request.Messages, third.ChainID)
	}
}

// responsesEvents runs one streaming Responses call and returns every
// event's raw JSON and the completed response.
func responsesEvents(t *testing.T, c openai.Client, p responses.ResponseNewParams) ([]string, *responses.Response) {
	t.Helper()
	st := c.Responses.NewStreaming(context.Background(), p)
	var raws []string
	var done *responses.Response
	for st.Next() {
		ev := st.Current()
		raws = append(raws, ev.RawJSON())
		if ev.Type == "response.completed" {
			r := ev.Response
			done = &r
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return raws, done
}

// sameResponse makes one Responses call through the gateway (gc) and one
// directly (dc), requires the very same bytes, and returns the gateway's.
func sameResponse(t *testing.T, gc, dc openai.Client, p responses.ResponseNewParams) *responses.Response {
	t.Helper()
	r1, err := gc.Responses.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := dc.Responses.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if r1.RawJSON() != r2.RawJSON() {
		t.Fatalf("bodies differ:\n gw     %s\n direct %s", r1.RawJSON(), r2.RawJSON())
	}
	return r1
}

// TestResponsesLogprobs: with an upstream that can give log-probs, the
// gateway asks a Responses call for them (include), records them, and the
// client that did not ask gets the very bytes it would get directly, whole
// or streamed, from an upstream that writes unasked log-probs as OpenAI
// does ([]) or as vLLM does (null); a client that asks gets them.
func TestResponsesLogprobs(t *testing.T) {
	words := []string{"one ", "two ", "three"} // the fake's three pieces of the text
	for _, vllm := range []bool{false, true} {
		t.Run(map[bool]string{false: "openai", true: "vllm"}[vllm], func(t *testing.T) {
			e := newEnv(t, fakeupstream.Script{Chunks: 3, VLLM: vllm, Turns: []fakeupstream.Turn{{Text: "one two three"}}},
				func(c *Config) { c.Caps = wireCaps(true, vllm) })
			gc, dc := openaiClient(e.url), openaiClient(e.directURL)
			p := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("count")}}
			checkStep := func(what string) {
				t.Helper()
				var up struct {
					Include []string `json:"include"`
				}
				if err := json.Unmarshal(lastRequest(t, e.up).Body, &up); err != nil || len(up.Include) != 1 || up.Include[0] != "message.output_text.logprobs" {
					t.Errorf("%s: upstream was not asked for log-probs: %s", what, lastRequest(t, e.up).Body)
				}
				steps := e.mem.all(t)
				c := steps[len(steps)-1].Response.Choices[0]
				if c.Fidelity != core.FidelityLogprob || len(c.Tokens) != len(words) {
					t.Fatalf("%s: tokens %+v fidelity %q", what, c.Tokens, c.Fidelity)
				}
				for i, tok := range c.Tokens {
					if tok.Token != words[i] || tok.ID != -1 || tok.Logprob != -0.125*float64(i+1) {
						t.Errorf("%s: token %d = %+v", what, i, tok)
					}
				}
			}

			// Not asked: the gateway's bytes are the direct ones.
			r1 := sameResponse(t, gc, dc, p)
			if strings.Contains(r1.RawJSON(), `"logprob":`) {
				t.Fatalf("log-probs reached the client: %s", r1.RawJSON())
			}
			checkStep("whole")
			evGW, _ := responsesEvents(t, gc, p)
			evDirect, _ := responsesEvents(t, dc, p)
			if len(evGW) != len(evDirect) {
				t.Fatalf("%d events through the gateway, %d direct", len(evGW), len(evDirect))
			}
			for i := range evGW {
				if evGW[i] != evDirect[i] {
					t.Fatalf("event %d differs:\n gw     %s\n direct %s", i, evGW[i], evDirect[i])
				}
				if strings.Contains(evGW[i], `"logprob":`) {
					t.Fatalf("log-probs reached the client: %s", evGW[i])
				}
			}
			checkStep("streamed")

			// Asked: the client gets them, as directly.
			p.Include = []responses.ResponseIncludable{responses.ResponseIncludableMessageOutputTextLogprobs}
			r3 := sameResponse(t, gc, dc, p)
			if lps := r3.Output[0].Content[0].Logprobs; len(lps) != len(words) || lps[1].Token != words[1] || lps[1].Logprob != -0.25 {
				t.Fatalf("client asked for log-probs, got %+v", lps)
			}
			checkStep("whole, asked")
			evGW, done := responsesEvents(t, gc, p)
			evDirect, _ = responsesEvents(t, dc, p)
			if strings.Join(evGW, "\n") != strings.Join(evDirect, "\n") || done == nil || len(done.Output[0].Content[0].Logprobs) != len(words) {
				t.Fatalf("streams differ, or no log-probs in the completed response:\n%s", strings.Join(evGW, "\n"))
			}
			checkStep("streamed, asked")
		})
	}
}

// TestResponsesLogprobsRefused: an upstream that refuses the log-probs the
// gateway asks for (vLLM does, for gpt-oss models) is sent the call again
// as the client sent it; the client gets what it would get directly, and
// the step is recorded without log-probs. A client that asked for them
// itself gets the refusal.
func TestResponsesLogprobsRefused(t *testing.T) {
	const refusal = `{"error":{"message":"logprobs are not supported with gpt-oss models","type":"invalid_request_error","param":"logprobs","code":400}}`
	script := fakeupstream.Script{VLLM: true, Respond: func(n int, r fakeupstream.Request) fakeupstream.Turn {
		if bytes.Contains(r.Body, []byte("message.output_text.logprobs")) {
			return fakeupstream.Turn{Status: 400, ErrorBody: refusal}
		}
		return fakeupstream.Turn{Text: "Hi there."}
	}}
	e := newEnv(t, script, func(c *Config) { c.Caps = wireCaps(true, true) })
	for _, stream := range []string{"false", "true"} {
		body := `{"model":"gpt-oss","stream":` + stream + `,"input":"hi"}`
		asked := `{"model":"gpt-oss","stream":` + stream + `,"input":"hi","include":["message.output_text.logprobs"]}`
		before := len(e.up.Requests())
		st, _, viaGW := post(t, e.url+"/v1/responses", body, nil)
		// The direct twin counts the refused call too, so that ids match.
		if st, _, b := post(t, e.directURL+"/v1/responses", asked, nil); st != 400 || string(b) != refusal {
			t.Fatalf("direct refusal: %d %s", st, b)
		}
		_, _, direct := post(t, e.directURL+"/v1/responses", body, nil)
		if st != 200 || !bytes.Equal(viaGW, direct) {
			t.Fatalf("stream=%s: status %d, bodies differ:\n gw     %s\n direct %s", stream, st, viaGW, direct)
		}
		reqs := e.up.Requests()[before:]
		if len(reqs) != 2 || !bytes.Contains(reqs[0].Body, []byte(`"include":["message.output_text.logprobs"]`)) || string(reqs[1].Body) != body {
			t.Fatalf("stream=%s: upstream got %d requests, the last %s", stream, len(reqs), reqs[len(reqs)-1].Body)
		}
		steps := e.mem.all(t)
		s := steps[len(steps)-1]
		if c := s.Response.Choices; s.Response.Status != 200 || s.Response.Error != nil || len(c) != 1 || c[0].Message.Content != "Hi there." ||
			c[0].Tokens != nil || c[0].Fidelity != core.FidelityNone {
			t.Errorf("stream=%s: recorded %+v", stream, s.Response)
		}
	}
	before := len(e.up.Requests())
	st, _, b := post(t, e.url+"/v1/responses", `{"model":"gpt-oss","input":"hi","include":["message.output_text.logprobs"]}`, nil)
	if st != 400 || string(b) != refusal || len(e.up.Requests()) != before+1 {
		t.Errorf("client that asked: %d %s, %d upstream requests", st, b, len(e.up.Requests())-before)
	}
}
