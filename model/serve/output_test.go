package serve

import (
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
)

// parsed is what a parser released, put together.
type parsed struct {
	content, reasoning string
	calls              []core.ToolCall
}

func (p *parsed) add(ps []piece) {
	for _, x := range ps {
		p.content += x.Content
		p.reasoning += x.Reasoning
		if x.Tool != nil {
			p.calls = append(p.calls, *x.Tool)
		}
	}
}

func parseAll(text string, tools, inThink bool, splits []int) parsed {
	p := newOutParser(tools, inThink)
	var out parsed
	prev := 0
	for _, s := range splits {
		if s < prev || s > len(text) {
			continue
		}
		out.add(p.Push(text[prev:s]))
		prev = s
	}
	out.add(p.Push(text[prev:]))
	out.add(p.Finish())
	return out
}

func TestOutParser(t *testing.T) {
	weather := core.ToolCall{Type: "function", Name: "get_weather", Arguments: `{"city": "Paris"}`}
	cases := []struct {
		name            string
		text            string
		tools, inThink  bool
		content, reason string
		calls           []core.ToolCall
	}{
		{name: "plain", text: "Hello there.\n", content: "Hello there.\n"},
		{name: "leading newline kept", text: "\nHi", content: "\nHi"},
		{name: "think", text: "<think>\nLet me see.\n</think>\n\nParis.", content: "Paris.", reason: "Let me see."},
		{name: "empty think", text: "<think>\n\n</think>\n\nOK", content: "OK"},
		{name: "think opened by prompt", text: "pondering\n</think>\n\nDone", inThink: true, content: "Done", reason: "pondering"},
		{name: "cut off in think", text: "<think>\nhmm\n", reason: "hmm\n"},
		{name: "think only at start", text: "a <think>b</think>", content: "a <think>b</think>"},
		{name: "tool call", tools: true,
			text:    "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			content: "I'll check.", calls: []core.ToolCall{weather}},
		{name: "two tool calls and think", tools: true,
			text:   "<think>\nneed weather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": \"{}\"}\n</tool_call>\n",
			reason: "need weather", calls: []core.ToolCall{weather, {Type: "function", Name: "now", Arguments: "{}"}}},
		{name: "tags ignored without tools", text: "<tool_call>\n{\"name\": \"x\"}\n</tool_call>", content: "<tool_call>\n{\"name\": \"x\"}\n</tool_call>"},
		{name: "bad tool json stays content", tools: true, text: "<tool_call>\n{nope}\n</tool_call>", content: "<tool_call>\n{nope}\n</tool_call>"},
		{name: "unterminated tool call", tools: true, text: "x<tool_call>\n{\"name\": \"a\"", content: "x<tool_call>\n{\"name\": \"a\""},
		{name: "partial tag at end", tools: true, text: "see <tool_c", content: "see <tool_c"},
		{name: "newlines inside content kept", tools: true, text: "a\n\nb\n", content: "a\n\nb\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Whole, byte by byte, and in every two-way split.
			splits := [][]int{nil}
			var each []int
			for i := range len(tc.text) {
				each = append(each, i)
				splits = append(splits, []int{i})
			}
			splits = append(splits, each)
			for _, sp := range splits {
				got := parseAll(tc.text, tc.tools, tc.inThink, sp)
				if got.content != tc.content || got.reasoning != tc.reason || !equalCalls(got.calls, tc.calls) {
					t.Fatalf("splits %v: content %q reasoning %q calls %+v\nwant content %q reasoning %q calls %+v",
						sp, got.content, got.reasoning, got.calls, tc.content, tc.reason, tc.calls)
				}
			}
		})
	}
}

func equalCalls(a, b []core.ToolCall) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestOutParserInvertsTemplate renders assistant messages with the Qwen3
// template and parses the generated span back.
func TestOutParserInvertsTemplate(t *testing.T) {
	r := chat.Qwen3()
	ctx := []core.Message{{Role: "user", Content: "weather?"}}
	tools := []core.Tool{{Name: "get_weather", Parameters: []byte(`{"type":"object"}`)}}
	for _, m := range []core.Message{
		{Role: "assistant", Content: "It is sunny."},
		{Role: "assistant", Content: "Sunny.", Reasoning: "Look it up.\nThen answer."},
		{Role: "assistant", Content: "Checking.", ToolCalls: []core.ToolCall{{Type: "function", Name: "get_weather", Arguments: `{"city": "Oslo"}`}}},
		{Role: "assistant", Reasoning: "two calls", ToolCalls: []core.ToolCall{
			{Type: "function", Name: "get_weather", Arguments: `{"city": "Oslo"}`},
			{Type: "function", Name: "get_weather", Arguments: `{"city": "Rome"}`}}},
	} {
		_, completion, err := chat.ActionSpan(r, ctx, tools, m)
		if err != nil {
			t.Fatal(err)
		}
		gen := strings.TrimSuffix(completion, "<|im_end|>")
		got := parseAll(gen, true, false, nil)
		if got.content != m.Content || got.reasoning != m.Reasoning || !equalCalls(got.calls, m.ToolCalls) {
			t.Errorf("%q parsed to content %q reasoning %q calls %+v; want %+v", gen, got.content, got.reasoning, got.calls, m)
		}
	}
}

func TestScanStops(t *testing.T) {
	for _, tc := range []struct {
		text      string
		stops     []string
		cut, keep int
	}{
		{"hello world", []string{"wor"}, 6, 0},
		{"hello wo", []string{"world"}, -1, 2},
		{"abcac", []string{"ca", "b"}, 1, 1},
		{"xyz", nil, -1, 0},
	} {
		cut, keep := scanStops(tc.text, tc.stops)
		if cut != tc.cut || keep != tc.keep {
			t.Errorf("scanStops(%q, %q) = %d, %d; want %d, %d", tc.text, tc.stops, cut, keep, tc.cut, tc.keep)
		}
	}
}

func TestCompleteUTF8(t *testing.T) {
	euro := "€" // 3 bytes
	for _, tc := range []struct {
		s    string
		want int
	}{
		{"abc", 3}, {"a" + euro, 4}, {"a" + euro[:1], 1}, {"a" + euro[:2], 1}, {"\xff", 1}, {"", 0},
	} {
		if got := completeUTF8(tc.s); got != tc.want {
			t.Errorf("completeUTF8(%q) = %d, want %d", tc.s, got, tc.want)
		}
	}
}

// FuzzOutParser checks that the parser releases the same result whatever
// the fragments its input arrives in.
func FuzzOutParser(f *testing.F) {
	f.Add("<think>\nx\n</think>\n\nhi<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>", uint8(3), true, false)
	f.Add("plain\n\ntext", uint8(1), false, false)
	f.Add("r\n</think>ok", uint8(2), true, true)
	f.Fuzz(func(t *testing.T, text string, step uint8, tools, inThink bool) {
		whole := parseAll(text, tools, inThink, nil)
		var splits []int
		for i := 0; i < len(text); i += int(step%7) + 1 {
			splits = append(splits, i)
		}
		split := parseAll(text, tools, inThink, splits)
		if whole.content != split.content || whole.reasoning != split.reasoning || !equalCalls(whole.calls, split.calls) {
			t.Fatalf("whole %+v, split every %d: %+v", whole, step%7+1, split)
		}
	})
}
