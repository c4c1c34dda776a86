package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
)

const vllmChat = `{"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":"Paris.","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"Capital of France."},"logprobs":{"content":[{"token":"Paris","logprob":-0.0123,"bytes":[80,97,114,105,115],"top_logprobs":[]},{"token":".","logprob":-1.5,"bytes":[46],"top_logprobs":[]}]},"finish_reason":"stop","stop_reason":null,"token_ids":[59604,13]}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2,"prompt_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":[151644,872,198],"kv_transfer_params":null}`

func TestParseResponseChat(t *testing.T) {
	chatReqNS := func(extra string) *Request {
		return mustParse(t, core.APIChat, `{"model":"m","messages":[{"role":"user","content":"capital?"}]`+extra+`}`)
	}
	t.Run("added by the gateway: recorded, then stripped", func(t *testing.T) {
		resp, out, err := ParseResponse(chatReqNS(""), 200, []byte(vllmChat), Caps{Logprobs: true, TokenIDs: true})
		if err != nil {
			t.Fatal(err)
		}
		want := strings.NewReplacer(
			`"logprobs":{"content":[{"token":"Paris","logprob":-0.0123,"bytes":[80,97,114,105,115],"top_logprobs":[]},{"token":".","logprob":-1.5,"bytes":[46],"top_logprobs":[]}]}`, `"logprobs":null`,
			`"token_ids":[59604,13]`, `"token_ids":null`,
			`"prompt_token_ids":[151644,872,198]`, `"prompt_token_ids":null`).Replace(vllmChat)
		if string(out) != want {
			t.Fatalf("client body\n%s\nwant\n%s", out, want)
		}
		if resp.Status != 200 || resp.ID != "chatcmpl-abc" || resp.Model != "Qwen/Qwen3-8B" || !reflect.DeepEqual(resp.PromptTokenIDs, []int{151644, 872, 198}) {
			t.Fatalf("resp = %s", js(resp))
		}
		if resp.Usage == nil || *resp.Usage != (core.Usage{PromptTokens: 12, CompletionTokens: 2, TotalTokens: 14}) {
			t.Fatalf("usage = %+v", resp.Usage)
		}
		wantChoice := core.Choice{Index: 0, FinishReason: "stop", Fidelity: core.FidelityExact,
			Message: core.Message{Role: "assistant", Content: "Paris.", Reasoning: "Capital of France."},
			Tokens:  []core.TokenLogprob{{Token: "Paris", ID: 59604, Logprob: -0.0123}, {Token: ".", ID: 13, Logprob: -1.5}}}
		if len(resp.Choices) != 1 || !reflect.DeepEqual(resp.Choices[0], wantChoice) {
			t.Fatalf("choice = %s", js(resp.Choices))
		}
	})
	t.Run("asked by the client: body untouched", func(t *testing.T) {
		body := []byte(vllmChat)
		resp, out, err := ParseResponse(chatReqNS(`,"logprobs":true,"return_token_ids":true`), 200, body, Caps{Logprobs: true, TokenIDs: true})
		if err != nil || &out[0] != &body[0] || len(out) != len(body) {
			t.Fatalf("body copied or changed: %v", err)
		}
		if resp.Choices[0].Fidelity != core.FidelityExact {
			t.Fatal("fidelity")
		}
	})
	t.Run("logprobs asked, token ids added", func(t *testing.T) {
		_, out, err := ParseResponse(chatReqNS(`,"logprobs":true`), 200, []byte(vllmChat), Caps{Logprobs: true, TokenIDs: true})
		if err != nil || !strings.Contains(string(out), `"top_logprobs":[]}]},"finish_reason"`) || strings.Contains(string(out), "59604") {
			t.Fatalf("out = %s (%v)", out, err)
		}
	})
	t.Run("tool calls, logprobs without ids", func(t *testing.T) {
		body := `{"id":"x","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}},{"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},"logprobs":{"content":[{"token":"token_id:42","logprob":-0.5,"bytes":null,"top_logprobs":[]},{"token":"x","logprob":-0.25}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`
		resp, out, err := ParseResponse(chatReqNS(`,"logprobs":true`), 200, []byte(body), Caps{})
		if err != nil || string(out) != body {
			t.Fatal(err)
		}
		c := resp.Choices[0]
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 2 || c.Message.ToolCalls[0].Arguments != `{"a": 1}` || c.Message.ToolCalls[1].ID != "call_2" {
			t.Fatalf("choice = %s", js(c))
		}
		if c.Fidelity != core.FidelityLogprob || c.Tokens[0].ID != 42 || c.Tokens[1].ID != -1 {
			t.Fatalf("tokens = %s %s", c.Fidelity, js(c.Tokens))
		}
	})
}

