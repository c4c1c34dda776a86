package wire

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ParseResponse handles a non-streaming response of any status: it returns
// the normalized response and the body to send to the client, which is body
// itself unless fields the gateway added must be stripped.
//
// A non-2xx status records the body's "error" member (or the whole body) as
// Response.Error. When a 2xx body cannot be understood, the error wraps
// ErrBadResponse and the body is still returned, unchanged, for forwarding.
func ParseResponse(req *Request, status int, body []byte, caps Caps) (core.Response, []byte, error) {
	resp := core.Response{Status: status}
	trimmed := trimJSON(body)
	if status/100 != 2 {
		resp.Error = errorOf(trimmed)
		return resp, body, nil
	}
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return resp, body, badResponse("body is not a JSON object")
	}
	api := core.APIChat
	if req != nil {
		api = req.API
	}
	var err error
	switch api {
	case core.APIChat:
		resp, err = chatResponseToCore(trimmed)
	case core.APIMessages:
		resp, err = messagesResponseToCore(trimmed)
	case core.APIResponses:
		resp, err = responsesResponseToCore(trimmed)
	default:
		err = badResponse("unknown api %q", api)
	}
	resp.Status = status
	if err != nil {
		return resp, body, err
	}
	add := addedFor(req, caps)
	if !add.logprobs && !add.tokenIDs {
		return resp, body, nil
	}
	var out []byte
	if api == core.APIResponses {
		out, err = stripResponses(body, add)
	} else {
		out, err = stripChat(body, add, false)
	}
	if err != nil {
		return resp, body, badResponse("%v", err)
	}
	return resp, out, nil
}

// errorOf returns the error to record from an error body: its "error"
// member when it is a JSON object that has one, else the body itself (as
// JSON, or as a JSON string when it is not JSON).
func errorOf(body []byte) json.RawMessage {
	if len(body) > 0 && body[0] == '{' && json.Valid(body) {
		if m, _, ok, err := findMember(body, 0, "error"); err == nil && ok && !isNull(body, m.valStart, m.valEnd) {
			return append(json.RawMessage(nil), body[m.valStart:m.valEnd]...)
		}
	}
	return errorJSON(body)
}

// stripChat removes from a chat completion (whole or one chunk) what the
// gateway added: choice logprobs become null, token ids are removed
// (stream) or become null (whole response, as vLLM writes them), and in a
// chunk the "usage":null OpenAI adds once usage is requested is removed.
func stripChat(b []byte, add added, chunk bool) ([]byte, error) {
	var edits []edit
	// tokenIDs reports whether member m, token ids, is to be removed; in a
	// whole response it becomes null instead.
	tokenIDs := func(m member) bool {
		if isNull(b, m.valStart, m.valEnd) {
			return false
		}
		if chunk {
			return true
		}
		edits = append(edits, edit{start: m.valStart, end: m.valEnd, repl: []byte("null")})
		return false
	}
	var ierr error
	var top deletions
	_, err := eachMember(b, skipSpace(b, 0), func(m member) bool {
		remove := false
		switch string(m.key) {
		case "usage":
			remove = chunk && add.usage && isNull(b, m.valStart, m.valEnd)
		case "prompt_token_ids":
			remove = add.tokenIDs && tokenIDs(m)
		case "choices":
			if !add.logprobs && !add.tokenIDs || b[m.valStart] != '[' {
				break
			}
			ierr = eachElement(b, m.valStart, func(vs, ve int) {
				if b[vs] != '{' {
					return
				}
				var choice deletions
				if _, err := eachMember(b, vs, func(c member) bool {
					remove := false
					switch string(c.key) {
					case "logprobs":
						if add.logprobs && !isNull(b, c.valStart, c.valEnd) {
							edits = append(edits, edit{start: c.valStart, end: c.valEnd, repl: []byte("null")})
						}
					case "token_ids":
						remove = add.tokenIDs && tokenIDs(c)
					}
					choice.add(c, remove)
					return true
				}); err != nil && ierr == nil {
					ierr = err
				}
				edits = choice.edits(edits)
			})
		}
		top.add(m, remove)
		return true
	})
	edits = top.edits(edits)
	if err == nil {
		err = ierr
	}
	if err != nil {
		return nil, err
	}
	return apply(b, edits), nil
}

