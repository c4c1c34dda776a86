package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/serveapi"
)

// errStopString ends a generation when a stop string appeared.
var errStopString = errors.New("serve: stop string")

// --- wire shapes of responses ---

type logprobEntry struct {
	Token       string     `json:"token"`
	Logprob     float64    `json:"logprob"`
	Bytes       []int      `json:"bytes"`
	TopLogprobs []topEntry `json:"top_logprobs"`
}

type topEntry struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// alt is one of the most likely tokens at a position.
type alt struct {
	id int
	lp float32
}

type logprobsJSON struct {
	Content []logprobEntry `json:"content"`
}

type toolCallJSON struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type messageJSON struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallJSON `json:"tool_calls,omitempty"`
}

type choiceJSON struct {
	Index        int           `json:"index"`
	Message      messageJSON   `json:"message"`
	Logprobs     *logprobsJSON `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
	TokenIDs     []int         `json:"token_ids,omitempty"`
}

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type completionJSON struct {
	ID             string       `json:"id"`
	Object         string       `json:"object"`
	Created        int64        `json:"created"`
	Model          string       `json:"model"`
	Choices        []choiceJSON `json:"choices"`
	Usage          usageJSON    `json:"usage"`
	PromptTokenIDs []int        `json:"prompt_token_ids,omitempty"`
}

type deltaJSON struct {
	Role             string         `json:"role,omitempty"`
	Content          *string        `json:"content,omitempty"`
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallJSON `json:"tool_calls,omitempty"`
}

type chunkChoiceJSON struct {
	Index        int           `json:"index"`
	Delta        deltaJSON     `json:"delta"`
	Logprobs     *logprobsJSON `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	TokenIDs     []int         `json:"token_ids,omitempty"`
}

type chunkJSON struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Created        int64             `json:"created"`
	Model          string            `json:"model"`
	Choices        []chunkChoiceJSON `json:"choices"`
	Usage          *usageJSON        `json:"usage,omitempty"`
	PromptTokenIDs []int             `json:"prompt_token_ids,omitempty"`
}

// --- the handler ---

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "use POST")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", fmt.Sprintf("request body over %d bytes", mb.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "reading the body: "+err.Error())
		return
	}
	req, err := decodeRequest(body)
	if err != nil {
		writeRequestError(w, err)
		return
	}
	text, err := s.cfg.Renderer.Render(req.Messages, req.Tools, true)
	if err != nil {
		writeRequestError(w, badRequest("messages", "%v", err))
		return
	}
	prompt := s.cfg.Tokenizer.Encode(text)
	room := s.info.MaxPosition - len(prompt)
	if s.info.MaxPosition > 0 && room < 1 {
		writeRequestError(w, &requestError{param: "messages", code: "context_length_exceeded",
			msg: fmt.Sprintf("the prompt is %d tokens; this model's context is %d tokens", len(prompt), s.info.MaxPosition)})
		return
	}
	maxTok := req.MaxTokens
	if maxTok == 0 {
		maxTok = s.cfg.MaxTokens
	}
	if s.info.MaxPosition > 0 {
		maxTok = min(maxTok, room)
	}
	v, release, err := s.acquire()
	if err != nil {
		writeRequestError(w, err)
		return
	}
	defer release()
	w.Header().Set(serveapi.AdapterHeader, v.name)
	g := &generation{
		s: s, req: req, eng: v.eng, prompt: prompt, maxTokens: maxTok,
		inThink: strings.HasSuffix(strings.TrimRight(text, "\n"), thinkOpen),
		id:      s.newID("chatcmpl-"), created: s.cfg.Now().Unix(),
	}
	s.log.Debug("chat completion", "id", g.id, "adapter", v.name, "prompt_tokens", len(prompt), "n", req.N, "stream", req.Stream)
	if req.Stream {
		g.stream(r.Context(), w)
		return
	}
	res, err := g.runAll(r.Context(), nil)
	if err != nil {
		if r.Context().Err() == nil {
			writeRequestError(w, err)
		}
		return
	}
	writeJSON(w, http.StatusOK, g.completion(res))
}

// generation is one chat completion request being served.
type generation struct {
	s         *Server
	req       chatRequest
	eng       engine.Engine
	prompt    []int
	maxTokens int
	inThink   bool
	id        string
	created   int64
}

// choiceResult is one finished choice.
type choiceResult struct {
	tokens    []int
	logprobs  []float32
	tops      [][]alt // per token, with top_logprobs
	content   strings.Builder
	reasoning strings.Builder
	calls     []core.ToolCall
	finish    string
}

// emitFunc receives a streaming choice's chunk.
type emitFunc func(c chunkChoiceJSON) error

