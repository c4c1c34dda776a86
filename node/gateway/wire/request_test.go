package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
)

func mustParse(t *testing.T, api core.APIKind, body string) *Request {
	t.Helper()
	req, err := ParseRequest(api, []byte(body))
	if err != nil {
		t.Fatalf("ParseRequest: %v", err)
	}
	return req
}

func checkMessages(t *testing.T, got, want []core.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d messages %s, want %d", len(got), js(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(normParts(got[i]), normParts(want[i])) {
			t.Errorf("message %d:\n got %s\nwant %s", i, js(got[i]), js(want[i]))
		}
	}
}

// normParts compacts part JSON so tests can write it readably.
func normParts(m core.Message) core.Message {
	for i, p := range m.Parts {
		var v any
		if json.Unmarshal(p.Raw, &v) == nil {
			b, _ := json.Marshal(v)
			m.Parts[i].Raw = b
		}
	}
	return m
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestParseChatRequest(t *testing.T) {
	body := `{
  "model": "qwen3-8b",
  "messages": [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "What is in "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "this picture?"}]},
    {"role": "assistant", "content": null, "reasoning_content": "Look it up.", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"cat\"}"}},
      {"id": "call_2", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "zoomed"}]},
    {"role": "system", "name": "ops", "content": "late system"}
  ],
  "tools": [{"type": "function", "function": {"name": "lookup", "description": "Look up a word", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
  "temperature": 0.70,
  "max_completion_tokens": 1e3,
  "n": 2,
  "stream": true,
  "stream_options": {"include_usage": true},
  "logprobs": true,
  "metadata": {"user_id": "u-1"},
  "prompt_cache_key": "pck",
  "user": "alice",
  "x_vendor": {"keep": [1, 2.50]}
}`
	req := mustParse(t, core.APIChat, body)
	if req.API != core.APIChat || !req.Stream || req.Model != "qwen3-8b" || req.N != 2 || !req.IncludeUsage || !req.WantLogprobs || req.WantTokenIDs {
		t.Fatalf("header fields wrong: %+v", req)
	}
	if req.MetadataUserID != "u-1" || req.PromptCacheKey != "pck" || req.User != "alice" {
		t.Fatalf("hints wrong: %q %q %q", req.MetadataUserID, req.PromptCacheKey, req.User)
	}
	checkMessages(t, req.Normalized.Messages, []core.Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "What is in this picture?", Parts: []core.Part{{Type: "image_url", Raw: json.RawMessage(`{"image_url":{"url":"data:image/png;base64,AAAA"},"type":"image_url"}`)}}},
		{Role: "assistant", Reasoning: "Look it up.", ToolCalls: []core.ToolCall{
			{ID: "call_1", Type: "function", Name: "lookup", Arguments: `{"q":"cat"}`},
			{ID: "call_2", Type: "function", Name: "zoom", Arguments: `{}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: "a cat"},
		{Role: "tool", ToolCallID: "call_2", Content: "zoomed"},
		{Role: "system", Name: "ops", Content: "late system"},
	})
	if len(req.Normalized.Tools) != 1 || req.Normalized.Tools[0].Name != "lookup" || req.Normalized.Tools[0].Description != "Look up a word" ||
		!strings.Contains(string(req.Normalized.Tools[0].Parameters), `"properties"`) {
		t.Fatalf("tools = %s", js(req.Normalized.Tools))
	}
	params := string(req.Normalized.Params)
	want := `{"model": "qwen3-8b","temperature": 0.70,"max_completion_tokens": 1e3,"n": 2,"stream": true,"stream_options": {"include_usage": true},"logprobs": true,"metadata": {"user_id": "u-1"},"prompt_cache_key": "pck","user": "alice","x_vendor": {"keep": [1, 2.50]}}`
	if params != want {
		t.Fatalf("params =\n%s\nwant\n%s", params, want)
	}
	if req.Normalized.Model != "qwen3-8b" {
		t.Fatal("normalized model")
	}
}

func TestParseChatRequestDefaults(t *testing.T) {
	req := mustParse(t, core.APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"return_token_ids":true,"stream_options":null,"logprobs":null}`)
	if req.N != 1 || req.Stream || req.IncludeUsage || req.WantLogprobs || !req.WantTokenIDs {
		t.Fatalf("%+v", req)
	}
	// Legacy function role and function_call.
	req = mustParse(t, core.APIChat, `{"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{\"a\":1}"}},{"role":"function","name":"f","content":"ok"}]}`)
	checkMessages(t, req.Normalized.Messages, []core.Message{
		{Role: "assistant", ToolCalls: []core.ToolCall{{Type: "function", Name: "f", Arguments: `{"a":1}`}}},
		{Role: "tool", Name: "f", ToolCallID: "f", Content: "ok"},
	})
}

func TestParseRequestErrors(t *testing.T) {
	cases := []struct {
		api  core.APIKind
		body string
	}{
		{core.APIChat, ``},
		{core.APIChat, `[]`},
		{core.APIChat, `{"messages":`},
		{core.APIChat, `{"model":"m"}`},
		{core.APIChat, `{"messages":[]}`},
		{core.APIChat, `{"messages":[{"role":"wizard","content":"x"}]}`},
		{core.APIChat, `{"messages":[{"role":"user","content":42}]}`},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}],"n":0}`},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}],"tools":[1]}`},
		{core.APIMessages, `{"model":"m"}`},
		{core.APIMessages, `{"messages":[{"role":"system","content":"x"}]}`},
		{core.APIMessages, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`},
		{core.APIResponses, `{"input":42}`},
		{core.APIResponses, `{"input":[{"type":"message","role":"robot","content":"x"}]}`},
		{"completions", `{"prompt":"x"}`},
	}
	for _, c := range cases {
		if _, err := ParseRequest(c.api, []byte(c.body)); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s %q: err = %v, want ErrBadRequest", c.api, c.body, err)
		}
	}
}

// TestParseRequestErrorText: what a client reads of a body it got wrong
// names the JSON member and what it should be, never the Go types that
// decoding it met.
func TestParseRequestErrorText(t *testing.T) {
	for _, c := range []struct {
		api        core.APIKind
		body, want string
	}{
		{core.APIChat, `{"messages":"x"}`, "messages: want an array, got a string"},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}],"n":1.5}`, "n: want an integer, got the number 1.5"},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`, "stream: want true or false, got a string"},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}],"tools":[1]}`, "tools[0]: want an object, got a number"},
		{core.APIChat, `{"messages":[{"role":"user","content":"x"}`, "body is not valid JSON"},
		{core.APIMessages, `{"messages":{}}`, "messages: want an array, got an object"},
		{core.APIMessages, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages[0]: text: want a string, got a number"},
		{core.APIMessages, `{"messages":[{"role":"user","content":["x"]}]}`, "messages[0]: want an object, got a string"},
		{core.APIResponses, `{"input":[5]}`, "input: want an object, got a number"},
	} {
		_, err := ParseRequest(c.api, []byte(c.body))
		if !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s %s: err = %v, want ErrBadRequest", c.api, c.body, err)
			continue
		}
		if got := strings.TrimPrefix(err.Error(), ErrBadRequest.Error()+": "); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.api, c.body, got, c.want)
		}
		for _, internal := range []string{"Go ", "wire.", "unmarshal", "struct"} {
			if strings.Contains(err.Error(), internal) {
				t.Errorf("%s %s: %q says %q", c.api, c.body, err, internal)
			}
		}
	}
}

