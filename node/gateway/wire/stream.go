package wire

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/sse"
)

// maxChoices bounds how many distinct choice indices and tool calls a stream
// may open, so a hostile upstream cannot make the accumulator grow without
// bound beyond the bytes it sends.
const maxChoices = 1024

// Stream accumulates a streaming (server-sent events) response. It is a
// pure state machine: feed it every upstream event in order with Event,
// forward what Event returns, and read Response at the end. It is not safe
// for concurrent use.
type Stream struct {
	api  core.APIKind
	add  added
	n    int // choices asked for (chat)
	done bool
	resp core.Response
	// produced: some of the reply itself (text, reasoning, a tool call) has
	// arrived.
	produced bool

	chat     []*chatAcc // by first appearance; looked up by index
	blocks   []*blockAcc
	items    []*itemAcc
	final    *core.Response // Responses: the full response from response.completed
	stopped  string         // Anthropic: stop_reason
	outTotal int            // Anthropic: output tokens from message_delta
}

// NewStream returns an accumulator for a streaming response to req, sent
// upstream with UpstreamBody(req, body, caps).
func NewStream(req *Request, caps Caps) *Stream {
	s := &Stream{api: core.APIChat, add: addedFor(req, caps), n: 1}
	if req != nil {
		s.api = req.API
		s.n = max(req.N, 1)
	}
	return s
}

// End tells the stream that the upstream body ended cleanly, and reports
// Done. Some OpenAI-compatible servers end a chat stream without [DONE]:
// one whose every asked-for choice has finished (a finish_reason seen) is
// then complete all the same. A chat stream with a choice still unfinished,
// or any other API's stream without its terminal event, stays incomplete.
func (s *Stream) End() bool {
	if s.done || s.api != core.APIChat || len(s.chat) < s.n {
		return s.done
	}
	for _, c := range s.chat {
		if c.finish == "" {
			return false
		}
	}
	s.done = true
	return true
}

// Done reports whether the terminal event was seen: [DONE], message_stop,
// response.completed / incomplete / failed, or an error.
func (s *Stream) Done() bool { return s.done }

// Produced reports whether some of the reply itself has arrived: text,
// reasoning or a tool call, as opposed to the events that announce a reply
// (a role-only first chunk, message_start, response.created) and carry no
// token of it. The event that makes it true marks the time to first token.
func (s *Stream) Produced() bool { return s.produced }

// Event takes one upstream event and returns the bytes to forward to the
// client: ev.Raw itself when nothing needs stripping (the common case, no
// copy), a rewritten event when fields the gateway added must be removed,
// or nil to drop the event (a usage-only chunk the client did not ask for).
// An error object arriving mid-stream is forwarded verbatim and recorded.
//
// An event that cannot be understood yields ev.Raw and an error wrapping
// ErrBadResponse; the stream goes on.
func (s *Stream) Event(ev sse.Event) ([]byte, error) {
	data := trimJSON(ev.Data)
	if len(data) == 0 {
		return ev.Raw, nil // comment, keep-alive, blank line
	}
	switch s.api {
	case core.APIMessages:
		return ev.Raw, s.messagesEvent(ev.Name, data)
	case core.APIResponses:
		return s.responsesEvent(&ev, data)
	}
	return s.chatEvent(&ev, data)
}

// Response returns what was accumulated so far. On a stream cut before its
// terminal event, choices that carried log-probs have Fidelity partial.
// Status is left for the caller to set.
func (s *Stream) Response() core.Response {
	var r core.Response
	switch s.api {
	case core.APIMessages:
		r = s.messagesResponse()
	case core.APIResponses:
		r = s.responsesResponse()
	default:
		r = s.chatResponse()
	}
	if !s.done {
		for i := range r.Choices {
			if r.Choices[i].Fidelity != core.FidelityNone {
				r.Choices[i].Fidelity = core.FidelityPartial
			}
		}
	}
	return r
}