// stripResponses removes from a whole Responses response the log-probs the
// gateway asked for: those of its output_text parts (see responsesStrip).
func stripResponses(b []byte, add added) ([]byte, error) {
	rs := responsesStrip{add: add}
	rs.response(b, skipSpace(b, 0))
	if rs.err != nil {
		return nil, rs.err
	}
	return apply(b, rs.edits), nil
}

// responsesStrip collects the edits that remove, from a Responses response
// or event, the log-probs the client did not ask for. Where they sit, as the
// OpenAI API reference and the openai-go SDK (ResponseOutputText,
// ResponseTextDeltaEvent, ResponseTextDoneEvent) give them: "logprobs" of
// an output_text content part, an array of {token, logprob, bytes,
// top_logprobs}; and "logprobs" of the output_text.delta and .done events,
// an array of {token, logprob, top_logprobs}. What replaces them is what
// the upstream sends when they are not asked for (OpenAI, and vLLM's
// serving_responses.py):
//
//   - the "logprobs" of response.output_text.delta and .done events become
//     [] (the OpenAI API has the member in every such event; vLLM writes []
//     there when not asked, and always [] in .done);
//   - the "logprobs" of an output_text content part, in a whole response
//     (the non-streaming body; response.completed and the like), an output
//     item (response.output_item.added / .done) or a part
//     (response.content_part.added / .done) become [] as OpenAI writes
//     them, or null as vLLM does (ResponseOutputText with logprobs None,
//     serialized with its nulls): added.partsNull.
//
// A null or empty array is left as it is: nothing was asked for there
// (vLLM's response.content_part.added part has "logprobs":[] whether asked
// or not).
type responsesStrip struct {
	add   added
	edits []edit
	err   error
}

func (rs *responsesStrip) fail(err error) {
	if rs.err == nil && err != nil {
		rs.err = err
	}
}

// emptyArray reports whether b[vs:ve] is an empty array.
func emptyArray(b []byte, vs, ve int) bool {
	return b[vs] == '[' && skipSpace(b, vs+1) == ve-1
}

// set replaces the value b[vs:ve] with repl, unless it is null or an empty
// array.
func (rs *responsesStrip) set(b []byte, vs, ve int, repl string) {
	if isNull(b, vs, ve) || emptyArray(b, vs, ve) {
		return
	}
	rs.edits = append(rs.edits, edit{start: vs, end: ve, repl: []byte(repl)})
}

// event handles one streaming event, of type typ.
func (rs *responsesStrip) event(b []byte, typ string) {
	_, err := eachMember(b, skipSpace(b, 0), func(m member) bool {
		if b[m.valStart] != '{' && b[m.valStart] != '[' {
			return true
		}
		switch string(m.key) {
		case "logprobs":
			if typ == "response.output_text.delta" || typ == "response.output_text.done" {
				rs.set(b, m.valStart, m.valEnd, "[]")
			}
		case "response":
			rs.response(b, m.valStart)
		case "item":
			rs.item(b, m.valStart)
		case "part":
			rs.part(b, m.valStart)
		}
		return true
	})
	rs.fail(err)
}

// response handles the response object at b[start]: its output items.
func (rs *responsesStrip) response(b []byte, start int) {
	rs.each(b, start, "output", rs.item)
}

// item handles the output item at b[start]: its content parts.
func (rs *responsesStrip) item(b []byte, start int) {
	rs.each(b, start, "content", rs.part)
}

