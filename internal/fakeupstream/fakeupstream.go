// Package fakeupstream is a scripted LLM server for tests and benchmarks. It
// answers the OpenAI chat completions, OpenAI Responses and Anthropic
// Messages APIs (streaming and not) and /v1/models with replies taken from a
// Script, and remembers every request it received so a test can check what a
// proxy forwarded.
//
// It owns nothing else: no model, no tokenizer. Replies are deterministic: the
// same script and the same requests give the same bytes (ids included), so a
// response seen directly can be compared with one seen through the gateway.
package fakeupstream

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// ToolCall is a tool call the scripted assistant makes. Arguments is JSON text.
type ToolCall struct {
	ID        string // default "call_<n>_<i>"
	Name      string
	Arguments string // default "{}"
}

// Turn is one scripted reply.
type Turn struct {
	Text      string     // assistant text; split into Script.Chunks pieces when streamed
	Reasoning string     // optional reasoning text (chat: reasoning_content; Anthropic: a thinking block)
	ToolCalls []ToolCall // tool calls after the text (parallel when several)
	// FinishReason overrides the finish reason (chat naming: "stop",
	// "tool_calls", "length"); default: "tool_calls" with tool calls, else "stop".
	FinishReason string
	// Status, when non-zero and not 200, answers with this HTTP status and
	// ErrorBody (default: an OpenAI-style error JSON) instead of a reply.
	Status    int
	ErrorBody string
	// StreamErrorAfter > 0 sends an error event after that many text chunks
	// and ends the stream without its terminal event.
	StreamErrorAfter int
	// DoneAfterError sends a chat stream's "data: [DONE]" after that error
	// event, as vLLM does.
	DoneAfterError bool
	// NoDone ends a chat stream after its finish reasons (and usage) with
	// no "data: [DONE]", as some OpenAI-compatible servers do.
	NoDone bool
	// HoldAfter > 0 makes a stream wait, after that many text chunks, until
	// Script.Hold is closed (or yields a value) or the client goes away.
	HoldAfter int
	// CutAfter > 0 breaks a stream after that many text chunks: the
	// connection is dropped mid-body, as when the model server dies.
	CutAfter int
}

// Script says how the server answers.
type Script struct {
	Model string // model name used when the request names none; default "fake-model"
	// Turns are used in order, one per POST to a model route, cycling; empty
	// means one turn with the text "Hello from the fake upstream."
	Turns []Turn
	// Respond, if set, chooses the turn instead of Turns; n counts model
	// calls from 0.
	Respond func(n int, r Request) Turn
	// Chunks is how many pieces a text is streamed in (default 3).
	Chunks int
	// ChunkDelay is slept before each streamed text chunk (default none).
	ChunkDelay time.Duration
	// OllamaToolIndex streams every tool call whole at index 0, as Ollama
	// does, instead of by distinct index with arguments split in two.
	OllamaToolIndex bool
	// PromptTokens is the reported prompt token count (default 10).
	PromptTokens int
	// VLLM writes non-streaming chat replies as vLLM does: "token_ids" per
	// choice and "prompt_token_ids" always present, null unless asked for;
	// and Responses output_text parts as vLLM does: "logprobs" null unless
	// asked for (OpenAI writes []), and never any in the streamed done part
	// and item.
	VLLM bool
	// Hold releases streams waiting after Turn.HoldAfter chunks.
	Hold <-chan struct{}
	// Forget keeps no record of requests (Requests returns none): for
	// benchmarks, whose requests would pile up in memory.
	Forget bool
}

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Server is the scripted upstream. It is an http.Handler; Run serves it on a
// listener.
type Server struct {
	script Script

	mu       sync.Mutex
	reqs     []Request
	calls    int
	canceled int
}

// New returns a server answering by s.
func New(s Script) *Server {
	if s.Model == "" {
		s.Model = "fake-model"
	}
	if s.Chunks <= 0 {
		s.Chunks = 3
	}
	if s.PromptTokens <= 0 {
		s.PromptTokens = 10
	}
	return &Server{script: s}
}

// Requests returns copies of the requests received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Canceled counts streams that ended because the client went away.
func (s *Server) Canceled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.canceled
}

// Run serves on ln until ctx is done, then closes the server.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		srv.Close()
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	rec := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header, Body: body}
	if !s.script.Forget {
		rec.Header = r.Header.Clone()
		s.mu.Lock()
		s.reqs = append(s.reqs, rec)
		s.mu.Unlock()
	}

	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		writeJSON(w, http.StatusOK, map[string]any{
			"object": "list",
			"data":   []any{map[string]any{"id": s.script.Model, "object": "model", "created": 0, "owned_by": "fakeupstream"}},
		})
		return
	case r.Method == http.MethodPost && (r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/messages" || r.URL.Path == "/v1/responses"):
	default:
		writeJSON(w, http.StatusNotFound, errObj("not_found", "no route "+r.Method+" "+r.URL.Path))
		return
	}

	var p params
	if err := json.Unmarshal(body, &p); err != nil {
		writeJSON(w, http.StatusBadRequest, errObj("invalid_request_error", "bad JSON: "+err.Error()))
		return
	}
	if p.Model == "" {
		p.Model = s.script.Model
	}
	if p.N <= 0 {
		p.N = 1
	}
	s.mu.Lock()
	n := s.calls
	s.calls++
	s.mu.Unlock()
	t := s.turn(n, rec)
	if t.Status != 0 && t.Status != http.StatusOK {
		b := t.ErrorBody
		if b == "" {
			b = string(mustJSON(errObj("server_error", "scripted failure")))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(t.Status)
		io.WriteString(w, b)
		return
	}
	c := &call{s: s, t: t, p: p, n: n, r: r, w: w}
	switch r.URL.Path {
	case "/v1/chat/completions":
		c.chat()
	case "/v1/messages":
		c.messages()
	case "/v1/responses":
		c.responses()
	}
}