func (s *Stream) setError(raw []byte) {
	s.resp.Error = append(json.RawMessage(nil), raw...)
	s.done = true
}

// --- chat completions ---

type chatAcc struct {
	index     int
	content   strings.Builder
	reasoning strings.Builder
	calls     []core.ToolCall
	args      [][]byte
	last      map[int]int // tool-call index → position in calls of its latest call
	finish    string
	lps       []logprobJSON
	ids       []int
	logprobs  bool
}

type chatChunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Object  string `json:"object"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        json.RawMessage `json:"reasoning"`
			ToolCalls        []struct {
				Index    *int         `json:"index"`
				ID       string       `json:"id"`
				Type     string       `json:"type"`
				Function chatFunction `json:"function"`
			} `json:"tool_calls"`
			FunctionCall *chatFunction `json:"function_call"`
		} `json:"delta"`
		FinishReason *string       `json:"finish_reason"`
		Logprobs     *chatLogprobs `json:"logprobs"`
		TokenIDs     []int         `json:"token_ids"`
	} `json:"choices"`
	Usage          *usageJSON      `json:"usage"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
	Error          json.RawMessage `json:"error"`
}

var doneData = []byte("[DONE]")

func (s *Stream) chatEvent(ev *sse.Event, data []byte) ([]byte, error) {
	if bytes.Equal(data, doneData) {
		s.done = true
		return ev.Raw, nil
	}
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return ev.Raw, badResponse("chat chunk: %v", err)
	}
	if e := trimJSON(c.Error); len(e) > 0 && string(e) != "null" {
		s.setError(e)
		return ev.Raw, nil
	}
	if c.Object == "error" || ev.Name == "error" {
		s.setError(data)
		return ev.Raw, nil
	}
	if s.resp.ID == "" {
		s.resp.ID = c.ID
	}
	if s.resp.Model == "" {
		s.resp.Model = c.Model
	}
	if c.Usage != nil {
		s.resp.Usage = c.Usage.core()
	}
	if c.PromptTokenIDs != nil {
		s.resp.PromptTokenIDs = c.PromptTokenIDs
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		acc := s.chatChoice(ch.Index)
		if acc == nil {
			return ev.Raw, badResponse("chat chunk: more than %d choices", maxChoices)
		}
		d := &ch.Delta
		n := acc.content.Len() + acc.reasoning.Len()
		if d.Content != nil {
			acc.content.WriteString(*d.Content)
		}
		if d.ReasoningContent != nil {
			acc.reasoning.WriteString(*d.ReasoningContent)
		} else if len(d.Reasoning) > 0 {
			acc.reasoning.WriteString(stringOf(d.Reasoning))
		}
		if acc.content.Len()+acc.reasoning.Len() > n || len(d.ToolCalls) > 0 || d.FunctionCall != nil {
			s.produced = true
		}
		for _, tc := range d.ToolCalls {
			idx := len(acc.calls) // no index: a call of its own
			if tc.Index != nil {
				idx = *tc.Index
			}
			if !acc.toolDelta(idx, tc.ID, tc.Type, tc.Function) {
				return ev.Raw, badResponse("chat chunk: more than %d tool calls", maxChoices)
			}
		}
		if fc := d.FunctionCall; fc != nil {
			acc.toolDelta(-1, "", "function", *fc)
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			acc.finish = *ch.FinishReason
		}
		if ch.Logprobs != nil {
			acc.logprobs = true
			acc.lps = append(acc.lps, ch.Logprobs.Content...)
		}
		acc.ids = append(acc.ids, ch.TokenIDs...)
	}
	if !s.add.any() {
		return ev.Raw, nil
	}
	if s.add.usage && len(c.Choices) == 0 && c.Usage != nil {
		return nil, nil // the usage-only chunk the client did not ask for
	}
	out, err := stripChat(data, s.add, true)
	if err != nil {
		return ev.Raw, badResponse("chat chunk: %v", err)
	}
	if len(out) == len(data) && bytes.Equal(out, data) {
		return ev.Raw, nil
	}
	return ev.WithData(out), nil
}

