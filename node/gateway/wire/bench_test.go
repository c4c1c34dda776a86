package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/sse"
)

// benchEvents reads a chat stream of n content chunks into events.
func benchEvents(b *testing.B, o chunkOpts, n int) []sse.Event {
	words := make([]string, n)
	for i := range words {
		words[i] = " word"
	}
	up := genChat(o, false, 1, words, true)
	rd := sse.NewReader(strings.NewReader(up), 0)
	var evs []sse.Event
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		evs = append(evs, ev)
	}
	return evs
}

// BenchmarkStreamChatChunks measures the per-chunk cost of the forwarding
// path: parse, accumulate and (where the gateway added fields) rewrite one
// chat chunk. "plain" is the common case (nothing to strip, ev.Raw
// forwarded); "strip-logprobs" rewrites every chunk; "strip-all" also
// removes vLLM token ids and usage.
func BenchmarkStreamChatChunks(b *testing.B) {
	req := &Request{API: core.APIChat, Stream: true, N: 1}
	cases := []struct {
		name string
		o    chunkOpts
		caps Caps
		inc  bool
	}{
		{"plain", chunkOpts{usageNull: true}, Caps{}, true},
		{"strip-logprobs", chunkOpts{usageNull: true, logprobs: true}, Caps{Logprobs: true}, true},
		{"strip-all", chunkOpts{logprobs: true, tokenIDs: true}, Caps{Logprobs: true, TokenIDs: true}, false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			r := *req
			r.IncludeUsage = c.inc
			evs := benchEvents(b, c.o, 256)
			var bytesIn int
			for _, ev := range evs {
				bytesIn += len(ev.Raw)
			}
			b.ReportAllocs()
			chunks := 0
			for b.Loop() {
				st := NewStream(&r, c.caps)
				for _, ev := range evs {
					if _, err := st.Event(ev); err != nil {
						b.Fatal(err)
					}
				}
				if !st.Done() {
					b.Fatal("not done")
				}
				chunks += len(evs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(chunks), "ns/chunk")
			b.ReportMetric(float64(bytesIn)/float64(len(evs)), "B/chunk-in")
		})
	}
}

// BenchmarkUpstreamBody measures patching a 32 KiB request body.
func BenchmarkUpstreamBody(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","stream":true,"messages":[`)
	for i := 0; sb.Len() < 32<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"` + strings.Repeat("lorem ipsum ", 20) + `"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	req := &Request{API: core.APIChat, Stream: true, N: 1}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		out, err := UpstreamBody(req, body, Caps{Logprobs: true, TokenIDs: true})
		if err != nil || bytes.Equal(out, body) {
			b.Fatal(err)
		}
	}
}

// agentBody is a chat request the size an agent sends: a system prompt of
// about 40,000 characters (lines, so with escaped newlines), twelve tools
// and seven earlier turns.
func agentBody() []byte {
	var sys strings.Builder
	for i := 0; sys.Len() < 40000; i++ {
		fmt.Fprintf(&sys, "Rule %d: when the user asks about topic %d, consult the notes in section %d, cite them, and keep the answer short.\n", i, i*7%97, i%13)
	}
	msgs := []map[string]string{{"role": "system", "content": sys.String()}}
	for t := 0; t < 7; t++ {
		msgs = append(msgs,
			map[string]string{"role": "user", "content": fmt.Sprintf("Turn %d: please look at src/module_%d.go and explain what f%d does.", t, t, t)},
			map[string]string{"role": "assistant", "content": strings.Repeat("It validates its input, then transforms the records. ", 8)})
	}
	var tools []any
	for i := 0; i < 12; i++ {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name": fmt.Sprintf("tool_%02d", i), "description": "Reads, searches or edits the workspace.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]string{"type": "string"}}, "required": []string{"path"}}}})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "tools": tools, "messages": msgs})
	return b
}

// BenchmarkParseRequestAgent parses an agent-sized chat request, as the
// gateway does before it forwards one (on the time to first byte).
func BenchmarkParseRequestAgent(b *testing.B) {
	body := agentBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRequest(core.APIChat, body); err != nil {
			b.Fatal(err)
		}
	}
}