// each calls fn with every object in the array that is member key of the
// object at b[start] (when it is one).
func (rs *responsesStrip) each(b []byte, start int, key string, fn func(b []byte, start int)) {
	if b[start] != '{' {
		return
	}
	_, err := eachMember(b, start, func(m member) bool {
		if string(m.key) == key && b[m.valStart] == '[' {
			rs.fail(eachElement(b, m.valStart, func(vs, _ int) {
				if b[vs] == '{' {
					fn(b, vs)
				}
			}))
		}
		return true
	})
	rs.fail(err)
}

// part handles the content part at b[start]: an output_text part's
// log-probs.
func (rs *responsesStrip) part(b []byte, start int) {
	if b[start] != '{' {
		return
	}
	var lps []member // all of them, should the key be repeated
	var typ string
	_, err := eachMember(b, start, func(m member) bool {
		switch string(m.key) {
		case "type":
			typ = stringOf(b[m.valStart:m.valEnd])
		case "logprobs":
			lps = append(lps, m)
		}
		return true
	})
	if err != nil {
		rs.fail(err)
		return
	}
	if typ != "output_text" {
		return
	}
	repl := "[]"
	if rs.add.partsNull {
		repl = "null"
	}
	for _, m := range lps {
		rs.set(b, m.valStart, m.valEnd, repl)
	}
}

// --- shared shapes ---

type usageJSON struct {
	PromptTokens             int `json:"prompt_tokens"`
	CompletionTokens         int `json:"completion_tokens"`
	TotalTokens              int `json:"total_tokens"`
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// core normalizes any of the three APIs' usage objects.
func (u *usageJSON) core() *core.Usage {
	if u == nil {
		return nil
	}
	out := &core.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if out.PromptTokens == 0 {
		// Anthropic counts cached prompt tokens apart; Responses says input.
		out.PromptTokens = u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
	}
	if out.CompletionTokens == 0 {
		out.CompletionTokens = u.OutputTokens
	}
	if out.TotalTokens == 0 {
		out.TotalTokens = out.PromptTokens + out.CompletionTokens
	}
	return out
}

type logprobJSON struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// tokensOf pairs log-probs with token ids (when ids has one per token) and
// says how faithful the result is. Without ids, a token spelled
// "token_id:N" (vLLM's return_tokens_as_token_ids) gives its id.
func tokensOf(lps []logprobJSON, ids []int) ([]core.TokenLogprob, core.Fidelity) {
	if len(lps) == 0 {
		return nil, core.FidelityNone
	}
	out := make([]core.TokenLogprob, len(lps))
	exact := true
	for i, lp := range lps {
		id := -1
		if len(ids) == len(lps) {
			id = ids[i]
		} else if s, ok := strings.CutPrefix(lp.Token, "token_id:"); ok {
			if n, err := strconv.Atoi(s); err == nil && n >= 0 {
				id = n
			}
		}
		if id < 0 {
			exact = false
		}
		out[i] = core.TokenLogprob{Token: lp.Token, ID: id, Logprob: lp.Logprob}
	}
	if exact {
		return out, core.FidelityExact
	}
	return out, core.FidelityLogprob
}

// --- chat completions ---

type chatLogprobs struct {
	Content []logprobJSON `json:"content"`
}

type chatResponse struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Object  string `json:"object"`
	Message string `json:"message"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Content          json.RawMessage `json:"content"`
			ReasoningContent json.RawMessage `json:"reasoning_content"`
			Reasoning        json.RawMessage `json:"reasoning"`
			ToolCalls        []chatToolCall  `json:"tool_calls"`
			FunctionCall     *chatFunction   `json:"function_call"`
		} `json:"message"`
		FinishReason *string       `json:"finish_reason"`
		Logprobs     *chatLogprobs `json:"logprobs"`
		TokenIDs     []int         `json:"token_ids"`
	} `json:"choices"`
	Usage          *usageJSON      `json:"usage"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
	Error          json.RawMessage `json:"error"`
}