// chatChoice returns the accumulator of choice index, or nil when too many
// choices were opened.
func (s *Stream) chatChoice(index int) *chatAcc {
	for _, a := range s.chat {
		if a.index == index {
			return a
		}
	}
	if len(s.chat) >= maxChoices {
		return nil
	}
	a := &chatAcc{index: index}
	s.chat = append(s.chat, a)
	return a
}

// toolDelta adds one tool-call delta. A delta continues the latest call at
// its index, unless it carries an id that call does not have: then it
// continues the call with that id, or starts a new one (Ollama sends
// parallel calls all at index 0, each with its own id).
func (a *chatAcc) toolDelta(index int, id, typ string, fn chatFunction) bool {
	pos := -1
	if p, ok := a.last[index]; ok && index >= 0 {
		pos = p
		if id != "" && a.calls[p].ID != "" && a.calls[p].ID != id {
			pos = -1
			for i := range a.calls {
				if a.calls[i].ID == id {
					pos = i
					break
				}
			}
		}
	}
	if pos < 0 && index < 0 && len(a.calls) > 0 {
		pos = len(a.calls) - 1 // legacy function_call: one call
	}
	if pos < 0 {
		if len(a.calls) >= maxChoices {
			return false
		}
		a.calls = append(a.calls, core.ToolCall{Type: "function"})
		a.args = append(a.args, nil)
		pos = len(a.calls) - 1
	}
	if a.last == nil {
		a.last = make(map[int]int)
	}
	a.last[index] = pos
	c := &a.calls[pos]
	if id != "" && c.ID == "" {
		c.ID = id
	}
	if typ != "" {
		c.Type = typ
	}
	if fn.Name != "" && c.Name == "" {
		c.Name = fn.Name
	}
	if args := trimJSON(fn.Arguments); len(args) > 0 && string(args) != "null" {
		if args[0] == '"' {
			a.args[pos] = append(a.args[pos], stringOf(args)...)
		} else {
			a.args[pos] = append(a.args[pos], args...)
		}
	}
	return true
}

func (s *Stream) chatResponse() core.Response {
	r := s.resp
	r.Choices = nil
	accs := append([]*chatAcc(nil), s.chat...)
	sort.SliceStable(accs, func(i, j int) bool { return accs[i].index < accs[j].index })
	for _, a := range accs {
		msg := core.Message{Role: core.RoleAssistant, Content: a.content.String(), Reasoning: a.reasoning.String()}
		for i, c := range a.calls {
			c.Arguments = string(a.args[i])
			msg.ToolCalls = append(msg.ToolCalls, c)
		}
		ch := core.Choice{Index: a.index, Message: msg, FinishReason: a.finish}
		if a.logprobs {
			ch.Tokens, ch.Fidelity = tokensOf(a.lps, a.ids)
		}
		r.Choices = append(r.Choices, ch)
	}
	return r
}

// --- Anthropic messages ---

type blockAcc struct {
	index    int
	typ      string
	text     strings.Builder
	id, name string
	input    []byte // partial_json deltas
	start    json.RawMessage
	deltas   bool
	raw      json.RawMessage // content_block of other types, kept as a part
}

