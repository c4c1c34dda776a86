package serve

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
)

// scripted is a fake engine that "generates" a fixed token sequence, so
// tests can force outputs a random model would never produce.
type scripted struct {
	info engine.ModelInfo
	out  []int

	mu      sync.Mutex
	prompts [][]int
}

func (f *scripted) Info() engine.ModelInfo { return f.info }
func (f *scripted) Logprobs(ctx context.Context, seqs [][]int, base bool) ([][]float32, error) {
	return nil, errors.New("scripted: no logprobs")
}
func (f *scripted) TrainStep(context.Context, []engine.TrainSample, engine.Recipe) (engine.StepStats, error) {
	return engine.StepStats{}, errors.New("scripted: no training")
}
func (f *scripted) Generate(ctx context.Context, prompt []int, o engine.GenOptions) ([]int, []float32, error) {
	f.mu.Lock()
	f.prompts = append(f.prompts, slices.Clone(prompt))
	f.mu.Unlock()
	var toks []int
	var lps []float32
	for i, id := range f.out {
		if len(toks) == o.MaxTokens {
			break
		}
		lp := -0.5 - float32(i)/100
		toks, lps = append(toks, id), append(lps, lp)
		if o.OnToken != nil {
			if err := o.OnToken(id, lp); err != nil {
				return toks, lps, err
			}
		}
		if slices.Contains(o.Stop, id) {
			break
		}
	}
	return toks, lps, nil
}
func (f *scripted) ExportAdapter(context.Context, string) error { return nil }
func (f *scripted) LoadAdapter(context.Context, string) error   { return nil }
func (f *scripted) ResetAdapter() error                         { return nil }
func (f *scripted) Close() error                                { return nil }

func newScripted(t *testing.T, text string) (*scripted, Tokenizer) {
	tok := testTokenizer(t)
	end, _ := tok.TokenID("<|im_end|>")
	return &scripted{
		info: engine.ModelInfo{Name: "scripted", VocabSize: tok.VocabSize(), MaxPosition: 4096},
		out:  append(tok.Encode(text), end, end, end),
	}, tok
}

func TestToolCallParsing(t *testing.T) {
	gen := "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>"
	f, tok := newScripted(t, gen)
	_, base := startServer(t, Config{Model: f, Tokenizer: tok})
	c := sdk(base)
	p := openai.ChatCompletionNewParams{
		Model:    "x",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Description: openai.String("Current weather"),
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
		})},
	}
	r, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	ch := r.Choices[0]
	if ch.FinishReason != "tool_calls" || ch.Message.Content != "Let me check." || len(ch.Message.ToolCalls) != 1 {
		t.Fatalf("finish %q content %q calls %+v", ch.FinishReason, ch.Message.Content, ch.Message.ToolCalls)
	}
	call := ch.Message.ToolCalls[0]
	if call.Function.Name != "get_weather" || call.Function.Arguments != `{"city": "Paris", "unit": "c"}` || !strings.HasPrefix(call.ID, "call_") || call.Type != "function" {
		t.Errorf("tool call %+v", call)
	}
	if rc := ch.Message.JSON.ExtraFields["reasoning_content"].Raw(); rc != `"The user wants weather."` {
		t.Errorf("reasoning_content %s", rc)
	}
	// The tools were rendered into the prompt.
	prompt := tok.Decode(f.prompts[0])
	if !strings.Contains(prompt, "<tools>") || !strings.Contains(prompt, `"name": "get_weather"`) {
		t.Errorf("prompt lacks the tools block:\n%s", prompt)
	}

	// Streaming, put together by the SDK's accumulator.
	st := c.Chat.Completions.NewStreaming(context.Background(), p)
	var acc openai.ChatCompletionAccumulator
	var reasoning strings.Builder
	finished := 0
	for st.Next() {
		ck := st.Current()
		acc.AddChunk(ck)
		if _, ok := acc.JustFinishedToolCall(); ok {
			finished++
		}
		for _, cc := range ck.Choices {
			if raw := cc.Delta.JSON.ExtraFields["reasoning_content"].Raw(); raw != "" {
				var s string
				json.Unmarshal([]byte(raw), &s)
				reasoning.WriteString(s)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	sc := acc.Choices[0]
	if sc.FinishReason != "tool_calls" || sc.Message.Content != "Let me check." || len(sc.Message.ToolCalls) != 1 ||
		sc.Message.ToolCalls[0].Function.Arguments != call.Function.Arguments || sc.Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Errorf("streamed: finish %q content %q calls %+v", sc.FinishReason, sc.Message.Content, sc.Message.ToolCalls)
	}
	if reasoning.String() != "The user wants weather." {
		t.Errorf("streamed reasoning %q", reasoning.String())
	}
	if finished != 1 {
		t.Errorf("accumulator saw %d finished tool calls", finished)
	}

	// tool_choice "none" leaves the tools out and the tags in the text.
	p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	r, err = c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if r.Choices[0].FinishReason != "stop" || !strings.Contains(r.Choices[0].Message.Content, "<tool_call>") {
		t.Errorf("tool_choice none: %q %q", r.Choices[0].FinishReason, r.Choices[0].Message.Content)
	}
}

// post sends a raw body and decodes the JSON answer.
func post(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("status %d, body %q is not JSON", resp.StatusCode, b)
	}
	return resp.StatusCode, v
}

