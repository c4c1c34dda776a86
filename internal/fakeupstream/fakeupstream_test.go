package fakeupstream

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	aopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

var toolTurn = Turn{Text: "Let me look.", ToolCalls: []ToolCall{
	{Name: "read", Arguments: `{"path":"/etc/hosts"}`},
	{Name: "exec", Arguments: `{"command":"echo hi"}`},
}}

func TestSplitText(t *testing.T) {
	for _, tc := range []struct {
		s string
		n int
	}{{"", 3}, {"a", 3}, {"hello world", 3}, {"héllo", 2}, {"abc", 1}, {"abcdef", 0}} {
		got := SplitText(tc.s, tc.n)
		if strings.Join(got, "") != tc.s {
			t.Errorf("SplitText(%q,%d) = %q does not rejoin", tc.s, tc.n, got)
		}
		for _, p := range got {
			if p == "" {
				t.Errorf("SplitText(%q,%d) has an empty piece", tc.s, tc.n)
			}
		}
	}
	if got := SplitText("abcdef", 3); len(got) != 3 {
		t.Errorf("SplitText(abcdef,3) = %q, want 3 pieces", got)
	}
}

func TestChatSDK(t *testing.T) {
	s := New(Script{Turns: []Turn{toolTurn}, Chunks: 4})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}

	res, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Choices[0].Message
	if m.Content != toolTurn.Text || len(m.ToolCalls) != 2 || m.ToolCalls[1].Function.Arguments != `{"command":"echo hi"}` || res.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("non-streaming reply: %+v", m)
	}
	if res.Model != "m1" || res.Usage.PromptTokens != 10 {
		t.Errorf("model %q usage %+v", res.Model, res.Usage)
	}

	for _, ollama := range []bool{false, true} {
		so := New(Script{Turns: []Turn{toolTurn}, Chunks: 4, OllamaToolIndex: ollama})
		srvo := httptest.NewServer(so)
		defer srvo.Close()
		st := c.Chat.Completions.NewStreaming(ctx, params, option.WithBaseURL(srvo.URL+"/v1"))
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for st.Next() {
			acc.AddChunk(st.Current())
			chunks++
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		am := acc.Choices[0].Message
		if am.Content != toolTurn.Text {
			t.Errorf("ollama=%v streamed content %q", ollama, am.Content)
		}
		if !ollama && (len(am.ToolCalls) != 2 || am.ToolCalls[0].Function.Arguments != `{"path":"/etc/hosts"}`) {
			t.Errorf("streamed tool calls %+v", am.ToolCalls)
		}
		if chunks < 4 {
			t.Errorf("only %d chunks", chunks)
		}
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Path != "/v1/chat/completions" || reqs[0].Header.Get("Authorization") != "Bearer k" {
		t.Fatalf("recorded requests: %d %+v", len(reqs), reqs[0].Header)
	}
}

func TestChatExtras(t *testing.T) {
	s := New(Script{Turns: []Turn{{Text: "abcdef"}}, Chunks: 3})
	srv := httptest.NewServer(s)
	defer srv.Close()
	body := `{"model":"m","n":2,"stream":true,"logprobs":true,"return_token_ids":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`
	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var events []string
	all, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range strings.Split(strings.TrimSpace(string(all)), "\n\n") {
		events = append(events, strings.TrimPrefix(e, "data: "))
	}
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("last event %q", events[len(events)-1])
	}
	var usage struct {
		Choices []any          `json:"choices"`
		Usage   map[string]int `json:"usage"`
	}
	if err := json.Unmarshal([]byte(events[len(events)-2]), &usage); err != nil || len(usage.Choices) != 0 || usage.Usage["completion_tokens"] != 6 {
		t.Fatalf("usage chunk %q: %v", events[len(events)-2], err)
	}
	texts := map[int]string{}
	sawLogprob, sawIDs, sawPrompt := false, false, false
	for _, e := range events[:len(events)-2] {
		var ch struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				Logprobs *struct {
					Content []struct{ Token string } `json:"content"`
				} `json:"logprobs"`
				TokenIDs []int `json:"token_ids"`
			} `json:"choices"`
			PromptTokenIDs []int `json:"prompt_token_ids"`
		}
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatalf("chunk %q: %v", e, err)
		}
		sawPrompt = sawPrompt || len(ch.PromptTokenIDs) == 10
		for _, c := range ch.Choices {
			texts[c.Index] += c.Delta.Content
			if c.Logprobs != nil && len(c.Logprobs.Content) == 1 && c.Logprobs.Content[0].Token == c.Delta.Content {
				sawLogprob = true
			}
			sawIDs = sawIDs || len(c.TokenIDs) == 1
		}
	}
	if texts[0] != "abcdef" || texts[1] != "abcdef (1)" || !sawLogprob || !sawIDs || !sawPrompt {
		t.Fatalf("texts %v logprobs %v ids %v prompt ids %v", texts, sawLogprob, sawIDs, sawPrompt)
	}
}