type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string     `json:"id"`
		Model string     `json:"model"`
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
	Index        int             `json:"index"`
	ContentBlock json.RawMessage `json:"content_block"`
	Delta        *struct {
		Type        string  `json:"type"`
		Text        *string `json:"text"`
		Thinking    *string `json:"thinking"`
		PartialJSON *string `json:"partial_json"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	Usage *usageJSON      `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (s *Stream) messagesEvent(name string, data []byte) error {
	var e messagesEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return badResponse("messages event: %v", err)
	}
	typ := e.Type
	if typ == "" {
		typ = name
	}
	switch typ {
	case "message_start":
		if m := e.Message; m != nil {
			s.resp.ID, s.resp.Model = m.ID, m.Model
			if m.Usage != nil {
				s.resp.Usage = m.Usage.core()
			}
		}
	case "content_block_start":
		var b anthropicBlock
		if err := json.Unmarshal(e.ContentBlock, &b); err != nil {
			return badResponse("content_block_start: %v", err)
		}
		acc := s.block(e.Index)
		if acc == nil {
			return badResponse("messages event: more than %d blocks", maxChoices)
		}
		acc.typ, acc.id, acc.name = b.Type, b.ID, b.Name
		acc.start = rawOrNil(b.Input)
		switch {
		case b.Text != nil:
			acc.text.WriteString(*b.Text)
		case b.Thinking != nil:
			acc.text.WriteString(*b.Thinking)
		}
		if acc.text.Len() > 0 || (b.Type != "text" && b.Type != "thinking") {
			s.produced = true // text at once, or a tool call (or other block) begun
		}
		if b.Type != "text" && b.Type != "thinking" && b.Type != "tool_use" {
			acc.raw = rawOrNil(e.ContentBlock)
		}
	case "content_block_delta":
		acc := s.block(e.Index)
		if acc == nil {
			return badResponse("messages event: more than %d blocks", maxChoices)
		}
		if d := e.Delta; d != nil {
			switch {
			case d.Text != nil:
				acc.text.WriteString(*d.Text)
				s.produced = s.produced || *d.Text != ""
			case d.Thinking != nil:
				acc.text.WriteString(*d.Thinking)
				s.produced = s.produced || *d.Thinking != ""
			case d.PartialJSON != nil:
				acc.input = append(acc.input, *d.PartialJSON...)
				acc.deltas = true
				s.produced = true
			}
		}
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != nil {
			s.stopped = *e.Delta.StopReason
		}
		if u := e.Usage; u != nil {
			if s.resp.Usage == nil {
				s.resp.Usage = &core.Usage{}
			}
			if u.OutputTokens > 0 {
				s.outTotal = u.OutputTokens
			}
			if in := u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens; in > 0 {
				s.resp.Usage.PromptTokens = in
			}
		}
	case "message_stop":
		s.done = true
	case "error":
		if err := trimJSON(e.Error); len(err) > 0 && string(err) != "null" {
			s.setError(err)
		} else {
			s.setError(data)
		}
	}
	return nil
}

func (s *Stream) block(index int) *blockAcc {
	for _, b := range s.blocks {
		if b.index == index {
			return b
		}
	}
	if len(s.blocks) >= maxChoices {
		return nil
	}
	b := &blockAcc{index: index}
	s.blocks = append(s.blocks, b)
	return b
}

func (s *Stream) messagesResponse() core.Response {
	r := s.resp
	if r.Usage != nil {
		u := *r.Usage
		if s.outTotal > 0 {
			u.CompletionTokens = s.outTotal
		}
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
		r.Usage = &u
	}
	if len(s.blocks) == 0 && s.stopped == "" {
		return r
	}
	blocks := append([]*blockAcc(nil), s.blocks...)
	sort.SliceStable(blocks, func(i, j int) bool { return blocks[i].index < blocks[j].index })
	msg := core.Message{Role: core.RoleAssistant}
	var text strings.Builder
	for _, b := range blocks {
		switch b.typ {
		case "text":
			text.WriteString(b.text.String())
		case "thinking":
			msg.Reasoning += b.text.String()
		case "tool_use":
			args := string(b.input)
			if !b.deltas {
				args = string(b.start)
			}
			msg.ToolCalls = append(msg.ToolCalls, core.ToolCall{ID: b.id, Type: "function", Name: b.name, Arguments: args})
		default:
			if b.raw != nil {
				msg.Parts = append(msg.Parts, core.Part{Type: b.typ, Raw: b.raw})
			}
		}
	}
	msg.Content = text.String()
	r.Choices = []core.Choice{{Message: msg, FinishReason: anthropicFinish(s.stopped)}}
	return r
}