func TestParseResponseErrors(t *testing.T) {
	req := mustParse(t, core.APIChat, `{"messages":[{"role":"user","content":"x"}]}`)
	body := []byte(`{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)
	resp, out, err := ParseResponse(req, 401, body, Caps{Logprobs: true})
	if err != nil || string(out) != string(body) || resp.Status != 401 || !strings.HasPrefix(string(resp.Error), `{"message":"Incorrect API key`) {
		t.Fatalf("401: %s %v", js(resp), err)
	}
	anth := mustParse(t, core.APIMessages, `{"messages":[{"role":"user","content":"x"}]}`)
	resp, _, _ = ParseResponse(anth, 529, []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), Caps{})
	if string(resp.Error) != `{"type":"overloaded_error","message":"Overloaded"}` {
		t.Fatalf("529: %s", resp.Error)
	}
	resp, out, err = ParseResponse(req, 502, []byte("<html>Bad Gateway</html>"), Caps{})
	if err != nil || string(out) != "<html>Bad Gateway</html>" || string(resp.Error) != `"\u003chtml\u003eBad Gateway\u003c/html\u003e"` {
		t.Fatalf("502: %s %v", resp.Error, err)
	}
	for _, bad := range []string{"", "not json", `{"choices":"nope"}`, `[1]`} {
		resp, out, err = ParseResponse(req, 200, []byte(bad), Caps{Logprobs: true})
		if !errors.Is(err, ErrBadResponse) || string(out) != bad || resp.Status != 200 {
			t.Errorf("%q: err %v, out %q", bad, err, out)
		}
	}
}

func TestParseResponseMessages(t *testing.T) {
	req := mustParse(t, core.APIMessages, `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`)
	body := `{"id":"msg_01","type":"message","role":"assistant","model":"claude-opus-4-1","content":[{"type":"thinking","thinking":"Plan.","signature":"abc"},{"type":"text","text":"I'll look."},{"type":"tool_use","id":"toolu_1","name":"search","input":{"q":"go","limit":10.0}},{"type":"server_tool_use","id":"srv_1","name":"web_search","input":{"query":"x"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":20,"cache_read_input_tokens":30,"output_tokens":40}}`
	resp, out, err := ParseResponse(req, 200, []byte(body), Caps{Logprobs: true, TokenIDs: true})
	if err != nil || string(out) != body {
		t.Fatal(err)
	}
	want := core.Choice{FinishReason: "tool_calls", Message: core.Message{Role: "assistant", Content: "I'll look.", Reasoning: "Plan.",
		ToolCalls: []core.ToolCall{{ID: "toolu_1", Type: "function", Name: "search", Arguments: `{"q":"go","limit":10.0}`}},
		Parts:     []core.Part{{Type: "server_tool_use", Raw: json.RawMessage(`{"type":"server_tool_use","id":"srv_1","name":"web_search","input":{"query":"x"}}`)}}}}
	if resp.ID != "msg_01" || resp.Model != "claude-opus-4-1" || len(resp.Choices) != 1 || !reflect.DeepEqual(resp.Choices[0], want) {
		t.Fatalf("resp = %s", js(resp))
	}
	if *resp.Usage != (core.Usage{PromptTokens: 150, CompletionTokens: 40, TotalTokens: 190}) {
		t.Fatalf("usage = %+v", resp.Usage)
	}
	for stop, finish := range map[string]string{"end_turn": "stop", "max_tokens": "length", "stop_sequence": "stop", "pause_turn": "pause_turn", "refusal": "refusal"} {
		r, _, err := ParseResponse(req, 200, []byte(`{"type":"message","content":[{"type":"text","text":"x"}],"stop_reason":"`+stop+`"}`), Caps{})
		if err != nil || r.Choices[0].FinishReason != finish {
			t.Errorf("%s → %q (%v)", stop, r.Choices[0].FinishReason, err)
		}
	}
}

