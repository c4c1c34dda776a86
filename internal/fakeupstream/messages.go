package fakeupstream

import (
	"encoding/json"
	"net/http"
)

type antBlock struct {
	Type      string           `json:"type"`
	Text      *string          `json:"text,omitempty"`
	Thinking  *string          `json:"thinking,omitempty"`
	Signature *string          `json:"signature,omitempty"`
	ID        string           `json:"id,omitempty"`
	Name      string           `json:"name,omitempty"`
	Input     *json.RawMessage `json:"input,omitempty"`
}

type antUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type antMessage struct {
	ID           string     `json:"id"`
	Type         string     `json:"type"`
	Role         string     `json:"role"`
	Model        string     `json:"model"`
	Content      []antBlock `json:"content"`
	StopReason   *string    `json:"stop_reason"`
	StopSequence *string    `json:"stop_sequence"`
	Usage        antUsage   `json:"usage"`
}

func (c *call) antStop() string {
	switch c.finish() {
	case "tool_calls":
		return "tool_use"
	case "length":
		return "max_tokens"
	}
	return "end_turn"
}

func (c *call) antToolID(j int) string {
	tc := c.toolCall(j)
	if c.t.ToolCalls[j].ID == "" {
		return "toolu_" + itoa(c.n) + "_" + itoa(j)
	}
	return tc.ID
}

func strp(s string) *string { return &s }

func (c *call) messages() {
	if c.p.Stream {
		c.messagesStream()
		return
	}
	stop := c.antStop()
	m := antMessage{ID: "msg_fake_" + itoa(c.n), Type: "message", Role: "assistant", Model: c.p.Model, StopReason: &stop,
		Usage: antUsage{InputTokens: c.s.script.PromptTokens, OutputTokens: c.completionTokens()}, Content: []antBlock{}}
	if c.t.Reasoning != "" {
		m.Content = append(m.Content, antBlock{Type: "thinking", Thinking: strp(c.t.Reasoning), Signature: strp("sig")})
	}
	if c.t.Text != "" {
		m.Content = append(m.Content, antBlock{Type: "text", Text: strp(c.t.Text)})
	}
	for j := range c.t.ToolCalls {
		tc := c.toolCall(j)
		in := json.RawMessage(tc.Arguments)
		m.Content = append(m.Content, antBlock{Type: "tool_use", ID: c.antToolID(j), Name: tc.Name, Input: &in})
	}
	writeJSON(c.w, http.StatusOK, m)
}

func (c *call) messagesStream() {
	f := c.sseStart()
	ev := func(name string, v any) bool { return c.send(f, name, mustJSON(v)) }
	start := antMessage{ID: "msg_fake_" + itoa(c.n), Type: "message", Role: "assistant", Model: c.p.Model, Content: []antBlock{},
		Usage: antUsage{InputTokens: c.s.script.PromptTokens, OutputTokens: 1}}
	if !ev("message_start", map[string]any{"type": "message_start", "message": start}) {
		return
	}
	idx := 0
	if c.t.Reasoning != "" {
		if !ev("content_block_start", map[string]any{"type": "content_block_start", "index": idx, "content_block": antBlock{Type: "thinking", Thinking: strp(""), Signature: strp("")}}) ||
			!ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx, "delta": map[string]any{"type": "thinking_delta", "thinking": c.t.Reasoning}}) ||
			!ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx, "delta": map[string]any{"type": "signature_delta", "signature": "sig"}}) ||
			!ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx}) {
			return
		}
		idx++
	}
	if c.t.Text != "" {
		if !ev("content_block_start", map[string]any{"type": "content_block_start", "index": idx, "content_block": antBlock{Type: "text", Text: strp("")}}) ||
			!ev("ping", map[string]any{"type": "ping"}) {
			return
		}
		for k, p := range SplitText(c.t.Text, c.s.script.Chunks) {
			if c.t.StreamErrorAfter > 0 && k == c.t.StreamErrorAfter {
				ev("error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "scripted mid-stream failure"}})
				return
			}
			if !c.beforeChunk(k) {
				return
			}
			if !ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx, "delta": map[string]any{"type": "text_delta", "text": p}}) {
				return
			}
		}
		if !ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx}) {
			return
		}
		idx++
	}
	for j := range c.t.ToolCalls {
		tc := c.toolCall(j)
		empty := json.RawMessage(`{}`)
		if !ev("content_block_start", map[string]any{"type": "content_block_start", "index": idx, "content_block": antBlock{Type: "tool_use", ID: c.antToolID(j), Name: tc.Name, Input: &empty}}) {
			return
		}
		for _, part := range SplitText(tc.Arguments, 2) {
			if !ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx, "delta": map[string]any{"type": "input_json_delta", "partial_json": part}}) {
				return
			}
		}
		if !ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx}) {
			return
		}
		idx++
	}
	if !ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": c.antStop(), "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": c.completionTokens()}}) {
		return
	}
	ev("message_stop", map[string]any{"type": "message_stop"})
}