// --- OpenAI Responses ---

type itemAcc struct {
	index int
	item  responsesOutputItem
	raw   json.RawMessage // the item as last given whole (added or done)
	text  strings.Builder // message text, reasoning text or arguments
	done  bool            // the item came whole in output_item.done
	lps   []logprobJSON
}

type responsesEvent struct {
	Type        string          `json:"type"`
	Response    json.RawMessage `json:"response"`
	OutputIndex int             `json:"output_index"`
	Item        json.RawMessage `json:"item"`
	Delta       json.RawMessage `json:"delta"`
	Arguments   *string         `json:"arguments"`
	Logprobs    []logprobJSON   `json:"logprobs"`
}

// responsesEvent records one Responses event and returns what to forward:
// ev.Raw, or the event without the log-probs the gateway asked for and the
// client did not. An event that cannot be understood (a response.completed
// whose output does not parse, say) goes as it came, log-probs and all.
func (s *Stream) responsesEvent(ev *sse.Event, data []byte) ([]byte, error) {
	var e responsesEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return ev.Raw, badResponse("responses event: %v", err)
	}
	typ := e.Type
	if typ == "" {
		typ = ev.Name
	}
	if err := s.recordResponses(typ, &e, data); err != nil || !s.add.logprobs {
		return ev.Raw, err
	}
	rs := responsesStrip{add: s.add}
	rs.event(data, typ)
	if rs.err != nil {
		return ev.Raw, badResponse("%s: %v", typ, rs.err)
	}
	if len(rs.edits) == 0 {
		return ev.Raw, nil
	}
	return ev.WithData(apply(data, rs.edits)), nil
}

// recordResponses takes what one Responses event, of type typ, says.
func (s *Stream) recordResponses(typ string, e *responsesEvent, data []byte) error {
	switch typ {
	case "response.created", "response.in_progress", "response.queued":
		var r struct {
			ID    string `json:"id"`
			Model string `json:"model"`
		}
		if json.Unmarshal(e.Response, &r) == nil {
			s.resp.ID, s.resp.Model = r.ID, r.Model
		}
	case "response.output_item.added", "response.output_item.done":
		acc := s.item(e.OutputIndex)
		if acc == nil {
			return badResponse("responses event: more than %d items", maxChoices)
		}
		var it responsesOutputItem
		if err := json.Unmarshal(e.Item, &it); err != nil {
			return badResponse("%s: %v", typ, err)
		}
		acc.item, acc.raw = it, rawOrNil(e.Item)
		if typ == "response.output_item.done" {
			acc.done = true
			s.produced = true // an item whole, deltas or not
		} else if it.Type != "message" && it.Type != "reasoning" {
			s.produced = true // a tool call begun
		}
	case "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta",
		"response.custom_tool_call_input.delta", "response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		acc := s.item(e.OutputIndex)
		if acc == nil {
			return badResponse("responses event: more than %d items", maxChoices)
		}
		n := acc.text.Len()
		acc.text.WriteString(stringOf(e.Delta))
		acc.lps = append(acc.lps, e.Logprobs...)
		s.produced = s.produced || acc.text.Len() > n
	case "response.function_call_arguments.done":
		acc := s.item(e.OutputIndex)
		if acc != nil && e.Arguments != nil {
			acc.text.Reset()
			acc.text.WriteString(*e.Arguments)
		}
	case "response.completed", "response.incomplete", "response.failed":
		s.done = true
		r, err := responsesResponseToCore(trimJSON(e.Response))
		if err != nil {
			return err
		}
		s.final = &r
		if r.Error != nil {
			s.resp.Error = r.Error
		}
	case "error":
		s.setError(data)
	}
	return nil
}

