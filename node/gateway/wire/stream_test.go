package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/sse"
)

// run feeds an upstream SSE stream through a Stream as the gateway does and
// returns what the client receives. It reads to the end of the input (not
// stopping at Done) and reports how many events were forwarded unchanged
// without a copy.
func run(t *testing.T, req *Request, caps Caps, upstream string) (client string, st *Stream, zeroCopy int) {
	t.Helper()
	rd := sse.NewReader(strings.NewReader(upstream), 0)
	st = NewStream(req, caps)
	var out bytes.Buffer
	for i := 0; i < 10000; i++ {
		ev, err := rd.Next()
		if err == io.EOF {
			return out.String(), st, zeroCopy
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := st.Event(ev)
		if err != nil {
			t.Fatalf("Event(%q): %v", ev.Raw, err)
		}
		if len(b) > 0 && &b[0] == &ev.Raw[0] && len(b) == len(ev.Raw) {
			zeroCopy++
		}
		out.Write(b)
	}
	t.Fatal("too many events")
	return
}

func sseOf(chunks ...string) string {
	var sb strings.Builder
	for _, c := range chunks {
		sb.WriteString("data: " + c + "\n\n")
	}
	return sb.String()
}

func chatReq(t *testing.T, extra string) *Request {
	t.Helper()
	return mustParse(t, core.APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true`+extra+`}`)
}

func TestStreamChatBasic(t *testing.T) {
	up := ": keep-alive\n\n" + sseOf(
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"reasoning_content":"Think "},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"reasoning":"more."},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"content":", world"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`[DONE]`)
	req := chatReq(t, `,"stream_options":{"include_usage":false}`)
	req.IncludeUsage = true // as if the upstream sends no usage: nothing added
	client, st, zc := run(t, req, Caps{}, up)
	if client != up || zc != 8 {
		t.Fatalf("client saw a different stream (%d zero-copy):\n%s", zc, client)
	}
	if !st.Done() {
		t.Fatal("not done after [DONE]")
	}
	r := st.Response()
	want := []core.Choice{{Index: 0, FinishReason: "stop", Message: core.Message{Role: "assistant", Content: "Hello, world", Reasoning: "Think more."}}}
	if r.ID != "chatcmpl-1" || r.Model != "qwen3" || !reflect.DeepEqual(r.Choices, want) {
		t.Fatalf("response = %s", js(r))
	}
}

func TestStreamChatInterleavedChoices(t *testing.T) {
	up := sseOf(
		`{"id":"c","choices":[{"index":1,"delta":{"role":"assistant","content":"B1"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"A1"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":" A2"},"finish_reason":null},{"index":1,"delta":{"content":" B2"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":1,"delta":{},"finish_reason":"length"}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`[DONE]`)
	_, st, _ := run(t, chatReq(t, `,"n":2,"stream_options":{"include_usage":true}`), Caps{}, up)
	r := st.Response()
	want := []core.Choice{
		{Index: 0, FinishReason: "tool_calls", Message: core.Message{Role: "assistant", Content: "A1 A2", ToolCalls: []core.ToolCall{{ID: "call_a", Type: "function", Name: "f", Arguments: "{}"}}}},
		{Index: 1, FinishReason: "length", Message: core.Message{Role: "assistant", Content: "B1 B2"}},
	}
	if !reflect.DeepEqual(r.Choices, want) {
		t.Fatalf("choices = %s", js(r.Choices))
	}
}

func TestStreamChatToolCalls(t *testing.T) {
	cases := []struct {
		name   string
		chunks []string
		want   []core.ToolCall
	}{
		{
			name: "parallel calls by index, arguments split across many deltas",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\": \"Par"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":""}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"is\"}"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"tz\":"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"CET\"}"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			},
			want: []core.ToolCall{
				{ID: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city": "Paris"}`},
				{ID: "call_2", Type: "function", Name: "get_time", Arguments: `{"tz":"CET"}`},
			},
		},
		{
			name: "Ollama: parallel calls all at index 0 with distinct ids",
			chunks: []string{
				`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_x1","index":0,"type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}}]},"finish_reason":null}]}`,
				`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_x2","index":0,"type":"function","function":{"name":"read","arguments":"{\"path\":\"b\"}"}}]},"finish_reason":null}]}`,
				`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_x3","index":0,"type":"function","function":{"name":"list","arguments":"{}"}}]},"finish_reason":null}]}`,
				`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]}`,
			},
			want: []core.ToolCall{
				{ID: "call_x1", Type: "function", Name: "read", Arguments: `{"path":"a"}`},
				{ID: "call_x2", Type: "function", Name: "read", Arguments: `{"path":"b"}`},
				{ID: "call_x3", Type: "function", Name: "list", Arguments: `{}`},
			},
		},
		{
			name: "a repeated id continues its call; object arguments kept as JSON",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"a\":"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"1}"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c2","function":{"name":"g","arguments":{"b":2}}}]}}]}`,
			},
			want: []core.ToolCall{
				{ID: "c1", Type: "function", Name: "f", Arguments: `{"a":1}`},
				{ID: "c2", Type: "function", Name: "g", Arguments: `{"b":2}`},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := sseOf(append(c.chunks, "[DONE]")...)
			client, st, _ := run(t, chatReq(t, `,"stream_options":{"include_usage":true}`), Caps{}, up)
			if client != up {
				t.Fatal("stream changed")
			}
			r := st.Response()
			if len(r.Choices) != 1 || !reflect.DeepEqual(r.Choices[0].Message.ToolCalls, c.want) {
				t.Fatalf("tool calls = %s", js(r.Choices))
			}
		})
	}
}

func TestStreamChatMidStreamError(t *testing.T) {
	up := sseOf(
		`{"id":"c","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`,
		`{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`,
	)
	// The client asked for nothing, the gateway added usage and logprobs:
	// still the error is forwarded byte for byte.
	req := chatReq(t, "")
	rd := sse.NewReader(strings.NewReader(up), 0)
	st := NewStream(req, Caps{Logprobs: true})
	var last []byte
	for !st.Done() {
		ev, err := rd.Next()
		if err != nil {
			t.Fatalf("stream ended before the error was seen: %v", err)
		}
		if last, err = st.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	if want := "data: " + `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}` + "\n\n"; string(last) != want {
		t.Fatalf("error event forwarded as %q", last)
	}
	r := st.Response()
	var e struct{ Type string }
	if json.Unmarshal(r.Error, &e) != nil || e.Type != "server_error" {
		t.Fatalf("error = %s", r.Error)
	}
	if len(r.Choices) != 1 || r.Choices[0].Message.Content != "Hel" {
		t.Fatalf("partial content lost: %s", js(r.Choices))
	}
	// vLLM's older error shape.
	_, st, _ = run(t, req, Caps{}, sseOf(`{"object":"error","message":"boom","type":"BadRequestError","code":400}`))
	if !st.Done() || !strings.Contains(string(st.Response().Error), "boom") {
		t.Fatalf("vLLM error not recorded: %s", st.Response().Error)
	}
}

// Chunk generator for fidelity tests: the same stream as an upstream would
// send it with or without what the gateway adds.
type chunkOpts struct{ usageNull, logprobs, tokenIDs bool }

func genChat(o chunkOpts, clientLogprobs bool, n int, words []string, withUsageChunk bool) string {
	var chunks []string
	for i, w := range words {
		var choices []string
		for c := 0; c < n; c++ {
			lp := "null"
			if o.logprobs || clientLogprobs {
				lp = fmt.Sprintf(`{"content":[{"token":%q,"logprob":-0.%d5,"bytes":[%d],"top_logprobs":[]}],"refusal":null}`, w, i+1, w[0])
			}
			ch := fmt.Sprintf(`{"index":%d,"delta":{"content":%q},"logprobs":%s,"finish_reason":null`, c, w, lp)
			if o.tokenIDs {
				ch += fmt.Sprintf(`,"token_ids":[%d]`, 100+i)
			}
			choices = append(choices, ch+"}")
		}
		chunk := `{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[` + strings.Join(choices, ",") + `]`
		if o.usageNull {
			chunk += `,"usage":null`
		}
		if o.tokenIDs && i == 0 {
			chunk += `,"prompt_token_ids":[1,2,3]`
		}
		chunks = append(chunks, chunk+`,"obfuscation":"xyz"}`)
	}
	var fin []string
	for c := 0; c < n; c++ {
		fin = append(fin, fmt.Sprintf(`{"index":%d,"delta":{},"logprobs":null,"finish_reason":"stop"}`, c))
	}
	last := `{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[` + strings.Join(fin, ",") + `]`
	if o.usageNull {
		last += `,"usage":null`
	}
	chunks = append(chunks, last+"}")
	if withUsageChunk {
		chunks = append(chunks, `{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}`)
	}
	return sseOf(append(chunks, "[DONE]")...)
}

// TestStreamChatClientSeesItsOwnStream checks the central promise: when the
// gateway added logprobs, token ids or usage, the client receives the very
// bytes the upstream would have sent without them, and the step still
// records what was added.
func TestStreamChatClientSeesItsOwnStream(t *testing.T) {
	words := []string{"Hi", " there", "!"}
	cases := []struct {
		name        string
		extra       string // client request fields
		caps        Caps
		upstream    chunkOpts // what the upstream sends given the patched request
		usageChunk  bool      // the upstream sends the usage-only chunk
		clientUsage bool      // the client asked for usage itself
		clientLP    bool      // the client asked for logprobs itself
		n           int
		fidelity    core.Fidelity
	}{
		{name: "usage added", upstream: chunkOpts{usageNull: true}, usageChunk: true, n: 1},
		{name: "usage asked by client", extra: `,"stream_options":{"include_usage":true}`, upstream: chunkOpts{usageNull: true}, usageChunk: true, clientUsage: true, n: 1},
		{name: "logprobs added", caps: Caps{Logprobs: true}, upstream: chunkOpts{usageNull: true, logprobs: true}, usageChunk: true, n: 1, fidelity: core.FidelityLogprob},
		{name: "logprobs asked by client", extra: `,"logprobs":true,"stream_options":{"include_usage":true}`, caps: Caps{Logprobs: true},
			upstream: chunkOpts{usageNull: true, logprobs: true}, usageChunk: true, clientUsage: true, clientLP: true, n: 1, fidelity: core.FidelityLogprob},
		{name: "vLLM everything added", caps: Caps{Logprobs: true, TokenIDs: true}, upstream: chunkOpts{logprobs: true, tokenIDs: true}, usageChunk: true, n: 1, fidelity: core.FidelityExact},
		{name: "vLLM everything added, n=2", extra: `,"n":2`, caps: Caps{Logprobs: true, TokenIDs: true}, upstream: chunkOpts{logprobs: true, tokenIDs: true}, usageChunk: true, n: 2, fidelity: core.FidelityExact},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := chatReq(t, c.extra)
			upstream := genChat(c.upstream, false, c.n, words, c.usageChunk)
			without := genChat(chunkOpts{usageNull: c.clientUsage}, c.clientLP, c.n, words, c.clientUsage)
			client, st, zc := run(t, req, c.caps, upstream)
			if client != without {
				t.Fatalf("client received\n%s\nwant\n%s", client, without)
			}
			if upstream == without && zc != strings.Count(upstream, "\n\n") {
				t.Fatalf("unchanged stream copied: %d zero-copy events", zc)
			}
			r := st.Response()
			if !st.Done() || r.Usage == nil || r.Usage.TotalTokens != 12 {
				t.Fatalf("done %v usage %+v", st.Done(), r.Usage)
			}
			if len(r.Choices) != c.n {
				t.Fatalf("%d choices", len(r.Choices))
			}
			for _, ch := range r.Choices {
				if ch.Message.Content != "Hi there!" || ch.FinishReason != "stop" || ch.Fidelity != c.fidelity {
					t.Fatalf("choice = %s", js(ch))
				}
				if c.fidelity == core.FidelityNone {
					continue
				}
				if len(ch.Tokens) != 3 || ch.Tokens[1].Token != " there" || ch.Tokens[1].Logprob != -0.25 {
					t.Fatalf("tokens = %s", js(ch.Tokens))
				}
				if c.fidelity == core.FidelityExact && (ch.Tokens[0].ID != 100 || ch.Tokens[2].ID != 102) {
					t.Fatalf("token ids = %s", js(ch.Tokens))
				}
				if c.fidelity == core.FidelityLogprob && ch.Tokens[0].ID != -1 {
					t.Fatalf("token id without ids = %d", ch.Tokens[0].ID)
				}
			}
			if c.upstream.tokenIDs && !reflect.DeepEqual(r.PromptTokenIDs, []int{1, 2, 3}) {
				t.Fatalf("prompt token ids = %v", r.PromptTokenIDs)
			}
		})
	}
}

func TestStreamChatCutOff(t *testing.T) {
	up := genChat(chunkOpts{logprobs: true, tokenIDs: true}, false, 1, []string{"a", "b"}, false)
	up = up[:strings.Index(up, `"finish_reason":"stop"`)] // cut inside the last chunk
	rd := sse.NewReader(strings.NewReader(up), 0)
	st := NewStream(chatReq(t, ""), Caps{Logprobs: true, TokenIDs: true})
	var evErr error
	for i := 0; i < 100; i++ {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		if _, err := st.Event(ev); err != nil {
			evErr = err
		}
	}
	if !errors.Is(evErr, ErrBadResponse) {
		t.Fatalf("cut chunk: err = %v", evErr)
	}
	if st.Done() {
		t.Fatal("done without a terminal event")
	}
	r := st.Response()
	if len(r.Choices) != 1 || r.Choices[0].Fidelity != core.FidelityPartial || r.Choices[0].Message.Content != "ab" || len(r.Choices[0].Tokens) != 2 {
		t.Fatalf("cut-off response = %s", js(r))
	}
}

func TestStreamMessages(t *testing.T) {
	up := `event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants "}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"the weather."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAh"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: ping
data: {"type": "ping"}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me check"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" that."}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"ncisco, CA\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: content_block_start
data: {"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_02","name":"now","input":{}}}

event: content_block_stop
data: {"type":"content_block_stop","index":3}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

`
	req := mustParse(t, core.APIMessages, `{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"weather?"}]}`)
	client, st, zc := run(t, req, Caps{Logprobs: true, TokenIDs: true}, up)
	if client != up || zc != strings.Count(up, "\n\n") {
		t.Fatalf("stream changed or copied (%d zero-copy)", zc)
	}
	if !st.Done() {
		t.Fatal("not done")
	}
	r := st.Response()
	want := core.Choice{FinishReason: "tool_calls", Message: core.Message{Role: "assistant", Content: "Let me check that.", Reasoning: "The user wants the weather.",
		ToolCalls: []core.ToolCall{
			{ID: "toolu_01", Type: "function", Name: "get_weather", Arguments: `{"location": "San Francisco, CA"}`},
			{ID: "toolu_02", Type: "function", Name: "now", Arguments: `{}`},
		}}}
	if r.ID != "msg_01" || r.Model != "claude-sonnet-4-5" || len(r.Choices) != 1 || !reflect.DeepEqual(r.Choices[0], want) {
		t.Fatalf("response = %s", js(r))
	}
	if r.Usage == nil || *r.Usage != (core.Usage{PromptTokens: 35, CompletionTokens: 89, TotalTokens: 124}) {
		t.Fatalf("usage = %+v", r.Usage)
	}
}

func TestStreamMessagesError(t *testing.T) {
	up := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"model\":\"c\",\"usage\":{\"input_tokens\":3}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Par\"}}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	req := mustParse(t, core.APIMessages, `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	client, st, _ := run(t, req, Caps{}, up)
	if client != up || !st.Done() {
		t.Fatal("error event not forwarded or not terminal")
	}
	r := st.Response()
	if string(r.Error) != `{"type":"overloaded_error","message":"Overloaded"}` || r.Choices[0].Message.Content != "Par" {
		t.Fatalf("response = %s", js(r))
	}
}

const responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-5-mini","output":[],"usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}