func TestMidStreamErrorAndStatus(t *testing.T) {
	s := New(Script{Turns: []Turn{{Text: "abcdef", StreamErrorAfter: 1}, {Status: 503}}, Chunks: 3})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	st := c.Chat.Completions.NewStreaming(context.Background(), params)
	for st.Next() {
	}
	if st.Err() == nil || !strings.Contains(st.Err().Error(), "scripted mid-stream failure") {
		t.Errorf("mid-stream error not seen by the SDK: %v", st.Err())
	}
	_, err := c.Chat.Completions.New(context.Background(), params)
	var apiErr *openai.Error
	if err == nil || !asError(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Errorf("want 503, got %v", err)
	}
}

func asError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

func TestMessagesSDK(t *testing.T) {
	s := New(Script{Turns: []Turn{{Text: "Sure.", Reasoning: "think", ToolCalls: []ToolCall{{Name: "exec", Arguments: `{"command":"ls"}`}}}}})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := anthropic.NewClient(aopt.WithBaseURL(srv.URL), aopt.WithAPIKey("k"), aopt.WithMaxRetries(0))
	params := anthropic.MessageNewParams{Model: "claude-x", MaxTokens: 100, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	msg, err := c.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Messages.NewStreaming(context.Background(), params)
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*anthropic.Message{msg, &acc} {
		if len(m.Content) != 3 || m.Content[0].Thinking != "think" || m.Content[1].Text != "Sure." || m.Content[2].Name != "exec" ||
			string(m.Content[2].Input) != `{"command":"ls"}` || m.StopReason != "tool_use" {
			t.Errorf("message %+v", m.Content)
		}
	}
}

func TestResponsesSDK(t *testing.T) {
	s := New(Script{Turns: []Turn{{Text: "Hello there.", ToolCalls: []ToolCall{{Name: "exec", Arguments: `{"command":"ls"}`}}}}})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
	r, err := c.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() != "Hello there." || len(r.Output) != 2 || r.Output[1].Arguments.OfString != `{"command":"ls"}` {
		t.Fatalf("response %+v", r.Output)
	}
	st := c.Responses.NewStreaming(context.Background(), params)
	var text string
	var done *responses.Response
	for st.Next() {
		ev := st.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			resp := ev.Response
			done = &resp
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if text != "Hello there." || done == nil || done.OutputText() != "Hello there." {
		t.Fatalf("streamed %q completed %v", text, done != nil)
	}
}

func TestModelsAndNotFound(t *testing.T) {
	s := New(Script{Model: "tiny"})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	page, err := c.Models.List(context.Background())
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "tiny" {
		t.Fatalf("models %+v %v", page, err)
	}
	resp, err := srv.Client().Get(srv.URL + "/v1/nothing")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

// TestResponsesLogprobs: asked for with include, the output_text log-probs
// come one per streamed piece, in the whole response and in every delta;
// unasked they are [] as OpenAI writes them, or null as vLLM does.
func TestResponsesLogprobs(t *testing.T) {
	for _, vllm := range []bool{false, true} {
		s := New(Script{Chunks: 2, VLLM: vllm, Turns: []Turn{{Text: "abcd"}}})
		srv := httptest.NewServer(s)
		c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
		params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
		r, err := c.Responses.New(context.Background(), params)
		if err != nil {
			t.Fatal(err)
		}
		unasked := map[bool]string{false: `"logprobs":[]`, true: `"logprobs":null`}[vllm]
		if !strings.Contains(r.RawJSON(), unasked) {
			t.Errorf("vllm=%v: unasked %s", vllm, r.RawJSON())
		}
		params.Include = []responses.ResponseIncludable{responses.ResponseIncludableMessageOutputTextLogprobs}
		r, err = c.Responses.New(context.Background(), params)
		if err != nil {
			t.Fatal(err)
		}
		if lps := r.Output[0].Content[0].Logprobs; len(lps) != 2 || lps[0].Token != "ab" || lps[1].Token != "cd" || lps[1].Logprob >= lps[0].Logprob || len(lps[1].Bytes) != 2 {
			t.Errorf("vllm=%v: log-probs %+v", vllm, lps)
		}
		st := c.Responses.NewStreaming(context.Background(), params)
		var pieces []string
		for st.Next() {
			if ev := st.Current(); ev.Type == "response.output_text.delta" {
				if d := ev.AsResponseOutputTextDelta(); len(d.Logprobs) == 1 && d.Logprobs[0].Token == d.Delta {
					pieces = append(pieces, d.Delta)
				}
			}
		}
		if err := st.Err(); err != nil || strings.Join(pieces, "|") != "ab|cd" {
			t.Errorf("vllm=%v: deltas with log-probs %q (%v)", vllm, pieces, err)
		}
		srv.Close()
	}
}