func TestParseMessagesRequest(t *testing.T) {
	body := `{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,
 "system":[{"type":"text","text":"You are helpful.","cache_control":{"type":"ephemeral"}},{"type":"text","text":" Be brief."}],
 "metadata":{"user_id":"user_abc"},
 "messages":[
  {"role":"user","content":"Read the file."},
  {"role":"assistant","content":[
    {"type":"thinking","thinking":"I should read it.","signature":"sig"},
    {"type":"text","text":"Reading."},
    {"type":"tool_use","id":"toolu_1","name":"read","input":{"path":"a.txt","n":1.50}}]},
  {"role":"user","content":[
    {"type":"tool_result","tool_use_id":"toolu_1","is_error":true,"content":[{"type":"text","text":"no such file"}]},
    {"type":"text","text":"Try b.txt"},
    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},
  {"role":"assistant","content":"ok"}
 ],
 "tools":[{"name":"read","description":"Read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}},{"type":"web_search_20250305","name":"web_search"}]}`
	req := mustParse(t, core.APIMessages, body)
	if !req.Stream || req.Model != "claude-sonnet-4-5" || req.MetadataUserID != "user_abc" || req.N != 1 {
		t.Fatalf("%+v", req)
	}
	checkMessages(t, req.Normalized.Messages, []core.Message{
		{Role: "system", Content: "You are helpful. Be brief."},
		{Role: "user", Content: "Read the file."},
		{Role: "assistant", Content: "Reading.", Reasoning: "I should read it.", ToolCalls: []core.ToolCall{{ID: "toolu_1", Type: "function", Name: "read", Arguments: `{"path":"a.txt","n":1.50}`}}},
		{Role: "tool", ToolCallID: "toolu_1", Content: "no such file", IsError: true},
		{Role: "user", Content: "Try b.txt", Parts: []core.Part{{Type: "image", Raw: json.RawMessage(`{"source":{"data":"AAAA","media_type":"image/png","type":"base64"},"type":"image"}`)}}},
		{Role: "assistant", Content: "ok"},
	})
	tools := req.Normalized.Tools
	if len(tools) != 2 || tools[0].Name != "read" || !strings.Contains(string(tools[0].Parameters), `"path"`) || tools[1].Name != "web_search" {
		t.Fatalf("tools = %s", js(tools))
	}
	if got := string(req.Normalized.Params); got != `{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"metadata":{"user_id":"user_abc"}}` {
		t.Fatalf("params = %s", got)
	}
}