event: response.reasoning_summary_text.delta
data: {"type":"response.reasoning_summary_text.delta","sequence_number":2,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Need the weather."}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Need the weather."}]}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_1","output_index":1,"content_index":0,"delta":"Checking","logprobs":[]}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":6,"item_id":"msg_1","output_index":1,"content_index":0,"delta":" now.","logprobs":[]}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":7,"output_index":2,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_W","name":"get_weather"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":8,"item_id":"fc_1","output_index":2,"delta":"{\"city\":"}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":9,"item_id":"fc_1","output_index":2,"delta":"\"Paris\"}"}

`

const responsesCompleted = `event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","sequence_number":10,"item_id":"fc_1","output_index":2,"arguments":"{\"city\":\"Paris\"}"}

event: response.completed
data: {"type":"response.completed","sequence_number":11,"response":{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-5-mini-2025","output":[{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Need the weather."}]},{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Checking now."}]},{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"city\":\"Paris\"}","call_id":"call_W","name":"get_weather"}],"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":0},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":8},"total_tokens":60}}}

`

func TestStreamResponses(t *testing.T) {
	req := mustParse(t, core.APIResponses, `{"model":"gpt-5-mini","stream":true,"input":"weather in Paris?"}`)
	wantMsg := core.Message{Role: "assistant", Content: "Checking now.", Reasoning: "Need the weather.",
		ToolCalls: []core.ToolCall{{ID: "call_W", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`}}}

	t.Run("completed", func(t *testing.T) {
		up := responsesStream + responsesCompleted
		client, st, _ := run(t, req, Caps{Logprobs: true}, up)
		if client != up || !st.Done() {
			t.Fatal("stream changed or not done")
		}
		r := st.Response()
		if r.ID != "resp_1" || r.Model != "gpt-5-mini-2025" || len(r.Choices) != 1 || !reflect.DeepEqual(r.Choices[0].Message, wantMsg) || r.Choices[0].FinishReason != "tool_calls" {
			t.Fatalf("response = %s", js(r))
		}
		if r.Usage == nil || *r.Usage != (core.Usage{PromptTokens: 40, CompletionTokens: 20, TotalTokens: 60}) {
			t.Fatalf("usage = %+v", r.Usage)
		}
	})
	t.Run("deltas only, cut off", func(t *testing.T) {
		_, st, _ := run(t, req, Caps{}, responsesStream)
		if st.Done() {
			t.Fatal("done without response.completed")
		}
		r := st.Response()
		if r.ID != "resp_1" || r.Model != "gpt-5-mini" || len(r.Choices) != 1 || !reflect.DeepEqual(r.Choices[0].Message, wantMsg) || r.Choices[0].FinishReason != "" {
			t.Fatalf("response = %s", js(r))
		}
	})
	t.Run("failed", func(t *testing.T) {
		up := responsesStream + "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"output\":[]}}\n\n"
		client, st, _ := run(t, req, Caps{}, up)
		if client != up || !st.Done() {
			t.Fatal("not forwarded or not done")
		}
		r := st.Response()
		if string(r.Error) != `{"code":"server_error","message":"boom"}` || len(r.Choices) != 1 || r.Choices[0].Message.Content != "Checking now." {
			t.Fatalf("response = %s", js(r))
		}
	})
	t.Run("error event", func(t *testing.T) {
		up := responsesStream + "event: error\ndata: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null}\n\n"
		_, st, _ := run(t, req, Caps{}, up)
		if !st.Done() || !strings.Contains(string(st.Response().Error), "rate_limit_exceeded") {
			t.Fatalf("error = %s", st.Response().Error)
		}
	})
}

