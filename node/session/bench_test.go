package session

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// benchHistory returns a conversation of n messages: a system prompt of
// sysChars characters, then alternating user and assistant turns, every
// fourth assistant turn a tool call followed by its result.
func benchHistory(n, sysChars int, tag string) []core.Message {
	ms := []core.Message{{Role: core.RoleSystem, Content: tag + strings.Repeat("You are a helpful agent. ", sysChars/25+1)[:sysChars]}}
	for i := 1; len(ms) < n; i++ {
		ms = append(ms, core.Message{Role: core.RoleUser, Content: fmt.Sprintf("question %d: %s", i, strings.Repeat("words ", 40))})
		if i%4 == 0 {
			ms = append(ms,
				core.Message{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: fmt.Sprint("call_", i), Name: "search", Arguments: fmt.Sprintf(`{"q":"topic %d","limit":5}`, i)}}},
				core.Message{Role: core.RoleTool, ToolCallID: fmt.Sprint("call_", i), Content: strings.Repeat("result ", 60)})
		}
		ms = append(ms, core.Message{Role: core.RoleAssistant, Content: fmt.Sprintf("answer %d: %s", i, strings.Repeat("text ", 80))})
	}
	return ms[:n]
}

func msgBytes(ms []core.Message) int64 {
	var n int64
	for _, m := range ms {
		n += int64(len(m.Content))
		for _, c := range m.ToolCalls {
			n += int64(len(c.Name) + len(c.Arguments))
		}
	}
	return n
}

// BenchmarkBegin places one call continuing a completed step: histories of
// 10 to 800 messages behind a 40,000-character system prompt, plus
// OpenClaw's volatile context message. Each message is hashed once and the
// tree walked once, so ns/msg stays flat as histories grow.
func BenchmarkBegin(b *testing.B) {
	for _, n := range []int{10, 50, 200, 800} {
		b.Run(fmt.Sprintf("history=%d", n), func(b *testing.B) {
			tr, err := New(Options{})
			if err != nil {
				b.Fatal(err)
			}
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			h := benchHistory(n, 40000, "")
			for h[len(h)-1].Role != core.RoleAssistant {
				h = h[:len(h)-1]
			}
			tr.Begin(Call{Now: now, StepID: "p", Messages: h[:len(h)-1]})
			tr.Complete("p", h[len(h)-1:], now)
			call := append(append([]core.Message(nil), h...),
				core.Message{Role: core.RoleUser, Content: "and now?"},
				core.Message{Role: core.RoleUser, Content: OpenClawMarker + "\ntime=10:00\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"})
			b.SetBytes(msgBytes(call))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				a := tr.Begin(Call{Now: now, StepID: "c", Messages: call})
				if a.Parent != "p" {
					b.Fatalf("parent %q", a.Parent)
				}
				tr.Abort("c")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(call)), "ns/msg")
		})
	}
}

// BenchmarkConversation runs whole agent turns (Begin + Complete, each
// continuing the previous one) in 64 interleaved conversations of up to 50
// messages behind a 40,000-character system prompt; a conversation that
// reaches 50 messages starts again in a new session.
func BenchmarkConversation(b *testing.B) {
	const convs = 64
	tr, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hists := make([][]core.Message, convs)
	var turns []int // request lengths: each ends just before an assistant reply
	for i := range hists {
		hists[i] = benchHistory(50, 40000, fmt.Sprint("agent ", i, ": "))
	}
	for e := 1; e < 50; e++ {
		if hists[0][e].Role == core.RoleAssistant {
			turns = append(turns, e)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, round := i%convs, i/convs
		end := turns[round%len(turns)]
		id := core.StepID(fmt.Sprint("s", i))
		sess := core.SessionID(fmt.Sprint("S", c, "-", round/len(turns)))
		a := tr.Begin(Call{Now: now, StepID: id, Session: sess, Messages: hists[c][:end]})
		if round%len(turns) > 0 && len(a.Closures) != 1 {
			b.Fatalf("turn %d of %s: closures %v", round%len(turns), sess, a.Closures)
		}
		tr.Complete(id, hists[c][end:end+1], now)
	}
	st := tr.Stats()
	b.ReportMetric(float64(st.Nodes)/float64(max(st.Steps, 1)), "nodes/step")
}
