package wire

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ParseRequest parses a client's request body for api. Errors wrap
// ErrBadRequest; the gateway answers them with 400.
//
// Normalized.Params holds every top-level member of the body except those
// turned into messages and tools (chat: messages, tools; Messages: system,
// messages, tools; Responses: instructions, input, tools), byte for byte.
func ParseRequest(api core.APIKind, body []byte) (*Request, error) {
	body = trimJSON(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, badRequest("body must be a JSON object")
	}
	// No json.Valid first: each parse below begins with json.Unmarshal of
	// the whole body, which checks it (a second pass over a long request
	// cost a sixth of parsing it); an invalid body is told apart after.
	var (
		req  *Request
		err  error
		omit []string
	)
	switch api {
	case core.APIChat:
		req, err = parseChatRequest(body)
		omit = []string{"messages", "tools"}
	case core.APIMessages:
		req, err = parseMessagesRequest(body)
		omit = []string{"system", "messages", "tools"}
	case core.APIResponses:
		req, err = parseResponsesRequest(body)
		omit = []string{"instructions", "input", "tools"}
	default:
		return nil, badRequest("unknown api %q", api)
	}
	if err != nil {
		if !json.Valid(body) {
			return nil, badRequest("body is not valid JSON")
		}
		if !errors.Is(err, ErrBadRequest) {
			err = badRequest("%v", err)
		}
		return nil, err
	}
	req.API = api
	req.Normalized.Model = req.Model
	if req.N == 0 {
		req.N = 1
	}
	params, err := paramsOf(body, omit)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	req.Normalized.Params = params
	return req, nil
}

