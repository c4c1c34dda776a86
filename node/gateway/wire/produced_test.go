package wire

import (
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/sse"
)

// TestProduced: Produced turns true with the first event that carries some
// of the reply (text, reasoning, a tool call), not with the events that
// only announce one.
func TestProduced(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  core.APIKind
		body string
		// events, in order; first is the index of the one that makes the
		// stream Produced (-1: none does).
		events []string
		first  int
	}{
		{"chat text", core.APIChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{
			`data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			`data: {"id":"c","choices":[{"index":0,"delta":{"content":""}}]}`,
			`data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hi"}}]}`,
			`data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`data: [DONE]`,
		}, 2},
		{"chat reasoning", core.APIChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{
			`data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}`,
			`data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`,
		}, 1},
		{"chat tool call", core.APIChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{
			`data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`,
			`data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}`,
		}, 1},
		{"chat empty reply", core.APIChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{
			`data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			`data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`data: [DONE]`,
		}, -1},
		{"messages text", core.APIMessages, `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"model\":\"m\"}}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
			"event: ping\ndata: {\"type\":\"ping\"}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}",
		}, 3},
		{"messages tool use", core.APIMessages, `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"model\":\"m\"}}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}}",
		}, 1},
		{"responses text", core.APIResponses, `{"model":"m","stream":true,"input":"hi"}`, []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"model\":\"m\"}}",
			"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"i1\",\"content\":[]}}",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hi\"}",
		}, 2},
		{"responses function call", core.APIResponses, `{"model":"m","stream":true,"input":"hi"}`, []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"model\":\"m\"}}",
			"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"function_call\",\"id\":\"i1\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"\"}}",
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := NewStream(mustParse(t, tc.api, tc.body), Caps{})
			rd := sse.NewReader(strings.NewReader(strings.Join(tc.events, "\n\n")+"\n\n"), 0)
			got := -1
			for i := range tc.events {
				ev, err := rd.Next()
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if _, err := st.Event(ev); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if st.Produced() && got < 0 {
					got = i
				}
			}
			if got != tc.first {
				t.Errorf("produced at event %d, want %d", got, tc.first)
			}
		})
	}
}
