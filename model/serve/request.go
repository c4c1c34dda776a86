package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
)

// Limits on a request's parameters.
const (
	maxN     = 16 // choices per request
	maxStops = 8  // stop strings (OpenAI allows 4; vLLM more)
)

// chatRequest is a decoded, validated chat completion request.
type chatRequest struct {
	Model    string
	Messages []core.Message
	Tools    []core.Tool
	// MaxTokens is 0 when the client set no limit.
	MaxTokens    int
	Temperature  float64
	TopP         float64
	Seed         *uint64
	Stop         []string
	N            int
	Stream       bool
	IncludeUsage bool
	Logprobs     bool
	// TopLogprobs is how many most likely tokens to report per position.
	TopLogprobs int
	// ReturnTokenIDs is vLLM's return_token_ids.
	ReturnTokenIDs bool
}

type wireRequest struct {
	Model               string          `json:"model"`
	Messages            []wireMessage   `json:"messages"`
	Tools               []wireTool      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs       *bool `json:"logprobs"`
	TopLogprobs    *int  `json:"top_logprobs"`
	ReturnTokenIDs *bool `json:"return_token_ids"`
}

type wireMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             string          `json:"name"`
	ToolCalls        []wireToolCall  `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// decodeRequest parses and validates a /v1/chat/completions body. Errors
// wrap ErrBadRequest and name the offending parameter.
func decodeRequest(body []byte) (chatRequest, error) {
	var w wireRequest
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&w); err != nil {
		return chatRequest{}, badRequest("", "invalid JSON body: %v", err)
	}
	if d.More() {
		return chatRequest{}, badRequest("", "trailing data after the JSON body")
	}
	r := chatRequest{Model: w.Model, N: 1, Temperature: 1, TopP: 1}
	if len(w.Messages) == 0 {
		return r, badRequest("messages", "messages must be a non-empty array")
	}
	for i, m := range w.Messages {
		cm, err := m.toCore()
		if err != nil {
			return r, badRequest(fmt.Sprintf("messages[%d]", i), "%v", err)
		}
		r.Messages = append(r.Messages, cm)
	}
	toolChoice := "auto"
	if len(w.ToolChoice) > 0 && !isNull(w.ToolChoice) {
		var s string
		if json.Unmarshal(w.ToolChoice, &s) == nil {
			toolChoice = s
		}
		// A named function is accepted and treated as "auto": this server
		// cannot constrain decoding.
	}
	if toolChoice != "none" {
		for i, t := range w.Tools {
			if t.Type != "function" && t.Type != "" {
				return r, badRequest(fmt.Sprintf("tools[%d].type", i), "unsupported tool type %q (want function)", t.Type)
			}
			if t.Function.Name == "" {
				return r, badRequest(fmt.Sprintf("tools[%d].function.name", i), "tool has no name")
			}
			params := t.Function.Parameters
			if isNull(params) {
				params = nil
			}
			r.Tools = append(r.Tools, core.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: params})
		}
	}
	switch {
	case w.MaxCompletionTokens != nil:
		r.MaxTokens = *w.MaxCompletionTokens
		if r.MaxTokens < 1 {
			return r, badRequest("max_completion_tokens", "max_completion_tokens must be at least 1")
		}
	case w.MaxTokens != nil:
		r.MaxTokens = *w.MaxTokens
		if r.MaxTokens < 1 {
			return r, badRequest("max_tokens", "max_tokens must be at least 1")
		}
	}
	if w.Temperature != nil {
		r.Temperature = *w.Temperature
		if !(r.Temperature >= 0 && r.Temperature <= 2) {
			return r, badRequest("temperature", "temperature must be in [0, 2]")
		}
	}
	if w.TopP != nil {
		r.TopP = *w.TopP
		if !(r.TopP > 0 && r.TopP <= 1) {
			return r, badRequest("top_p", "top_p must be in (0, 1]")
		}
	}
	if w.Seed != nil {
		s := uint64(*w.Seed)
		r.Seed = &s
	}
	if len(w.Stop) > 0 && !isNull(w.Stop) {
		var one string
		if err := json.Unmarshal(w.Stop, &one); err == nil {
			r.Stop = []string{one}
		} else if err := json.Unmarshal(w.Stop, &r.Stop); err != nil {
			return r, badRequest("stop", "stop must be a string or an array of strings")
		}
		if len(r.Stop) > maxStops {
			return r, badRequest("stop", "at most %d stop sequences", maxStops)
		}
		for _, s := range r.Stop {
			if s == "" {
				return r, badRequest("stop", "stop sequences must not be empty")
			}
		}
	}
	if w.N != nil {
		r.N = *w.N
		if r.N < 1 || r.N > maxN {
			return r, badRequest("n", "n must be in [1, %d]", maxN)
		}
	}
	r.Stream = w.Stream != nil && *w.Stream
	if w.StreamOptions != nil && w.StreamOptions.IncludeUsage != nil {
		if !r.Stream {
			return r, badRequest("stream_options", "stream_options is only allowed with stream: true")
		}
		r.IncludeUsage = *w.StreamOptions.IncludeUsage
	}
	r.Logprobs = w.Logprobs != nil && *w.Logprobs
	if w.TopLogprobs != nil {
		switch n := *w.TopLogprobs; {
		case n < 0 || n > engine.MaxTopLogprobs:
			return r, badRequest("top_logprobs", "top_logprobs must be in [0, 20]")
		case n > 0 && !r.Logprobs:
			return r, badRequest("top_logprobs", "top_logprobs needs logprobs: true")
		}
		r.TopLogprobs = *w.TopLogprobs
	}
	r.ReturnTokenIDs = w.ReturnTokenIDs != nil && *w.ReturnTokenIDs
	return r, nil
}

func (m wireMessage) toCore() (core.Message, error) {
	role := m.Role
	if role == "developer" {
		role = core.RoleSystem
	}
	switch role {
	case core.RoleSystem, core.RoleUser, core.RoleAssistant, core.RoleTool:
	case "":
		return core.Message{}, fmt.Errorf("message has no role")
	default:
		return core.Message{}, fmt.Errorf("unknown role %q", m.Role)
	}
	content, err := textContent(m.Content)
	if err != nil {
		return core.Message{}, err
	}
	cm := core.Message{Role: role, Content: content, Name: m.Name, ToolCallID: m.ToolCallID}
	switch {
	case m.ReasoningContent != nil:
		cm.Reasoning = *m.ReasoningContent
	case m.Reasoning != nil:
		cm.Reasoning = *m.Reasoning
	}
	for i, tc := range m.ToolCalls {
		if role != core.RoleAssistant {
			return core.Message{}, fmt.Errorf("tool_calls on a %s message", role)
		}
		if tc.Function.Name == "" {
			return core.Message{}, fmt.Errorf("tool_calls[%d] has no function name", i)
		}
		args := strings.TrimSpace(string(tc.Function.Arguments))
		var s string
		if json.Unmarshal(tc.Function.Arguments, &s) == nil {
			args = s // the usual form: the arguments' JSON as a string
		}
		if args == "" || args == "null" {
			args = "{}"
		}
		if !json.Valid([]byte(args)) {
			return core.Message{}, fmt.Errorf("tool_calls[%d].function.arguments is not valid JSON", i)
		}
		cm.ToolCalls = append(cm.ToolCalls, core.ToolCall{ID: tc.ID, Type: "function", Name: tc.Function.Name, Arguments: args})
	}
	return cm, nil
}

// textContent flattens a message's content: a string, null, or an array of
// text parts. Other parts (images, audio, files) are refused: the model
// reads text only.
func textContent(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or an array of parts")
	}
	var b strings.Builder
	for i, p := range parts {
		switch p.Type {
		case "text", "input_text", "output_text":
			if p.Text == nil {
				return "", fmt.Errorf("content[%d] has no text", i)
			}
			b.WriteString(*p.Text)
		default:
			return "", fmt.Errorf("content[%d]: unsupported part type %q (this model reads text only)", i, p.Type)
		}
	}
	return b.String(), nil
}

func isNull(raw json.RawMessage) bool {
	return string(bytes.TrimSpace(raw)) == "null"
}