func (s *Stream) item(index int) *itemAcc {
	for _, it := range s.items {
		if it.index == index {
			return it
		}
	}
	if len(s.items) >= maxChoices {
		return nil
	}
	it := &itemAcc{index: index}
	s.items = append(s.items, it)
	return it
}

func (s *Stream) responsesResponse() core.Response {
	if s.final != nil && (len(s.final.Choices) > 0 && !emptyChoice(s.final.Choices[0]) || len(s.items) == 0) {
		r := *s.final
		if r.Error == nil {
			r.Error = s.resp.Error
		}
		if r.ID == "" {
			r.ID = s.resp.ID
		}
		if r.Model == "" {
			r.Model = s.resp.Model
		}
		// The deltas' log-probs are those of the tokens the client saw
		// streamed; they win over the full response's, which a server may
		// give only in part (vLLM builds it from its last engine output).
		if lps := s.deltaLogprobs(); len(lps) > 0 && len(r.Choices) > 0 {
			r.Choices = append([]core.Choice(nil), r.Choices...)
			r.Choices[0].Tokens, r.Choices[0].Fidelity = tokensOf(lps, nil)
		}
		return r
	}
	// No full response (cut off, or it came without output): rebuild from
	// the items and deltas seen.
	r := s.resp
	if s.final != nil && s.final.Usage != nil {
		r.Usage = s.final.Usage
	}
	if len(s.items) == 0 {
		return r
	}
	accs := append([]*itemAcc(nil), s.items...)
	sort.SliceStable(accs, func(i, j int) bool { return accs[i].index < accs[j].index })
	items := make([]responsesOutputItem, len(accs))
	raws := make([]json.RawMessage, len(accs))
	var lps []logprobJSON
	for i, a := range accs {
		it := a.item
		raws[i] = a.raw
		lps = append(lps, a.lps...)
		if !a.done {
			// Only deltas: put what they carried in the item's place.
			t := a.text.String()
			switch it.Type {
			case "function_call":
				it.Arguments, _ = json.Marshal(t)
			case "custom_tool_call":
				it.Input, _ = json.Marshal(t)
			case "reasoning":
				it.Summary = append(it.Summary[:0], struct {
					Text string `json:"text"`
				}{t})
				it.Content = nil
			case "message", "":
				it.Type = "message"
				it.Content = append(it.Content[:0:0], struct {
					Type     string        `json:"type"`
					Text     *string       `json:"text"`
					Refusal  *string       `json:"refusal"`
					Logprobs []logprobJSON `json:"logprobs"`
				}{Type: "output_text", Text: &t})
			}
		}
		items[i] = it
	}
	ch := responsesChoice(items, raws)
	if len(lps) > 0 {
		// As above: the deltas' log-probs win over the items'.
		ch.Tokens, ch.Fidelity = tokensOf(lps, nil)
	}
	if s.final != nil {
		if len(s.final.Choices) > 0 {
			ch.FinishReason = s.final.Choices[0].FinishReason
		}
		if ch.FinishReason == "stop" && len(ch.Message.ToolCalls) > 0 {
			ch.FinishReason = "tool_calls"
		}
	}
	r.Choices = []core.Choice{ch}
	return r
}

// deltaLogprobs returns the log-probs the deltas carried, items in order.
func (s *Stream) deltaLogprobs() []logprobJSON {
	accs := append([]*itemAcc(nil), s.items...)
	sort.SliceStable(accs, func(i, j int) bool { return accs[i].index < accs[j].index })
	var lps []logprobJSON
	for _, a := range accs {
		lps = append(lps, a.lps...)
	}
	return lps
}

func emptyChoice(c core.Choice) bool {
	m := c.Message
	return m.Content == "" && m.Reasoning == "" && len(m.ToolCalls) == 0 && len(m.Parts) == 0
}