func (s *Server) turn(n int, r Request) Turn {
	if s.script.Respond != nil {
		return s.script.Respond(n, r)
	}
	if len(s.script.Turns) == 0 {
		return Turn{Text: "Hello from the fake upstream."}
	}
	return s.script.Turns[n%len(s.script.Turns)]
}

// params is what the server reads from any of the three request shapes.
type params struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	N             int    `json:"n"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs       bool            `json:"logprobs"`
	ReturnTokenIDs bool            `json:"return_token_ids"`
	Include        json.RawMessage `json:"include"` // Responses
}

func errObj(typ, msg string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ}}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only maps of plain values are marshaled here
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(mustJSON(v))
}

// SplitText cuts s into at most n non-empty pieces of about equal length,
// on rune boundaries. The pieces concatenate to s.
func SplitText(s string, n int) []string {
	if s == "" {
		return nil
	}
	r := []rune(s)
	if n > len(r) {
		n = len(r)
	}
	if n <= 1 {
		return []string{s}
	}
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		a, b := i*len(r)/n, (i+1)*len(r)/n
		out = append(out, string(r[a:b]))
	}
	return out
}

// call is one model call being answered.
type call struct {
	s *Server
	t Turn
	p params
	n int
	r *http.Request
	w http.ResponseWriter
}

func (c *call) toolCall(i int) ToolCall {
	tc := c.t.ToolCalls[i]
	if tc.ID == "" {
		tc.ID = "call_" + itoa(c.n) + "_" + itoa(i)
	}
	if tc.Arguments == "" {
		tc.Arguments = "{}"
	}
	return tc
}

func (c *call) finish() string {
	if c.t.FinishReason != "" {
		return c.t.FinishReason
	}
	if len(c.t.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

// textFor is choice i's text: the turn's text, with " (i)" appended for
// choices after the first so n>1 choices differ.
func (c *call) textFor(i int) string {
	if i == 0 || c.t.Text == "" {
		return c.t.Text
	}
	return c.t.Text + " (" + itoa(i) + ")"
}

func (c *call) completionTokens() int {
	return len(SplitText(c.t.Text, c.s.script.Chunks)) + len(c.t.ToolCalls)
}

// sse starts a streamed reply.
func (c *call) sseStart() http.Flusher {
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	c.w.WriteHeader(http.StatusOK)
	f, _ := c.w.(http.Flusher)
	if f != nil {
		f.Flush()
	}
	return f
}

// send writes one event; it reports false when the client has gone.
func (c *call) send(f http.Flusher, event string, data []byte) bool {
	var b []byte
	if event != "" {
		b = append(b, "event: "...)
		b = append(b, event...)
		b = append(b, '\n')
	}
	b = append(b, "data: "...)
	b = append(b, data...)
	b = append(b, "\n\n"...)
	if _, err := c.w.Write(b); err != nil {
		c.gone()
		return false
	}
	if f != nil {
		f.Flush()
	}
	if c.r.Context().Err() != nil {
		c.gone()
		return false
	}
	return true
}

func (c *call) gone() {
	c.s.mu.Lock()
	c.s.canceled++
	c.s.mu.Unlock()
}

// beforeChunk runs before text chunk k (0-based) is sent: the delay, the
// hold. It reports false when the client went away meanwhile.
func (c *call) beforeChunk(k int) bool {
	ctx := c.r.Context()
	if c.t.CutAfter > 0 && k == c.t.CutAfter {
		panic(http.ErrAbortHandler)
	}
	if c.t.HoldAfter > 0 && k == c.t.HoldAfter && c.s.script.Hold != nil {
		select {
		case <-c.s.script.Hold:
		case <-ctx.Done():
			c.gone()
			return false
		}
	}
	if d := c.s.script.ChunkDelay; d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			c.gone()
			return false
		}
	}
	return true
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	neg := i < 0
	if neg {
		i = -i
	}
	var b [20]byte
	p := len(b)
	for i > 0 {
		p--
		b[p] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		p--
		b[p] = '-'
	}
	return string(b[p:])
}

// tokenLogprob is the deterministic log-probability of the k-th piece.
func tokenLogprob(k int) float64 { return -0.125 * float64(k%8+1) }

// tokenID is the deterministic token id of the k-th piece.
func tokenID(k int) int { return 1000 + k }

// promptTokenIDs are the deterministic prompt token ids.
func (c *call) promptTokenIDs() []int {
	ids := make([]int, c.s.script.PromptTokens)
	for i := range ids {
		ids[i] = 100 + i
	}
	return ids
}