func chatResponseToCore(body []byte) (core.Response, error) {
	var cr chatResponse
	if err := json.Unmarshal(body, &cr); err != nil {
		return core.Response{}, badResponse("%v", err)
	}
	resp := core.Response{ID: cr.ID, Model: cr.Model, Usage: cr.Usage.core(), PromptTokenIDs: cr.PromptTokenIDs, Error: rawOrNil(cr.Error)}
	if cr.Object == "error" {
		resp.Error = append(json.RawMessage(nil), body...)
	}
	for _, c := range cr.Choices {
		content, parts, err := textOf(c.Message.Content, "text", "output_text")
		if err != nil {
			return resp, badResponse("choice %d: %v", c.Index, err)
		}
		msg := core.Message{Role: core.RoleAssistant, Content: content, Parts: parts}
		msg.Reasoning = stringOf(c.Message.ReasoningContent)
		if msg.Reasoning == "" {
			msg.Reasoning = stringOf(c.Message.Reasoning)
		}
		for _, tc := range c.Message.ToolCalls {
			typ := tc.Type
			if typ == "" {
				typ = "function"
			}
			msg.ToolCalls = append(msg.ToolCalls, core.ToolCall{ID: tc.ID, Type: typ, Name: tc.Function.Name, Arguments: argumentsOf(tc.Function.Arguments)})
		}
		if fc := c.Message.FunctionCall; fc != nil {
			msg.ToolCalls = append(msg.ToolCalls, core.ToolCall{Type: "function", Name: fc.Name, Arguments: argumentsOf(fc.Arguments)})
		}
		ch := core.Choice{Index: c.Index, Message: msg}
		if c.FinishReason != nil {
			ch.FinishReason = *c.FinishReason
		}
		if c.Logprobs != nil {
			ch.Tokens, ch.Fidelity = tokensOf(c.Logprobs.Content, c.TokenIDs)
		}
		resp.Choices = append(resp.Choices, ch)
	}
	return resp, nil
}

// --- Anthropic messages ---

// anthropicFinish maps Anthropic stop reasons to chat finish reasons.
func anthropicFinish(s string) string {
	switch s {
	case "end_turn", "stop_sequence":
		return "stop"
	case "tool_use":
		return "tool_calls"
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	}
	return s
}

type messagesResponse struct {
	ID         string            `json:"id"`
	Type       string            `json:"type"`
	Model      string            `json:"model"`
	Content    []json.RawMessage `json:"content"`
	StopReason *string           `json:"stop_reason"`
	Usage      *usageJSON        `json:"usage"`
	Error      json.RawMessage   `json:"error"`
}

func messagesResponseToCore(body []byte) (core.Response, error) {
	var mr messagesResponse
	if err := json.Unmarshal(body, &mr); err != nil {
		return core.Response{}, badResponse("%v", err)
	}
	resp := core.Response{ID: mr.ID, Model: mr.Model, Usage: mr.Usage.core(), Error: rawOrNil(mr.Error)}
	if mr.Type == "error" {
		return resp, nil
	}
	msg := core.Message{Role: core.RoleAssistant}
	var text strings.Builder
	for i, raw := range mr.Content {
		var b anthropicBlock
		if err := json.Unmarshal(raw, &b); err != nil {
			return resp, badResponse("content[%d]: %v", i, err)
		}
		switch {
		case b.Type == "text" && b.Text != nil:
			text.WriteString(*b.Text)
		case b.Type == "thinking" && b.Thinking != nil:
			msg.Reasoning += *b.Thinking
		case b.Type == "tool_use":
			msg.ToolCalls = append(msg.ToolCalls, core.ToolCall{ID: b.ID, Type: "function", Name: b.Name, Arguments: argumentsOf(b.Input)})
		default:
			msg.Parts = append(msg.Parts, core.Part{Type: b.Type, Raw: append(json.RawMessage(nil), trimJSON(raw)...)})
		}
	}
	msg.Content = text.String()
	ch := core.Choice{Message: msg}
	if mr.StopReason != nil {
		ch.FinishReason = anthropicFinish(*mr.StopReason)
	}
	resp.Choices = []core.Choice{ch}
	return resp, nil
}

