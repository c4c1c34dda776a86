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
			name: "responses api never patched",
			api:  core.APIResponses, caps: all,
			body: `{"stream":true,"input":"hi"}`,
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