// paramsOf returns the object body without the members named in omit.
func paramsOf(body []byte, omit []string) (json.RawMessage, error) {
	out := []byte{'{'}
	_, err := eachMember(body, 0, func(m member) bool {
		if contains(omit, string(m.key)) {
			return true
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, body[m.keyStart:m.valEnd]...)
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 1 {
		return nil, nil
	}
	return append(out, '}'), nil
}

// hints is the part of every API's request that names the session.
type hints struct {
	Model          string          `json:"model"`
	Stream         *bool           `json:"stream"`
	Metadata       json.RawMessage `json:"metadata"`
	PromptCacheKey json.RawMessage `json:"prompt_cache_key"`
	User           json.RawMessage `json:"user"`
}

func (h *hints) fill(req *Request) {
	req.Model = h.Model
	req.Stream = h.Stream != nil && *h.Stream
	req.PromptCacheKey = stringOf(h.PromptCacheKey)
	req.User = stringOf(h.User)
	if m := trimJSON(h.Metadata); len(m) > 0 && m[0] == '{' {
		var md struct {
			UserID json.RawMessage `json:"user_id"`
		}
		if json.Unmarshal(m, &md) == nil {
			req.MetadataUserID = stringOf(md.UserID)
		}
	}
}

// stringOf returns raw's value if it is a JSON string, else "".
func stringOf(raw json.RawMessage) string {
	raw = trimJSON(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// argumentsOf returns tool-call arguments as JSON text: a JSON string's
// value, or any other JSON value's exact bytes (some servers send an object).
func argumentsOf(raw json.RawMessage) string {
	raw = trimJSON(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		return stringOf(raw)
	}
	return string(raw)
}

// --- chat completions ---

type chatFunction struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             string          `json:"name"`
	ToolCalls        []chatToolCall  `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	FunctionCall     *chatFunction   `json:"function_call"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
}

type chatRequest struct {
	hints
	Messages      *[]chatMessage    `json:"messages"`
	Tools         []json.RawMessage `json:"tools"`
	N             *int              `json:"n"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs       *bool `json:"logprobs"`
	ReturnTokenIDs *bool `json:"return_token_ids"`
}

func parseChatRequest(body []byte) (*Request, error) {
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return nil, badRequest("%v", err)
	}
	if cr.Messages == nil || len(*cr.Messages) == 0 {
		return nil, badRequest("messages must be a non-empty array")
	}
	req := &Request{}
	cr.hints.fill(req)
	if cr.N != nil {
		if *cr.N < 1 {
			return nil, badRequest("n must be at least 1")
		}
		req.N = *cr.N
	}
	req.IncludeUsage = cr.StreamOptions != nil && cr.StreamOptions.IncludeUsage != nil && *cr.StreamOptions.IncludeUsage
	req.WantLogprobs = cr.Logprobs != nil && *cr.Logprobs
	req.WantTokenIDs = cr.ReturnTokenIDs != nil && *cr.ReturnTokenIDs
	msgs := make([]core.Message, 0, len(*cr.Messages))
	for i, m := range *cr.Messages {
		cm, err := chatToCore(m)
		if err != nil {
			return nil, badRequest("messages[%d]: %v", i, err)
		}
		msgs = append(msgs, cm)
	}
	req.Normalized.Messages = msgs
	tools, err := toolsOf(cr.Tools)
	if err != nil {
		return nil, err
	}
	req.Normalized.Tools = tools
	return req, nil
}

func chatToCore(m chatMessage) (core.Message, error) {
	var cm core.Message
	switch m.Role {
	case "system", "developer":
		cm.Role = core.RoleSystem
	case "user":
		cm.Role = core.RoleUser
	case "assistant":
		cm.Role = core.RoleAssistant
	case "tool", "function":
		cm.Role = core.RoleTool
	default:
		return cm, errRole(m.Role)
	}
	text, parts, err := textOf(m.Content, "text")
	if err != nil {
		return cm, err
	}
	cm.Content, cm.Parts = text, parts
	cm.Name = m.Name
	cm.ToolCallID = m.ToolCallID
	if m.Role == "function" && cm.ToolCallID == "" {
		cm.ToolCallID = m.Name
	}
	cm.Reasoning = stringOf(m.ReasoningContent)
	if cm.Reasoning == "" {
		cm.Reasoning = stringOf(m.Reasoning)
	}
	for _, tc := range m.ToolCalls {
		typ := tc.Type
		if typ == "" {
			typ = "function"
		}
		cm.ToolCalls = append(cm.ToolCalls, core.ToolCall{ID: tc.ID, Type: typ, Name: tc.Function.Name, Arguments: argumentsOf(tc.Function.Arguments)})
	}
	if m.FunctionCall != nil {
		cm.ToolCalls = append(cm.ToolCalls, core.ToolCall{Type: "function", Name: m.FunctionCall.Name, Arguments: argumentsOf(m.FunctionCall.Arguments)})
	}
	return cm, nil
}

type roleError string

func (e roleError) Error() string { return "unknown role " + string(e) }

func errRole(r string) error { return roleError(`"` + r + `"`) }

// toolsOf normalizes a tools array of any of the three APIs: chat
// ({type, function:{name, description, parameters}}), Responses ({type,
// name, description, parameters}) and Messages ({name, description,
// input_schema}). Tools with no name (hosted tools such as web search) are
// kept under their type.
func toolsOf(raw []json.RawMessage) ([]core.Tool, error) {
	var out []core.Tool
	for i, r := range raw {
		var t struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			InputSchema json.RawMessage `json:"input_schema"`
			Function    *struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(r, &t); err != nil {
			return nil, badRequest("tools[%d]: %v", i, err)
		}
		ct := core.Tool{Name: t.Name, Description: t.Description, Parameters: rawOrNil(t.Parameters)}
		if t.Function != nil {
			ct = core.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: rawOrNil(t.Function.Parameters)}
		}
		if ct.Parameters == nil {
			ct.Parameters = rawOrNil(t.InputSchema)
		}
		if ct.Name == "" {
			ct.Name = t.Type
		}
		out = append(out, ct)
	}
	return out, nil
}

// --- Anthropic messages ---

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type messagesRequest struct {
	hints
	System   json.RawMessage `json:"system"`
	Messages *[]struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []json.RawMessage `json:"tools"`
}

func parseMessagesRequest(body []byte) (*Request, error) {
	var mr messagesRequest
	if err := json.Unmarshal(body, &mr); err != nil {
		return nil, badRequest("%v", err)
	}
	if mr.Messages == nil {
		return nil, badRequest("messages is required")
	}
	req := &Request{}
	mr.hints.fill(req)
	var msgs []core.Message
	sys, sysParts, err := textOf(mr.System, "text")
	if err != nil {
		return nil, badRequest("system: %v", err)
	}
	if sys != "" || len(sysParts) > 0 {
		msgs = append(msgs, core.Message{Role: core.RoleSystem, Content: sys, Parts: sysParts})
	}
	for i, m := range *mr.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, badRequest("messages[%d]: %v", i, errRole(m.Role))
		}
		out, err := anthropicToCore(m.Role, m.Content)
		if err != nil {
			return nil, badRequest("messages[%d]: %v", i, err)
		}
		msgs = append(msgs, out...)
	}
	req.Normalized.Messages = msgs
	tools, err := toolsOf(mr.Tools)
	if err != nil {
		return nil, err
	}
	req.Normalized.Tools = tools
	return req, nil
}

// anthropicToCore turns one Anthropic message into core messages: each
// tool_result block becomes a tool message; the other blocks, in order,
// gather into messages of the original role between them.
func anthropicToCore(role string, content json.RawMessage) ([]core.Message, error) {
	content = trimJSON(content)
	if len(content) == 0 || content[0] != '[' {
		text, _, err := textOf(content)
		if err != nil {
			return nil, err
		}
		return []core.Message{{Role: role, Content: text}}, nil
	}
	var blocks []json.RawMessage
	if err := json.Unmarshal(content, &blocks); err != nil {
		return nil, err
	}
	var out []core.Message
	var cur *core.Message
	var sb strings.Builder
	flush := func() {
		if cur != nil {
			cur.Content = sb.String()
			out = append(out, *cur)
			cur = nil
			sb.Reset()
		}
	}
	for _, raw := range blocks {
		var b anthropicBlock
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, err
		}
		if b.Type == "tool_result" {
			flush()
			text, parts, err := textOf(b.Content, "text")
			if err != nil {
				return nil, err
			}
			out = append(out, core.Message{Role: core.RoleTool, ToolCallID: b.ToolUseID, Content: text, Parts: parts, IsError: b.IsError})
			continue
		}
		if cur == nil {
			cur = &core.Message{Role: role}
		}
		switch {
		case b.Type == "text" && b.Text != nil:
			sb.WriteString(*b.Text)
		case b.Type == "thinking" && b.Thinking != nil:
			cur.Reasoning += *b.Thinking
		case b.Type == "tool_use":
			cur.ToolCalls = append(cur.ToolCalls, core.ToolCall{ID: b.ID, Type: "function", Name: b.Name, Arguments: argumentsOf(b.Input)})
		default:
			cur.Parts = append(cur.Parts, core.Part{Type: b.Type, Raw: append(json.RawMessage(nil), trimJSON(raw)...)})
		}
	}
	flush()
	if len(out) == 0 {
		out = append(out, core.Message{Role: role})
	}
	return out, nil
}

// --- OpenAI Responses ---

type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Input     json.RawMessage `json:"input"`
	Output    json.RawMessage `json:"output"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

var responsesTextTypes = []string{"input_text", "output_text", "text", "summary_text", "reasoning_text"}

type responsesRequest struct {
	hints
	Instructions       json.RawMessage   `json:"instructions"`
	Input              json.RawMessage   `json:"input"`
	Tools              []json.RawMessage `json:"tools"`
	PreviousResponseID string            `json:"previous_response_id"`
	Include            json.RawMessage   `json:"include"`
}

// includeLogprobs is the Responses "include" value that asks for the
// log-probs of output_text parts (the OpenAI API reference, "Create a model
// response", include; vLLM's ResponsesRequest.is_include_output_logprobs).
const includeLogprobs = "message.output_text.logprobs"

func parseResponsesRequest(body []byte) (*Request, error) {
	var rr responsesRequest
	if err := json.Unmarshal(body, &rr); err != nil {
		return nil, badRequest("%v", err)
	}
	req := &Request{PreviousResponseID: rr.PreviousResponseID}
	rr.hints.fill(req)
	switch inc := trimJSON(rr.Include); {
	case len(inc) == 0 || string(inc) == "null":
	case inc[0] == '[':
		var vals []json.RawMessage
		if json.Unmarshal(inc, &vals) == nil {
			for _, v := range vals {
				if stringOf(v) == includeLogprobs {
					req.WantLogprobs = true
				}
			}
		}
	default:
		req.includeOdd = true
	}
	var msgs []core.Message
	if ins := trimJSON(rr.Instructions); len(ins) > 0 && ins[0] == '[' {
		// Instructions given as input items.
		m, err := responsesItemsToCore(ins)
		if err != nil {
			return nil, badRequest("instructions: %v", err)
		}
		msgs = append(msgs, m...)
	} else if s := stringOf(ins); s != "" {
		msgs = append(msgs, core.Message{Role: core.RoleSystem, Content: s})
	}
	in := trimJSON(rr.Input)
	switch {
	case len(in) == 0 || string(in) == "null":
	case in[0] == '"':
		msgs = append(msgs, core.Message{Role: core.RoleUser, Content: stringOf(in)})
	case in[0] == '[':
		m, err := responsesItemsToCore(in)
		if err != nil {
			return nil, badRequest("input: %v", err)
		}
		msgs = append(msgs, m...)
	default:
		return nil, badRequest("input must be a string or an array")
	}
	req.Normalized.Messages = msgs
	tools, err := toolsOf(rr.Tools)
	if err != nil {
		return nil, err
	}
	req.Normalized.Tools = tools
	return req, nil
}

// responsesItemsToCore turns Responses input items into core messages.
// Reasoning, assistant message and function_call items that follow each
// other gather into one assistant message, as one model turn.
func responsesItemsToCore(raw json.RawMessage) ([]core.Message, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, err
	}
	var out []core.Message
	// open returns the assistant message the current model turn adds to.
	open := func() *core.Message {
		if n := len(out); n > 0 && out[n-1].Role == core.RoleAssistant {
			return &out[n-1]
		}
		out = append(out, core.Message{Role: core.RoleAssistant})
		return &out[len(out)-1]
	}
	for i, r := range items {
		var it responsesItem
		if err := json.Unmarshal(r, &it); err != nil {
			return nil, err
		}
		if it.Type == "" && it.Role != "" {
			it.Type = "message"
		}
		switch it.Type {
		case "message":
			var role string
			switch it.Role {
			case "system", "developer":
				role = core.RoleSystem
			case "user":
				role = core.RoleUser
			case "assistant":
				role = core.RoleAssistant
			default:
				return nil, badRequest("item %d: %v", i, errRole(it.Role))
			}
			text, parts, err := textOf(it.Content, responsesTextTypes...)
			if err != nil {
				return nil, err
			}
			if role == core.RoleAssistant {
				m := open()
				if m.Content != "" || len(m.ToolCalls) > 0 {
					out = append(out, core.Message{Role: core.RoleAssistant})
					m = &out[len(out)-1]
				}
				m.Content += text
				m.Parts = append(m.Parts, parts...)
				continue
			}
			out = append(out, core.Message{Role: role, Content: text, Parts: parts})
		case "reasoning":
			m := open()
			if m.Content != "" || len(m.ToolCalls) > 0 {
				out = append(out, core.Message{Role: core.RoleAssistant})
				m = &out[len(out)-1]
			}
			for _, s := range it.Summary {
				m.Reasoning += s.Text
			}
			if text, _, err := textOf(it.Content, responsesTextTypes...); err == nil {
				m.Reasoning += text
			}
		case "function_call":
			m := open()
			m.ToolCalls = append(m.ToolCalls, core.ToolCall{ID: it.CallID, Type: "function", Name: it.Name, Arguments: argumentsOf(it.Arguments)})
		case "custom_tool_call":
			m := open()
			m.ToolCalls = append(m.ToolCalls, core.ToolCall{ID: it.CallID, Type: "custom", Name: it.Name, Arguments: argumentsOf(it.Input)})
		case "function_call_output", "custom_tool_call_output":
			text, parts, err := textOf(it.Output, responsesTextTypes...)
			if err != nil {
				return nil, err
			}
			out = append(out, core.Message{Role: core.RoleTool, ToolCallID: it.CallID, Content: text, Parts: parts})
		default:
			// Hosted tool calls, item references and the like: kept verbatim.
			p := core.Part{Type: it.Type, Raw: append(json.RawMessage(nil), trimJSON(r)...)}
			if n := len(out); n > 0 {
				out[n-1].Parts = append(out[n-1].Parts, p)
			} else {
				out = append(out, core.Message{Role: core.RoleUser, Parts: []core.Part{p}})
			}
		}
	}
	return out, nil
}
