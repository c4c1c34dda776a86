package serve

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/serveapi"
)

// ints decodes a JSON array of ints from an SDK extra field.
func ints(t *testing.T, raw string) []int {
	t.Helper()
	var v []int
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("decoding %q: %v", raw, err)
	}
	return v
}

func userParams(text string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage(text)},
		MaxTokens:   openai.Int(maxTokens),
		Temperature: openai.Float(0),
	}
}

// checkLogprobs compares served log-probs with the engine's own scoring
// of the same tokens.
func checkLogprobs(t *testing.T, e engine.Engine, prompt, toks []int, got []float64) {
	t.Helper()
	if len(got) != len(toks) {
		t.Fatalf("%d logprobs for %d tokens", len(got), len(toks))
	}
	lp, err := e.Logprobs(context.Background(), [][]int{append(slices.Clone(prompt), toks...)}, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		want := float64(lp[0][len(prompt)+i])
		if math.Abs(g-want) > 2e-3 {
			t.Fatalf("token %d (%d): served logprob %.5f, engine.Logprobs %.5f", i, toks[i], g, want)
		}
	}
}

func TestChatCompletion(t *testing.T) {
	e, tok := newTinyEngine(t, 1)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok, ModelName: "tiny-test"})
	c := sdk(base)
	var hr *http.Response
	p := userParams("What is the capital of France?", 24)
	p.Logprobs = openai.Bool(true)
	resp, err := c.Chat.Completions.New(context.Background(), p,
		option.WithJSONSet("return_token_ids", true), option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	if got := hr.Header.Get(serveapi.AdapterHeader); got != DefaultAdapter {
		t.Errorf("%s = %q, want %q", serveapi.AdapterHeader, got, DefaultAdapter)
	}
	if resp.Model != "tiny-test" || resp.Object != "chat.completion" || !strings.HasPrefix(resp.ID, "chatcmpl-") {
		t.Errorf("model %q object %q id %q", resp.Model, resp.Object, resp.ID)
	}
	text, err := chat.Qwen3().Render([]core.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What is the capital of France?"}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := tok.Encode(text)
	if got := ints(t, resp.JSON.ExtraFields["prompt_token_ids"].Raw()); !slices.Equal(got, wantPrompt) {
		t.Fatalf("prompt_token_ids %v, want %v", got, wantPrompt)
	}
	if len(resp.Choices) != 1 {
		t.Fatalf("%d choices", len(resp.Choices))
	}
	ch := resp.Choices[0]
	toks := ints(t, ch.JSON.ExtraFields["token_ids"].Raw())

	// The same greedy generation straight from the engine.
	direct, _, err := e.Generate(context.Background(), wantPrompt, engine.GenOptions{MaxTokens: 24, Stop: []int{e.Info().EOS[0]}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(toks, direct) {
		t.Fatalf("served tokens %v, engine.Generate %v", toks, direct)
	}
	var text2 strings.Builder
	for _, id := range toks {
		if !tok.IsSpecial(id) {
			text2.WriteString(tok.Decode([]int{id}))
		}
	}
	// Whatever the parser made of it, content and reasoning come from the
	// decoded tokens.
	if ch.Message.Content != text2.String() && !strings.Contains(text2.String(), "think>") {
		t.Errorf("content %q, tokens decode to %q", ch.Message.Content, text2.String())
	}
	if len(toks) == 24 && ch.FinishReason != "length" || len(toks) < 24 && ch.FinishReason != "stop" {
		t.Errorf("finish_reason %q after %d tokens", ch.FinishReason, len(toks))
	}
	var lps []float64
	var joined []byte
	for _, l := range ch.Logprobs.Content {
		lps = append(lps, l.Logprob)
		for _, b := range l.Bytes {
			joined = append(joined, byte(b))
		}
	}
	checkLogprobs(t, e, wantPrompt, toks, lps)
	if string(joined) != tok.Decode(toks) {
		t.Errorf("logprob bytes %q, tokens decode to %q", joined, tok.Decode(toks))
	}
	if resp.Usage.PromptTokens != int64(len(wantPrompt)) || resp.Usage.CompletionTokens != int64(len(toks)) ||
		resp.Usage.TotalTokens != int64(len(wantPrompt)+len(toks)) {
		t.Errorf("usage %+v for %d + %d tokens", resp.Usage, len(wantPrompt), len(toks))
	}
}

// streamed is a streaming response put back together.
type streamed struct {
	content, reasoning map[int]string
	tokens             map[int][]int
	logprobs           map[int][]float64
	finish             map[int]string
	prompt             []int
	usage              *openai.CompletionUsage
	chunks             int
}

func collectStream(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) (*streamed, *http.Response) {
	t.Helper()
	var hr *http.Response
	opts = append(opts, option.WithResponseInto(&hr))
	st := c.Chat.Completions.NewStreaming(context.Background(), p, opts...)
	out := &streamed{content: map[int]string{}, reasoning: map[int]string{}, tokens: map[int][]int{},
		logprobs: map[int][]float64{}, finish: map[int]string{}}
	for st.Next() {
		ck := st.Current()
		out.chunks++
		if f, ok := ck.JSON.ExtraFields["prompt_token_ids"]; ok && f.Raw() != "" && f.Raw() != "null" {
			if out.prompt != nil {
				t.Error("prompt_token_ids on more than one chunk")
			}
			out.prompt = ints(t, f.Raw())
		}
		if ck.Usage.TotalTokens > 0 {
			u := ck.Usage
			out.usage = &u
			if len(ck.Choices) != 0 {
				t.Error("usage chunk has choices")
			}
		}
		for _, cc := range ck.Choices {
			i := int(cc.Index)
			out.content[i] += cc.Delta.Content
			if f, ok := cc.Delta.JSON.ExtraFields["reasoning_content"]; ok && f.Raw() != "" && f.Raw() != "null" {
				var s string
				json.Unmarshal([]byte(f.Raw()), &s)
				out.reasoning[i] += s
			}
			if f, ok := cc.JSON.ExtraFields["token_ids"]; ok && f.Raw() != "" && f.Raw() != "null" {
				out.tokens[i] = append(out.tokens[i], ints(t, f.Raw())...)
			}
			for _, l := range cc.Logprobs.Content {
				out.logprobs[i] = append(out.logprobs[i], l.Logprob)
			}
			if cc.FinishReason != "" {
				if out.finish[i] != "" {
					t.Errorf("choice %d finished twice", i)
				}
				out.finish[i] = cc.FinishReason
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return out, hr
}

func TestChatStreamingMatchesNonStreaming(t *testing.T) {
	e, tok := newTinyEngine(t, 2)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok})
	c := sdk(base)
	for _, n := range []int64{1, 3} {
		p := userParams("Tell me a story about a robot.", 40)
		p.Logprobs = openai.Bool(true)
		p.N = openai.Int(n)
		p.Temperature = openai.Float(0.9)
		p.Seed = openai.Int(11)
		full, err := c.Chat.Completions.New(context.Background(), p, option.WithJSONSet("return_token_ids", true))
		if err != nil {
			t.Fatal(err)
		}
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st, hr := collectStream(t, c, p, option.WithJSONSet("return_token_ids", true))
		if hr.Header.Get("Content-Type") != "text/event-stream" || hr.Header.Get(serveapi.AdapterHeader) != DefaultAdapter {
			t.Errorf("headers %v", hr.Header)
		}
		if len(full.Choices) != int(n) {
			t.Fatalf("n=%d: %d choices", n, len(full.Choices))
		}
		if !slices.Equal(st.prompt, ints(t, full.JSON.ExtraFields["prompt_token_ids"].Raw())) {
			t.Errorf("streamed prompt ids differ")
		}
		var total int
		for _, ch := range full.Choices {
			i := int(ch.Index)
			toks := ints(t, ch.JSON.ExtraFields["token_ids"].Raw())
			total += len(toks)
			if !slices.Equal(st.tokens[i], toks) {
				t.Errorf("n=%d choice %d: streamed tokens %v, non-streamed %v", n, i, st.tokens[i], toks)
			}
			if st.content[i] != ch.Message.Content || st.finish[i] != ch.FinishReason {
				t.Errorf("n=%d choice %d: streamed %q (%s), non-streamed %q (%s)", n, i, st.content[i], st.finish[i], ch.Message.Content, ch.FinishReason)
			}
			var lps []float64
			for _, l := range ch.Logprobs.Content {
				lps = append(lps, l.Logprob)
			}
			if !slices.Equal(st.logprobs[i], lps) {
				t.Errorf("n=%d choice %d: streamed logprobs differ", n, i)
			}
			checkLogprobs(t, e, st.prompt, st.tokens[i], st.logprobs[i])
		}
		if n > 1 && slices.Equal(st.tokens[0], st.tokens[1]) {
			t.Errorf("choices 0 and 1 sampled the same %v", st.tokens[0])
		}
		if st.usage == nil || st.usage.CompletionTokens != int64(total) || st.usage.PromptTokens != int64(len(st.prompt)) {
			t.Errorf("usage %+v, want %d completion tokens", st.usage, total)
		}
	}
}

func TestSeedDeterminism(t *testing.T) {
	e, tok := newTinyEngine(t, 3)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok, MaxConcurrent: 2})
	c := sdk(base)
	run := func(seed int64) string {
		p := userParams("Pick random words.", 32)
		p.Temperature = openai.Float(1)
		p.Seed = openai.Int(seed)
		r, err := c.Chat.Completions.New(context.Background(), p, option.WithJSONSet("return_token_ids", true))
		if err != nil {
			t.Fatal(err)
		}
		return r.Choices[0].JSON.ExtraFields["token_ids"].Raw()
	}
	a, b, other := run(5), run(5), run(6)
	if a != b {
		t.Errorf("same seed, different tokens:\n%s\n%s", a, b)
	}
	if a == other {
		t.Errorf("seeds 5 and 6 sampled the same tokens %s", a)
	}
}

func TestStopSequence(t *testing.T) {
	e, tok := newTinyEngine(t, 4)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok})
	c := sdk(base)
	p := userParams("Count from one to ten.", 48)
	free, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	text := free.Choices[0].Message.Content
	if len(text) < 12 {
		t.Fatalf("greedy text %q too short to cut", text)
	}
	stop := text[6:9]
	cut := strings.Index(text, stop)
	p.Stop = openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"\x00never", stop}}
	got, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Choices[0].Message.Content != text[:cut] || got.Choices[0].FinishReason != "stop" {
		t.Errorf("with stop %q: %q (%s), want %q (stop)", stop, got.Choices[0].Message.Content, got.Choices[0].FinishReason, text[:cut])
	}
	st, _ := collectStream(t, c, p)
	if st.content[0] != text[:cut] || st.finish[0] != "stop" {
		t.Errorf("streamed with stop %q: %q (%s), want %q", stop, st.content[0], st.finish[0], text[:cut])
	}
}