func TestParseResponsesRequest(t *testing.T) {
	req := mustParse(t, core.APIResponses, `{"model":"gpt-5","instructions":"Be kind.","input":"Hello","prompt_cache_key":"k1","user":"u"}`)
	checkMessages(t, req.Normalized.Messages, []core.Message{{Role: "system", Content: "Be kind."}, {Role: "user", Content: "Hello"}})
	if req.PromptCacheKey != "k1" || req.User != "u" || req.Stream {
		t.Fatalf("%+v", req)
	}
	body := `{"model":"gpt-5","stream":true,"reasoning":{"effort":"low"},
 "input":[
  {"type":"message","role":"developer","content":"Use tools."},
  {"role":"user","content":[{"type":"input_text","text":"Weather in "},{"type":"input_text","text":"Paris?"},{"type":"input_image","image_url":"https://x/y.png"}]},
  {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Need weather."}]},
  {"type":"function_call","id":"fc_1","call_id":"call_9","name":"weather","arguments":"{\"city\":\"Paris\"}"},
  {"type":"function_call_output","call_id":"call_9","output":"18C"},
  {"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is 18C."}]},
  {"type":"item_reference","id":"msg_0"}
 ],
 "tools":[{"type":"function","name":"weather","description":"Get weather","parameters":{"type":"object"},"strict":true},{"type":"web_search"}]}`
	req = mustParse(t, core.APIResponses, body)
	checkMessages(t, req.Normalized.Messages, []core.Message{
		{Role: "system", Content: "Use tools."},
		{Role: "user", Content: "Weather in Paris?", Parts: []core.Part{{Type: "input_image", Raw: json.RawMessage(`{"image_url":"https://x/y.png","type":"input_image"}`)}}},
		{Role: "assistant", Reasoning: "Need weather.", ToolCalls: []core.ToolCall{{ID: "call_9", Type: "function", Name: "weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "call_9", Content: "18C"},
		{Role: "assistant", Content: "It is 18C.", Parts: []core.Part{{Type: "item_reference", Raw: json.RawMessage(`{"id":"msg_0","type":"item_reference"}`)}}},
	})
	tools := req.Normalized.Tools
	if len(tools) != 2 || tools[0].Name != "weather" || tools[0].Description != "Get weather" || string(tools[0].Parameters) != `{"type":"object"}` || tools[1].Name != "web_search" {
		t.Fatalf("tools = %s", js(tools))
	}
	if got := string(req.Normalized.Params); got != `{"model":"gpt-5","stream":true,"reasoning":{"effort":"low"}}` {
		t.Fatalf("params = %s", got)
	}
}

func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"logprobs":false,"stream_options":{}}`,
		`{"messages":[{"role":"assistant","content":[{"type":"text","text":"a"}],"tool_calls":[{"id":"c","function":{"name":"f","arguments":{"x":1}}}]}],"n":3}`,
		`{"system":"s","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`,
		`{"instructions":"i","input":[{"type":"reasoning","summary":[{"text":"r"}]},{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}]}`,
		` {"messages":[{"role":"user","content":"x"}] , "stream" : true , "stream_options" : null } `,
	}
	for i, s := range seeds {
		f.Add([]byte(s), uint8(i), true, true)
	}
	// Responses calls with include (which 2).
	for _, s := range []string{
		`{"input":"x","include":["reasoning.encrypted_content"] ,"top_logprobs":2}`,
		`{"input":"x","include":[ ]}`,
		`{"input":"x","include":["message.output_text.logprobs"]}`,
		`{"input":"x","include":"message.output_text.logprobs"}`,
		`{"include":[1,null,{}],"include":null}`,
	} {
		f.Add([]byte(s), uint8(2), true, false)
	}
	apis := []core.APIKind{core.APIChat, core.APIMessages, core.APIResponses}
	f.Fuzz(func(t *testing.T, body []byte, which uint8, lp, ids bool) {
		api := apis[int(which)%len(apis)]
		req, err := ParseRequest(api, body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error not wrapping ErrBadRequest: %v", err)
			}
			return
		}
		if req.N < 1 {
			t.Fatal("N < 1")
		}
		if p := req.Normalized.Params; p != nil && !json.Valid(p) {
			t.Fatalf("params not JSON: %s", p)
		}
		up, err := UpstreamBody(req, body, Caps{Logprobs: lp, TokenIDs: ids})
		if err != nil {
			t.Fatalf("UpstreamBody: %v", err)
		}
		if !json.Valid(up) {
			t.Fatalf("upstream body not JSON: %s", up)
		}
		again, err := ParseRequest(api, up)
		if err != nil {
			t.Fatalf("upstream body does not parse: %v", err)
		}
		add := addedFor(req, Caps{Logprobs: lp, TokenIDs: ids})
		if add.logprobs && !again.WantLogprobs || add.tokenIDs && !again.WantTokenIDs || add.usage && !again.IncludeUsage {
			t.Fatalf("upstream body lacks what was added: %s", up)
		}
		if !reflect.DeepEqual(again.Normalized.Messages, req.Normalized.Messages) {
			t.Fatal("patching changed the messages")
		}
	})
}