func FuzzStream(f *testing.F) {
	f.Add(uint8(0), uint8(7), []byte(genChat(chunkOpts{usageNull: true, logprobs: true, tokenIDs: true}, false, 2, []string{"a", "b"}, true)))
	f.Add(uint8(1), uint8(0), []byte("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{}}}\n\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}\n\n"))
	f.Add(uint8(2), uint8(0), []byte(responsesStream+responsesCompleted))
	f.Add(uint8(2), uint8(1), []byte(respGen{words: []string{"a", "b"}, logprobs: true}.String()))
	f.Add(uint8(2), uint8(3), []byte(respGen{words: []string{"a"}, logprobs: true, vllm: true, completedLps: "[{}]"}.String()))
	f.Add(uint8(0), uint8(3), []byte(sseOf(`{"choices":[{"index":5,"delta":{"tool_calls":[{"index":3,"id":"x","function":{"arguments":{"a":[1]}}}]},"logprobs":{"content":[{"token":"token_id:7","logprob":-1}]}}],"usage":null}`, `{"choices":[],"usage":{"total_tokens":1}}`, `{"error":null}`)))
	apis := []core.APIKind{core.APIChat, core.APIMessages, core.APIResponses}
	f.Fuzz(func(t *testing.T, which, flags uint8, in []byte) {
		api := apis[int(which)%len(apis)]
		req := &Request{API: api, Stream: true, N: 1, IncludeUsage: flags&4 == 0}
		caps := Caps{Logprobs: flags&1 != 0, TokenIDs: flags&2 != 0}
		st := NewStream(req, caps)
		rd := sse.NewReader(bytes.NewReader(in), 1<<16)
		for i := 0; i <= len(in); i++ {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			out, err := st.Event(ev)
			if err != nil {
				if !errors.Is(err, ErrBadResponse) {
					t.Fatalf("error not wrapping ErrBadResponse: %v", err)
				}
				if !bytes.Equal(out, ev.Raw) {
					t.Fatal("event not understood but not forwarded as is")
				}
				continue
			}
			if out == nil {
				if api != core.APIChat || !addedFor(req, caps).usage {
					t.Fatal("event dropped though nothing was added")
				}
				continue
			}
			if !bytes.Equal(out, ev.Raw) {
				// A rewritten event must still be one event whose data is JSON.
				evs := readEvents(t, out)
				if len(evs) != 1 || !json.Valid(evs[0].Data) {
					t.Fatalf("rewritten event %q is not one JSON event", out)
				}
			}
		}
		r := st.Response()
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("response does not marshal: %v", err)
		}
	})
}