func TestParseResponseResponses(t *testing.T) {
	const lps = `[{"token":"Hel","logprob":-0.1,"bytes":[72,101,108],"top_logprobs":[]},{"token":"lo","logprob":-0.2,"bytes":[108,111],"top_logprobs":[]}]`
	body := `{"id":"resp_9","object":"response","created_at":1,"status":"completed","error":null,"incomplete_details":null,"model":"gpt-5-2025","output":[{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Think."}]},{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"Hello","logprobs":` + lps + `}]},{"id":"ws_1","type":"web_search_call","status":"completed"}],"usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":0},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":12}}`
	// The client asked for the log-probs: the body goes as it is.
	asked := mustParse(t, core.APIResponses, `{"model":"gpt-5","input":"x","include":["message.output_text.logprobs"]}`)
	if _, out, err := ParseResponse(asked, 200, []byte(body), Caps{Logprobs: true}); err != nil || string(out) != body {
		t.Fatalf("asked: %s (%v)", out, err)
	}
	// The gateway asked: they are recorded and stripped, as OpenAI writes
	// them unasked ([]) or as vLLM does (null).
	req := mustParse(t, core.APIResponses, `{"model":"gpt-5","input":"x"}`)
	for caps, unasked := range map[Caps]string{{Logprobs: true}: "[]", {Logprobs: true, TokenIDs: true}: "null"} {
		_, out, err := ParseResponse(req, 200, []byte(body), caps)
		if want := strings.Replace(body, lps, unasked, 1); err != nil || string(out) != want {
			t.Fatalf("%+v: got\n%s\nwant\n%s (%v)", caps, out, want, err)
		}
	}
	resp, _, err := ParseResponse(req, 200, []byte(body), Caps{Logprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Choices[0]
	if resp.ID != "resp_9" || c.FinishReason != "stop" || c.Message.Content != "Hello" || c.Message.Reasoning != "Think." || len(c.Message.Parts) != 1 || c.Message.Parts[0].Type != "web_search_call" {
		t.Fatalf("resp = %s", js(resp))
	}
	if c.Fidelity != core.FidelityLogprob || len(c.Tokens) != 2 || c.Tokens[1].Logprob != -0.2 {
		t.Fatalf("tokens = %s", js(c.Tokens))
	}
	if *resp.Usage != (core.Usage{PromptTokens: 8, CompletionTokens: 4, TotalTokens: 12}) {
		t.Fatalf("usage = %+v", resp.Usage)
	}
	inc := `{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":"}]}`
	resp, _, err = ParseResponse(req, 200, []byte(inc), Caps{})
	if err != nil || resp.Choices[0].FinishReason != "length" || resp.Choices[0].Message.ToolCalls[0].Arguments != `{"a":` {
		t.Fatalf("incomplete = %s (%v)", js(resp), err)
	}
}

func TestErrorBody(t *testing.T) {
	got := string(ErrorBody("invalid_request_error", "bad_json", `body is "odd"`))
	if got != `{"error":{"message":"body is \"odd\"","type":"invalid_request_error","code":"bad_json"}}` {
		t.Fatal(got)
	}
	if got := string(ErrorBody("api_error", "", "x")); got != `{"error":{"message":"x","type":"api_error","code":null}}` {
		t.Fatal(got)
	}
}

func FuzzParseResponse(f *testing.F) {
	f.Add(uint8(0), uint8(3), []byte(vllmChat))
	f.Add(uint8(1), uint8(0), []byte(`{"type":"message","content":[{"type":"tool_use","id":"t","name":"n","input":{}}],"stop_reason":"tool_use"}`))
	f.Add(uint8(2), uint8(0), []byte(`{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`))
	f.Add(uint8(0), uint8(1), []byte(`{"choices":[{"logprobs":{"content":[]},"token_ids":[1]},{"logprobs":null}],"prompt_token_ids":[1],"prompt_token_ids":[2]}`))
	f.Add(uint8(2), uint8(1), []byte(`{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"ab","logprobs":[{"token":"a","logprob":-1,"bytes":[97],"top_logprobs":[]},{"token":"b","logprob":-2,"bytes":[98],"top_logprobs":[]}]},{"type":"refusal","refusal":"no","logprobs":[{}]}]}]}`))
	f.Add(uint8(2), uint8(3), []byte(`{"output":[{"type":"message","content":[{"logprobs":[ ],"type":"output_text","text":"","logprobs":[{"token":"x","logprob":0}]}]},{"type":"reasoning","content":"odd"}],"output":[]}`))
	apis := []core.APIKind{core.APIChat, core.APIMessages, core.APIResponses}
	f.Fuzz(func(t *testing.T, which, flags uint8, body []byte) {
		req := &Request{API: apis[int(which)%len(apis)], N: 1}
		resp, out, err := ParseResponse(req, 200, body, Caps{Logprobs: flags&1 != 0, TokenIDs: flags&2 != 0})
		if err != nil {
			if !errors.Is(err, ErrBadResponse) || string(out) != string(body) {
				t.Fatalf("err %v; body changed", err)
			}
			return
		}
		if string(out) != string(body) && !json.Valid(out) {
			t.Fatalf("stripped body is not JSON: %s", out)
		}
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
	})
}