// --- OpenAI Responses ---

type responsesOutputItem struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Input     json.RawMessage `json:"input"`
	Content   []struct {
		Type     string        `json:"type"`
		Text     *string       `json:"text"`
		Refusal  *string       `json:"refusal"`
		Logprobs []logprobJSON `json:"logprobs"`
	} `json:"content"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

type responsesResponse struct {
	ID                string                   `json:"id"`
	Model             string                   `json:"model"`
	Status            string                   `json:"status"`
	Output            []json.RawMessage        `json:"output"`
	Usage             *usageJSON               `json:"usage"`
	Error             json.RawMessage          `json:"error"`
	IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
}

func responsesResponseToCore(body []byte) (core.Response, error) {
	var rr responsesResponse
	if err := json.Unmarshal(body, &rr); err != nil {
		return core.Response{}, badResponse("%v", err)
	}
	resp := core.Response{ID: rr.ID, Model: rr.Model, Usage: rr.Usage.core(), Error: rawOrNil(rr.Error)}
	items := make([]responsesOutputItem, len(rr.Output))
	for i, raw := range rr.Output {
		if err := json.Unmarshal(raw, &items[i]); err != nil {
			return resp, badResponse("output[%d]: %v", i, err)
		}
	}
	ch := responsesChoice(items, rr.Output)
	switch {
	case rr.Status == "incomplete" && rr.IncompleteDetails != nil && rr.IncompleteDetails.Reason == "max_output_tokens":
		ch.FinishReason = "length"
	case rr.Status == "incomplete" && rr.IncompleteDetails != nil:
		ch.FinishReason = rr.IncompleteDetails.Reason
	case rr.Status == "completed" && len(ch.Message.ToolCalls) > 0:
		ch.FinishReason = "tool_calls"
	case rr.Status == "completed":
		ch.FinishReason = "stop"
	}
	resp.Choices = []core.Choice{ch}
	return resp, nil
}

// responsesChoice folds Responses output items into one choice. raws, when
// not nil, holds each item's JSON for items kept verbatim as parts.
func responsesChoice(items []responsesOutputItem, raws []json.RawMessage) core.Choice {
	msg := core.Message{Role: core.RoleAssistant}
	var text strings.Builder
	var lps []logprobJSON
	for i, it := range items {
		switch it.Type {
		case "message":
			for _, c := range it.Content {
				if c.Text != nil {
					text.WriteString(*c.Text)
					lps = append(lps, c.Logprobs...)
				} else if c.Refusal != nil {
					text.WriteString(*c.Refusal)
				}
			}
		case "reasoning":
			for _, s := range it.Summary {
				msg.Reasoning += s.Text
			}
			for _, c := range it.Content {
				if c.Text != nil {
					msg.Reasoning += *c.Text
				}
			}
		case "function_call":
			msg.ToolCalls = append(msg.ToolCalls, core.ToolCall{ID: it.CallID, Type: "function", Name: it.Name, Arguments: argumentsOf(it.Arguments)})
		case "custom_tool_call":
			msg.ToolCalls = append(msg.ToolCalls, core.ToolCall{ID: it.CallID, Type: "custom", Name: it.Name, Arguments: argumentsOf(it.Input)})
		default:
			if raws != nil && i < len(raws) {
				msg.Parts = append(msg.Parts, core.Part{Type: it.Type, Raw: append(json.RawMessage(nil), trimJSON(raws[i])...)})
			}
		}
	}
	msg.Content = text.String()
	ch := core.Choice{Message: msg}
	ch.Tokens, ch.Fidelity = tokensOf(lps, nil)
	return ch
}