func readEvents(t *testing.T, b []byte) []sse.Event {
	rd := sse.NewReader(bytes.NewReader(b), 0)
	var evs []sse.Event
	for i := 0; i <= len(b); i++ {
		ev, err := rd.Next()
		if err != nil {
			return evs
		}
		evs = append(evs, ev)
	}
	t.Fatal("too many events")
	return nil
}

// TestStreamEndWithoutDone: End completes a chat stream without [DONE] only
// when every asked-for choice has its finish reason.
func TestStreamEndWithoutDone(t *testing.T) {
	delta := func(i int, text, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":%d,"delta":{"content":%q},"finish_reason":%s}]}`, i, text, f)
	}
	for _, c := range []struct {
		name   string
		extra  string
		chunks []string
		want   bool
	}{
		{"finished", "", []string{delta(0, "a", ""), delta(0, "b", "stop")}, true},
		{"unfinished", "", []string{delta(0, "a", ""), delta(0, "b", "")}, false},
		{"nothing", "", nil, false},
		{"one of two finished", `,"n":2`, []string{delta(0, "a", "stop"), delta(1, "b", "")}, false},
		{"one of two seen", `,"n":2`, []string{delta(0, "a", "stop")}, false},
		{"both finished", `,"n":2`, []string{delta(0, "a", "stop"), delta(1, "b", "length")}, true},
	} {
		_, st, _ := run(t, chatReq(t, c.extra), Caps{}, sseOf(c.chunks...))
		if st.Done() {
			t.Fatalf("%s: Done before End with no [DONE]", c.name)
		}
		if got := st.End(); got != c.want || st.Done() != c.want {
			t.Errorf("%s: End %v, Done %v, want %v", c.name, got, st.Done(), c.want)
		}
		if r := st.Response(); c.want && len(r.Choices) > 0 && r.Choices[0].Fidelity == core.FidelityPartial {
			t.Errorf("%s: a complete stream's choices are marked partial", c.name)
		}
	}
	// Other APIs need their terminal event.
	msg := mustParse(t, core.APIMessages, `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	_, st, _ := run(t, msg, Caps{}, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"m\",\"content\":[]}}\n\n")
	if st.End() {
		t.Error("a Messages stream without message_stop ended complete")
	}
}

// respGen describes a Responses stream of one message whose text comes in
// words, as OpenAI writes it or as vLLM does (vllm), with the log-probs
// asked for (logprobs) or not. Unasked, OpenAI writes [] in every
// output_text part and event; vLLM writes [] in the events and the added
// part, and null in the other parts. noDeltaLps leaves the deltas without
// log-probs even when asked; completedLps, when not "", replaces those of
// the response.completed part.
type respGen struct {
	words          []string
	logprobs, vllm bool
	noDeltaLps     bool
	completedLps   string
}

func (g respGen) String() string {
	var all []string
	for i, w := range g.words {
		all = append(all, fmt.Sprintf(`{"token":%q,"logprob":-0.%d5,"top_logprobs":[]}`, w, i+1))
	}
	text := strings.Join(g.words, "")
	unasked := "[]"
	if g.vllm {
		unasked = "null"
	}
	part, done, item := unasked, "[]", unasked
	if g.logprobs {
		part = "[" + strings.Join(all, ",") + "]"
		if !g.vllm {
			done, item = part, part
		}
	}
	if g.completedLps != "" {
		part = g.completedLps
	}
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	var sb strings.Builder
	sb.WriteString(ev("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_2","object":"response","status":"in_progress","model":"qwen3","output":[],"top_logprobs":0}}`))
	sb.WriteString(ev("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_2","type":"message","status":"in_progress","role":"assistant","content":[]}}`))
	sb.WriteString(ev("response.content_part.added", `{"type":"response.content_part.added","sequence_number":2,"item_id":"msg_2","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}}`))
	for i, w := range g.words {
		lp := "[]"
		if g.logprobs && !g.noDeltaLps {
			lp = "[" + all[i] + "]"
		}
		sb.WriteString(ev("response.output_text.delta", fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_2","output_index":0,"content_index":0,"delta":%q,"logprobs":%s,"obfuscation":"x"}`, 3+i, w, lp)))
	}
	n := 3 + len(g.words)
	sb.WriteString(ev("response.output_text.done", fmt.Sprintf(`{"type":"response.output_text.done","sequence_number":%d,"item_id":"msg_2","output_index":0,"content_index":0,"text":%q,"logprobs":%s}`, n, text, done)))
	sb.WriteString(ev("response.content_part.done", fmt.Sprintf(`{"type":"response.content_part.done","sequence_number":%d,"item_id":"msg_2","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":%s,"text":%q}}`, n+1, item, text)))
	sb.WriteString(ev("response.output_item.done", fmt.Sprintf(`{"type":"response.output_item.done","sequence_number":%d,"output_index":0,"item":{"id":"msg_2","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"logprobs":%s,"text":%q}]}}`, n+2, item, text)))
	sb.WriteString(ev("response.completed", fmt.Sprintf(`{"type":"response.completed","sequence_number":%d,"response":{"id":"resp_2","object":"response","status":"completed","model":"qwen3","output":[{"id":"msg_2","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"logprobs":%s,"text":%q}]}],"top_logprobs":0,"usage":{"input_tokens":5,"output_tokens":3,"total_tokens":8}}}`, n+3, part, text)))
	return sb.String()
}

// TestStreamResponsesLogprobs: the log-probs the gateway asked for are
// recorded from the deltas and stripped from every event, so that the
// client receives, byte for byte, the stream the upstream sends unasked
// (OpenAI's or vLLM's); a client that asked gets them untouched.
func TestStreamResponsesLogprobs(t *testing.T) {
	words := []string{"Par", "is", "."}
	events := 3 + len(words) + 4
	unasked := mustParse(t, core.APIResponses, `{"model":"qwen3","stream":true,"input":"capital?"}`)
	asked := mustParse(t, core.APIResponses, `{"model":"qwen3","stream":true,"input":"capital?","include":["message.output_text.logprobs"]}`)
	check := func(t *testing.T, r core.Response, fidelity core.Fidelity) {
		t.Helper()
		c := r.Choices[0]
		if c.Message.Content != "Paris." || c.Fidelity != fidelity || len(c.Tokens) != len(words) {
			t.Fatalf("choice = %s", js(c))
		}
		for i, tok := range c.Tokens {
			if tok.Token != words[i] || tok.ID != -1 || math.Abs(tok.Logprob-(-0.15-0.1*float64(i))) > 1e-9 {
				t.Fatalf("token %d = %+v", i, tok)
			}
		}
	}
	for _, vllm := range []bool{false, true} {
		caps := Caps{Logprobs: true, TokenIDs: vllm}
		t.Run(fmt.Sprintf("vllm=%v/gateway asked", vllm), func(t *testing.T) {
			client, st, _ := run(t, unasked, caps, respGen{words: words, logprobs: true, vllm: vllm}.String())
			if want := (respGen{words: words, vllm: vllm}).String(); client != want {
				t.Fatalf("client got\n%s\nwant\n%s", client, want)
			}
			if !st.Done() {
				t.Fatal("not done")
			}
			check(t, st.Response(), core.FidelityLogprob)
		})
		t.Run(fmt.Sprintf("vllm=%v/client asked", vllm), func(t *testing.T) {
			up := respGen{words: words, logprobs: true, vllm: vllm}.String()
			client, st, zc := run(t, asked, caps, up)
			if client != up || zc != events {
				t.Fatalf("stream changed (%d zero-copy)", zc)
			}
			check(t, st.Response(), core.FidelityLogprob)
		})
	}
	t.Run("upstream without log-probs", func(t *testing.T) {
		up := respGen{words: words}.String()
		client, st, zc := run(t, unasked, Caps{Logprobs: true}, up)
		if client != up || zc != events {
			t.Fatalf("stream changed (%d zero-copy)", zc)
		}
		if c := st.Response().Choices[0]; c.Fidelity != core.FidelityNone || c.Tokens != nil {
			t.Fatalf("choice = %s", js(c))
		}
	})
	t.Run("completed with fewer log-probs than the deltas", func(t *testing.T) {
		// The deltas' win: they are the tokens the client saw streamed.
		_, st, _ := run(t, unasked, Caps{Logprobs: true, TokenIDs: true},
			respGen{words: words, logprobs: true, vllm: true, completedLps: `[{"token":".","logprob":-0.35,"bytes":[46],"top_logprobs":[]}]`}.String())
		check(t, st.Response(), core.FidelityLogprob)
	})
	t.Run("only the completed response has them", func(t *testing.T) {
		_, st, _ := run(t, unasked, Caps{Logprobs: true}, respGen{words: words, logprobs: true, noDeltaLps: true}.String())
		check(t, st.Response(), core.FidelityLogprob)
	})
	t.Run("cut off", func(t *testing.T) {
		up := respGen{words: words, logprobs: true}.String()
		up = up[:strings.Index(up, "event: response.output_text.done")]
		client, st, _ := run(t, unasked, Caps{Logprobs: true}, up)
		if strings.Contains(client, `"logprob":`) {
			t.Fatalf("log-probs reached the client: %s", client)
		}
		if st.Done() {
			t.Fatal("done without response.completed")
		}
		check(t, st.Response(), core.FidelityPartial)
	})
}