// runAll runs every choice, each in its own goroutine under the server's
// concurrency bound, and returns them in index order.
func (g *generation) runAll(ctx context.Context, emit emitFunc) ([]*choiceResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := make([]*choiceResult, g.req.N)
	errs := make([]error, g.req.N)
	var wg sync.WaitGroup
	for i := range g.req.N {
		seed := g.s.newSeed()
		if g.req.Seed != nil {
			seed = *g.req.Seed + uint64(i)
		}
		wg.Go(func() {
			select {
			case g.s.sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-g.s.sem }()
			res[i], errs[i] = g.runChoice(ctx, i, seed, emit)
			if errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// runChoice generates choice idx. With emit set it streams: text is
// released as soon as no stop string or tag can still claim it.
func (g *generation) runChoice(ctx context.Context, idx int, seed uint64, emit emitFunc) (*choiceResult, error) {
	tok := g.s.cfg.Tokenizer
	res := &choiceResult{}
	parser := newOutParser(len(g.req.Tools) > 0, g.inThink)
	var (
		held     string // text not yet cleared of stop strings
		partial  string // bytes of an incomplete UTF-8 sequence
		stopped  bool   // a stop string ended the choice
		pendTok  []int  // tokens not yet reported in a chunk
		pendLp   []float32
		pendTop  [][]alt
		curTop   []alt // the most likely tokens where the next one is chosen
		toolSeen int
	)
	collect := func(ps []piece) {
		for _, p := range ps {
			res.content.WriteString(p.Content)
			res.reasoning.WriteString(p.Reasoning)
			if p.Tool != nil {
				res.calls = append(res.calls, *p.Tool)
			}
		}
	}
	// flush sends what the parser released and the pending tokens.
	flush := func(ps []piece) error {
		collect(ps)
		if emit == nil {
			pendTok, pendLp, pendTop = nil, nil, nil
			return nil
		}
		var chunks []chunkChoiceJSON
		for _, p := range ps {
			c := chunkChoiceJSON{Index: idx}
			switch {
			case p.Tool != nil:
				tc := g.toolCallJSON(*p.Tool, toolSeen)
				toolSeen++
				c.Delta.ToolCalls = []toolCallJSON{tc}
			case p.Reasoning != "":
				c.Delta.ReasoningContent = &p.Reasoning
			default:
				c.Delta.Content = &p.Content
			}
			chunks = append(chunks, c)
		}
		if len(pendTok) > 0 && (g.req.Logprobs || g.req.ReturnTokenIDs) && len(chunks) == 0 {
			chunks = append(chunks, chunkChoiceJSON{Index: idx})
		}
		if len(chunks) > 0 {
			if g.req.Logprobs {
				chunks[0].Logprobs = g.logprobsJSON(pendTok, pendLp, pendTop)
			}
			if g.req.ReturnTokenIDs {
				chunks[0].TokenIDs = pendTok
			}
		}
		pendTok, pendLp, pendTop = nil, nil, nil
		for _, c := range chunks {
			if err := emit(c); err != nil {
				return err
			}
		}
		return nil
	}
	// release passes stop-cleared text through the UTF-8 and tag stages.
	release := func(text string, final bool) error {
		partial += text
		n := len(partial)
		if !final {
			n = completeUTF8(partial)
		}
		ps := parser.Push(partial[:n])
		partial = partial[n:]
		if final {
			ps = append(ps, parser.Finish()...)
		}
		return flush(ps)
	}
	if emit != nil {
		empty := ""
		if err := emit(chunkChoiceJSON{Index: idx, Delta: deltaJSON{Role: core.RoleAssistant, Content: &empty}}); err != nil {
			return nil, err
		}
	}
	var stopIDs []int
	for id := range g.s.stops {
		stopIDs = append(stopIDs, id)
	}
	opts := engine.GenOptions{
		MaxTokens: g.maxTokens, Temperature: g.req.Temperature, Seed: seed, Stop: stopIDs,
		TopLogprobs: g.req.TopLogprobs,
		OnTop: func(ids []int, lps []float32) error {
			curTop = make([]alt, len(ids))
			for i := range ids {
				curTop[i] = alt{ids[i], lps[i]}
			}
			return nil
		},
		OnToken: func(id int, lp float32) error {
			res.tokens = append(res.tokens, id)
			res.logprobs = append(res.logprobs, lp)
			pendTok = append(pendTok, id)
			pendLp = append(pendLp, lp)
			if g.req.TopLogprobs > 0 {
				res.tops = append(res.tops, curTop)
				pendTop = append(pendTop, curTop)
			}
			if !g.s.stops[id] && !tok.IsSpecial(id) {
				held += tok.Decode([]int{id})
			}
			cut, keep := scanStops(held, g.req.Stop)
			if cut >= 0 {
				text := held[:cut]
				held, stopped = "", true
				if err := release(text, false); err != nil {
					return err
				}
				return errStopString
			}
			text := held[:len(held)-keep]
			held = held[len(held)-keep:]
			return release(text, false)
		},
	}
	if g.req.TopP < 1 {
		opts.TopP = g.req.TopP
	}
	_, _, err := g.eng.Generate(ctx, g.prompt, opts)
	if err != nil && !errors.Is(err, errStopString) {
		return nil, err
	}
	if err := release(held, true); err != nil {
		return nil, err
	}
	switch last := len(res.tokens) - 1; {
	case stopped, last >= 0 && g.s.stops[res.tokens[last]]:
		res.finish = "stop"
	default:
		res.finish = "length"
	}
	if len(res.calls) > 0 && res.finish == "stop" {
		res.finish = "tool_calls"
	}
	if emit != nil {
		if err := emit(chunkChoiceJSON{Index: idx, FinishReason: &res.finish}); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// scanStops finds the earliest stop string in text: cut is its offset (-1
// if none), keep the length of the longest suffix of text that may still
// begin one.
func scanStops(text string, stops []string) (cut, keep int) {
	cut = -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
		keep = max(keep, holdBack(text, s))
	}
	return cut, keep
}

// completeUTF8 returns the length of s without a trailing incomplete UTF-8
// sequence (which the next token may complete).
func completeUTF8(s string) int {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if !utf8.RuneStart(s[i]) {
			continue
		}
		if !utf8.FullRuneInString(s[i:]) {
			return i
		}
		break
	}
	return len(s)
}

// logprobsJSON renders the tokens' log-probs; tops, if not nil, holds each
// token's most likely alternatives.
func (g *generation) logprobsJSON(ids []int, lps []float32, tops [][]alt) *logprobsJSON {
	out := &logprobsJSON{Content: make([]logprobEntry, len(ids))}
	for i, id := range ids {
		b := g.tokenBytes(id)
		e := logprobEntry{Token: b, Logprob: float64(lps[i]), Bytes: bytesOf(b), TopLogprobs: []topEntry{}}
		if i < len(tops) {
			for _, a := range tops[i] {
				t := g.tokenBytes(a.id)
				e.TopLogprobs = append(e.TopLogprobs, topEntry{Token: t, Logprob: float64(a.lp), Bytes: bytesOf(t)})
			}
		}
		out.Content[i] = e
	}
	return out
}

func (g *generation) tokenBytes(id int) string { return g.s.cfg.Tokenizer.Decode([]int{id}) }

// bytesOf lists s's bytes, as OpenAI's logprobs do.
func bytesOf(s string) []int {
	b := make([]int, len(s))
	for j := range len(s) {
		b[j] = int(s[j])
	}
	return b
}

func (g *generation) toolCallJSON(tc core.ToolCall, index int) toolCallJSON {
	j := toolCallJSON{ID: g.s.newID("call_"), Type: "function"}
	j.Index = &index
	j.Function.Name, j.Function.Arguments = tc.Name, tc.Arguments
	return j
}

func (g *generation) usage(res []*choiceResult) usageJSON {
	u := usageJSON{PromptTokens: len(g.prompt)}
	for _, r := range res {
		u.CompletionTokens += len(r.tokens)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// completion builds the non-streaming response.
func (g *generation) completion(res []*choiceResult) completionJSON {
	out := completionJSON{ID: g.id, Object: "chat.completion", Created: g.created, Model: g.s.cfg.ModelName, Usage: g.usage(res)}
	if g.req.ReturnTokenIDs {
		out.PromptTokenIDs = g.prompt
	}
	for i, r := range res {
		c := choiceJSON{Index: i, FinishReason: r.finish}
		c.Message.Role = core.RoleAssistant
		content := r.content.String()
		if content != "" || len(r.calls) == 0 {
			c.Message.Content = &content
		}
		if rs := r.reasoning.String(); rs != "" {
			c.Message.ReasoningContent = &rs
		}
		for k, tc := range r.calls {
			j := g.toolCallJSON(tc, k)
			j.Index = nil
			c.Message.ToolCalls = append(c.Message.ToolCalls, j)
		}
		if g.req.Logprobs {
			c.Logprobs = g.logprobsJSON(r.tokens, r.logprobs, r.tops)
		}
		if g.req.ReturnTokenIDs {
			c.TokenIDs = r.tokens
			if c.TokenIDs == nil {
				c.TokenIDs = []int{}
			}
		}
		out.Choices = append(out.Choices, c)
	}
	return out
}

// stream serves the request as server-sent events.
func (g *generation) stream(ctx context.Context, w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	first := true
	write := func(c chunkJSON) error {
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	chunk := func(cs ...chunkChoiceJSON) chunkJSON {
		return chunkJSON{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.s.cfg.ModelName, Choices: cs}
	}
	emit := func(c chunkChoiceJSON) error {
		ch := chunk(c)
		mu.Lock()
		if first && g.req.ReturnTokenIDs {
			ch.PromptTokenIDs = g.prompt
		}
		first = false
		mu.Unlock()
		return write(ch)
	}
	res, err := g.runAll(ctx, emit)
	if err != nil {
		if ctx.Err() != nil {
			return // the client left
		}
		g.s.log.Warn("stream failed", "id", g.id, "err", err)
		b, _ := json.Marshal(errorBody("server_error", "", err.Error(), ""))
		mu.Lock()
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
		rc.Flush()
		mu.Unlock()
		return
	}
	if g.req.IncludeUsage {
		u := g.usage(res)
		c := chunk()
		c.Choices = []chunkChoiceJSON{}
		c.Usage = &u
		if write(c) != nil {
			return
		}
	}
	mu.Lock()
	fmt.Fprint(w, "data: [DONE]\n\n")
	rc.Flush()
	mu.Unlock()
}