func TestMaxTokensLength(t *testing.T) {
	e, tok := newTinyEngine(t, 5)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok})
	c := sdk(base)
	p := userParams("Hello", 0)
	p.MaxTokens = param.Opt[int64]{}
	p.MaxCompletionTokens = openai.Int(3)
	r, err := c.Chat.Completions.New(context.Background(), p, option.WithJSONSet("return_token_ids", true))
	if err != nil {
		t.Fatal(err)
	}
	toks := ints(t, r.Choices[0].JSON.ExtraFields["token_ids"].Raw())
	if len(toks) == 3 && r.Choices[0].FinishReason != "length" || len(toks) > 3 || r.Usage.CompletionTokens != int64(len(toks)) {
		t.Errorf("%d tokens, finish %q, usage %+v", len(toks), r.Choices[0].FinishReason, r.Usage)
	}
}

func TestModels(t *testing.T) {
	e, tok := newTinyEngine(t, 6)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok, ModelName: "m1", Adapter: "v0"})
	c := sdk(base)
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "m1" || page.Data[0].JSON.ExtraFields["adapter"].Raw() != `"v0"` {
		t.Errorf("models %+v", page.Data)
	}
}

// TestTopLogprobs: top_logprobs lists, at each position, the most likely
// tokens, most likely first; greedy decoding chose the first. Streaming
// gives the same lists as the whole response.
func TestTopLogprobs(t *testing.T) {
	e, tok := newTinyEngine(t, 4)
	_, base := startServer(t, Config{Model: e, Tokenizer: tok})
	c := sdk(base)
	p := userParams("List three colours.", 12)
	p.Logprobs = openai.Bool(true)
	p.TopLogprobs = openai.Int(3)
	resp, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	content := resp.Choices[0].Logprobs.Content
	if len(content) == 0 {
		t.Fatal("no logprobs")
	}
	for i, l := range content {
		if len(l.TopLogprobs) != 3 || l.TopLogprobs[0].Token != l.Token || l.TopLogprobs[0].Logprob != l.Logprob {
			t.Fatalf("position %d: token %q %v, tops %+v", i, l.Token, l.Logprob, l.TopLogprobs)
		}
		if !(l.TopLogprobs[0].Logprob >= l.TopLogprobs[1].Logprob && l.TopLogprobs[1].Logprob >= l.TopLogprobs[2].Logprob) {
			t.Fatalf("position %d: tops not in order: %+v", i, l.TopLogprobs)
		}
	}
	stream := c.Chat.Completions.NewStreaming(context.Background(), p)
	var streamed []openai.ChatCompletionTokenLogprob
	for stream.Next() {
		if ch := stream.Current().Choices; len(ch) > 0 {
			streamed = append(streamed, ch[0].Logprobs.Content...)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(streamed) != len(content) {
		t.Fatalf("streamed %d positions, whole %d", len(streamed), len(content))
	}
	for i := range streamed {
		for j := range 3 {
			if streamed[i].TopLogprobs[j].Token != content[i].TopLogprobs[j].Token || streamed[i].TopLogprobs[j].Logprob != content[i].TopLogprobs[j].Logprob {
				t.Fatalf("position %d rank %d: streamed %+v, whole %+v", i, j, streamed[i].TopLogprobs[j], content[i].TopLogprobs[j])
			}
		}
	}
	// top_logprobs without logprobs is refused.
	p.Logprobs = openai.Bool(false)
	if _, err := c.Chat.Completions.New(context.Background(), p); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("top_logprobs without logprobs: %v", err)
	}
}