func TestErrors(t *testing.T) {
	e, tok := newTinyEngine(t, 7)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok, MaxBodyBytes: 64 << 10})
	url := base + "/v1/chat/completions"
	long := strings.Repeat("zq ", 2100) // over the tiny model's 2048 positions
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"bad json", `{"messages": [`, 400, ""},
		{"no messages", `{"model":"m","messages":[]}`, 400, ""},
		{"bad role", `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, ""},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, ""},
		{"temperature", `{"messages":[{"role":"user","content":"hi"}],"temperature":3}`, 400, ""},
		{"n", `{"messages":[{"role":"user","content":"hi"}],"n":0}`, 400, ""},
		{"max tokens", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, 400, ""},
		{"stop type", `{"messages":[{"role":"user","content":"hi"}],"stop":5}`, 400, ""},
		{"context", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "context_length_exceeded"},
		{"too large", `{"messages":[{"role":"user","content":"` + strings.Repeat("a", 70<<10) + `"}]}`, 413, ""},
	} {
		status, v := post(t, url, tc.body)
		ev, _ := v["error"].(map[string]any)
		if status != tc.status || ev == nil || ev["message"] == "" {
			t.Errorf("%s: status %d body %v, want %d with an error", tc.name, status, v, tc.status)
			continue
		}
		if tc.code != "" && ev["code"] != tc.code {
			t.Errorf("%s: code %v, want %s", tc.name, ev["code"], tc.code)
		}
	}
	// The SDK sees an API error with the status.
	c := sdk(base)
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, Temperature: openai.Float(-1)})
	if apiStatus(err) != 400 {
		t.Errorf("SDK error %v, want a 400", err)
	}
	resp, err := http.Get(base + "/v1/nowhere")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown route: %d", resp.StatusCode)
	}
	resp, err = http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET completions: %d", resp.StatusCode)
	}
}

func TestBearerToken(t *testing.T) {
	e, tok := newTinyEngine(t, 8)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok, Token: "s3cret"})
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("no token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", base+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("with token: %d", resp.StatusCode)
	}
}

func TestDecodeRequest(t *testing.T) {
	r, err := decodeRequest([]byte(`{"model":"m","messages":[
		{"role":"developer","content":[{"type":"text","text":"be "},{"type":"text","text":"kind"}]},
		{"role":"user","content":"hi"},
		{"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"42"}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
		"max_tokens":5,"max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"seed":-1,"stop":"END",
		"n":2,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"return_token_ids":true}`))
	if err != nil {
		t.Fatal(err)
	}
	m := r.Messages
	switch {
	case m[0].Role != "system" || m[0].Content != "be kind":
		t.Errorf("system %+v", m[0])
	case m[2].Reasoning != "think" || len(m[2].ToolCalls) != 1 || m[2].ToolCalls[0].Arguments != `{"a":1}`:
		t.Errorf("assistant %+v", m[2])
	case m[3].ToolCallID != "c1" || m[3].Content != "42":
		t.Errorf("tool %+v", m[3])
	case len(r.Tools) != 1 || string(r.Tools[0].Parameters) != `{"type":"object"}`:
		t.Errorf("tools %+v", r.Tools)
	case r.MaxTokens != 7 || r.Temperature != 0.5 || r.TopP != 0.9 || r.Seed == nil || *r.Seed != 1<<64-1:
		t.Errorf("params %+v", r)
	case !slices.Equal(r.Stop, []string{"END"}) || r.N != 2 || !r.Stream || !r.IncludeUsage || !r.Logprobs || !r.ReturnTokenIDs:
		t.Errorf("flags %+v", r)
	}
	d, err := decodeRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`))
	if err != nil || d.N != 1 || d.Temperature != 1 || d.TopP != 1 || d.MaxTokens != 0 || d.Seed != nil {
		t.Errorf("defaults %+v, %v", d, err)
	}
}

// FuzzDecodeRequest checks the decoder never panics and that what it
// accepts is within bounds and survives rendering.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"n":2,"stop":["a","b"],"temperature":0.3}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"x":1}}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{"include_usage":true}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decodeRequest(body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		if len(r.Messages) == 0 || r.N < 1 || r.N > maxN || r.MaxTokens < 0 || r.Temperature < 0 || r.Temperature > 2 ||
			r.TopP <= 0 || r.TopP > 1 || len(r.Stop) > maxStops || (r.IncludeUsage && !r.Stream) {
			t.Fatalf("accepted out of bounds: %+v", r)
		}
		for _, m := range r.Messages {
			for _, tc := range m.ToolCalls {
				if !json.Valid([]byte(tc.Arguments)) {
					t.Fatalf("accepted invalid arguments %q", tc.Arguments)
				}
			}
		}
		// Rendering may refuse (bad tool parameters) but must not panic.
		chat.Qwen3().Render(r.Messages, r.Tools, true)
	})
}
