package wire

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
)

func TestUpstreamBody(t *testing.T) {
	all := Caps{Logprobs: true, TokenIDs: true}
	cases := []struct {
		name string
		api  core.APIKind
		caps Caps
		body string
		want string // "" means unchanged
	}{
		{
			name: "nothing to add",
			api:  core.APIChat,
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "client already asked for everything",
			api:  core.APIChat, caps: all,
			body: `{"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"return_token_ids":true,"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "messages api never patched",
			api:  core.APIMessages, caps: all,
			body: `{"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "responses without caps",
			api:  core.APIResponses, caps: Caps{TokenIDs: true},
			body: `{"stream":true,"input":"hi"}`,
		},
		{
			name: "responses: include created",
			api:  core.APIResponses, caps: all,
			body: `{"stream":true,"input":"hi"}`,
			want: `{"stream":true,"input":"hi","include":["message.output_text.logprobs"]}`,
		},
		{
			name: "responses: appended to the client's include, its bytes kept",
			api:  core.APIResponses, caps: Caps{Logprobs: true},
			body: `{"include": [ "reasoning.encrypted_content" ,"file_search_call.results"  ] ,"input":"hi","top_logprobs":3}`,
			want: `{"include": [ "reasoning.encrypted_content" ,"file_search_call.results","message.output_text.logprobs"  ] ,"input":"hi","top_logprobs":3}`,
		},
		{
			name: "responses: empty include",
			api:  core.APIResponses, caps: Caps{Logprobs: true},
			body: "{\"input\":\"hi\",\"include\":[\n]}",
			want: "{\"input\":\"hi\",\"include\":[\"message.output_text.logprobs\"\n]}",
		},
		{
			name: "responses: null include",
			api:  core.APIResponses, caps: Caps{Logprobs: true},
			body: `{"include":null,"input":"hi"}`,
			want: `{"include":["message.output_text.logprobs"],"input":"hi"}`,
		},
		{
			name: "responses: the last of repeated include members counts",
			api:  core.APIResponses, caps: Caps{Logprobs: true},
			body: `{"include":"odd","input":"hi","include":[]}`,
			want: `{"include":"odd","input":"hi","include":["message.output_text.logprobs"]}`,
		},
		{
			name: "responses: client already asked",
			api:  core.APIResponses, caps: all,
			body: `{"input":"hi","include":["reasoning.encrypted_content","message.output_text.logprobs"]}`,
		},
		{
			name: "responses: include not an array is left to the upstream",
			api:  core.APIResponses, caps: all,
			body: `{"input":"hi","include":"message.output_text.logprobs"}`,
		},
		{
			name: "responses: pretty-printed, no members",
			api:  core.APIResponses, caps: all,
			body: "{\n}\n",
			want: "{\"include\":[\"message.output_text.logprobs\"]\n}\n",
		},
		{
			name: "all added, unknown fields and numbers preserved",
			api:  core.APIChat, caps: all,
			body: `{"model":"qwen3","temperature":0.70,"top_p":1.0e0,"seed":12345678901234567890,"x_unknown":{"a":[1,2.50e3,"\u00e9"]},"messages":[{"role":"user","content":"hi \"there\""}],"stream":true}`,
			want: `{"model":"qwen3","temperature":0.70,"top_p":1.0e0,"seed":12345678901234567890,"x_unknown":{"a":[1,2.50e3,"\u00e9"]},"messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"logprobs":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`,
		},
		{
			name: "non-streaming gets no stream_options",
			api:  core.APIChat, caps: Caps{Logprobs: true},
			body: `{"messages":[{"role":"user","content":"hi"}],"stream":false}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"stream":false,"logprobs":true}`,
		},
		{
			name: "false and null replaced in place",
			api:  core.APIChat, caps: all,
			body: `{"logprobs": false, "messages":[{"role":"user","content":"hi"}], "return_token_ids" :null,"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":false}}`,
			want: `{"logprobs": true, "messages":[{"role":"user","content":"hi"}], "return_token_ids" :true,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`,
		},
		{
			name: "stream_options without include_usage",
			api:  core.APIChat,
			body: `{"stream":true,"stream_options":{ },"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"stream":true,"stream_options":{"include_usage":true },"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "stream_options with other members",
			api:  core.APIChat,
			body: `{"stream":true,"stream_options":{"x":1},"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"stream":true,"stream_options":{"x":1,"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "stream_options null",
			api:  core.APIChat,
			body: `{"stream":true,"stream_options":null,"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "pretty-printed body keeps its layout",
			api:  core.APIChat, caps: Caps{Logprobs: true},
			body: "{\n  \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],\n  \"stream\": true\n}\n",
			want: "{\n  \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],\n  \"stream\": true,\"logprobs\":true,\"stream_options\":{\"include_usage\":true}\n}\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			req := mustParse(t, c.api, c.body)
			got, err := UpstreamBody(req, body, c.caps)
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if len(got) != len(body) || &got[0] != &body[0] {
					t.Fatalf("body changed (or copied): %s", got)
				}
				return
			}
			if string(got) != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
			if !json.Valid(got) {
				t.Fatal("not valid JSON")
			}
			if !bytes.Equal(body, []byte(c.body)) {
				t.Fatal("client body modified in place")
			}
		})
	}
}

// TestUpstreamBodyKeepsEveryOtherByte removes what was added and checks the
// rest is the client's body, byte for byte, on a large realistic request.
func TestUpstreamBodyKeepsEveryOtherByte(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"model":"qwen3-8b","messages":[`)
	for i := 0; i < 50; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`{"role":"user","content":"line with } and { and \"quotes\" and \\ backslash ` + strings.Repeat("x", i) + `"}`)
	}
	sb.WriteString(`],"temperature":0.600,"max_tokens":4096,"stream":true}`)
	body := []byte(sb.String())
	req := mustParse(t, core.APIChat, sb.String())
	got, err := UpstreamBody(req, body, Caps{Logprobs: true, TokenIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	suffix := `,"logprobs":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`
	if !strings.HasSuffix(string(got), suffix) {
		t.Fatalf("tail = %s", got[len(got)-100:])
	}
	if string(got[:len(got)-len(suffix)])+"}" != string(body) {
		t.Fatal("other bytes changed")
	}
}

// TestRefused: only a Responses call to which the gateway added the
// log-probs include is sent again when refused.
func TestRefused(t *testing.T) {
	plain := mustParse(t, core.APIResponses, `{"model":"gpt-oss","input":"hi"}`)
	asked := mustParse(t, core.APIResponses, `{"model":"gpt-oss","input":"hi","include":["message.output_text.logprobs"]}`)
	chat := mustParse(t, core.APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	lp := Caps{Logprobs: true, TokenIDs: true}
	for _, c := range []struct {
		name   string
		req    *Request
		caps   Caps
		status int
		want   bool
	}{
		{"400", plain, lp, 400, true},
		{"422", plain, lp, 422, true},
		{"other status", plain, lp, 500, false},
		{"ok", plain, lp, 200, false},
		{"nothing added", plain, Caps{TokenIDs: true}, 400, false},
		{"client asked", asked, lp, 400, false},
		{"chat", chat, lp, 400, false},
		{"no request", nil, lp, 400, false},
	} {
		if got := Refused(c.req, c.caps, c.status); got != c.want {
			t.Errorf("%s: Refused = %v", c.name, got)
		}
	}
}
