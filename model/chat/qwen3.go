package chat

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Qwen3 returns the native renderer of Qwen3's chat template (the
// chat_template of Qwen3's tokenizer_config.json), equivalent to rendering
// that template with Hugging Face's Jinja environment:
//
//   - a system turn opens the text: the first message's content if it is a
//     system message, then, when tools are offered, the "# Tools" block with
//     one JSON line per tool inside <tools></tools> and the <tool_call>
//     instructions;
//   - each turn is "<|im_start|>{role}\n{content}<|im_end|>\n";
//   - assistant tool calls follow the content as
//     <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, the
//     arguments verbatim as the model produced them;
//   - consecutive tool results are grouped in one user turn, each in
//     <tool_response>\n...\n</tool_response>;
//   - reasoning (Message.Reasoning, or a <think>...</think> prefix of the
//     content) is kept only for assistant turns after the last real user
//     query, as "<think>\n{reasoning}\n</think>\n\n"; the final assistant turn
//     always gets the block, empty if there is no reasoning;
//   - addGenerationPrompt appends "<|im_start|>assistant\n".
//
// Message.Parts (images, files) are not rendered.
func Qwen3() Renderer { return qwen3{} }

type qwen3 struct{}

func (qwen3) EndOfTurn() string { return "<|im_end|>" }

const (
	qwenToolsHead = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
	qwenToolsTail = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
)

func (qwen3) Render(msgs []core.Message, tools []core.Tool, addGenerationPrompt bool) (string, error) {
	if len(msgs) == 0 {
		return "", ErrEmpty
	}
	var b strings.Builder
	if len(tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if msgs[0].Role == core.RoleSystem {
			b.WriteString(msgs[0].Content)
			b.WriteString("\n\n")
		}
		b.WriteString(qwenToolsHead)
		for _, t := range tools {
			raw, err := toolJSON(t.Name, t.Description, t.Parameters)
			if err != nil {
				return "", err
			}
			js, err := pyJSON(raw)
			if err != nil {
				return "", err
			}
			b.WriteString("\n")
			b.WriteString(js)
		}
		b.WriteString(qwenToolsTail)
	} else if msgs[0].Role == core.RoleSystem {
		b.WriteString("<|im_start|>system\n" + msgs[0].Content + "<|im_end|>\n")
	}
	// The last real user query: the last user message that is not a tool
	// response wrapped by the client itself.
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == core.RoleUser && !(strings.HasPrefix(m.Content, "<tool_response>") && strings.HasSuffix(m.Content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		last := i == len(msgs)-1
		switch {
		case m.Role == core.RoleUser || (m.Role == core.RoleSystem && i > 0):
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		case m.Role == core.RoleAssistant:
			content, reasoning := splitReasoning(m)
			if i > lastQuery && (last || reasoning != "") {
				b.WriteString("<|im_start|>assistant\n<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n" + strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString("<|im_start|>assistant\n" + content)
			}
			for j, tc := range m.ToolCalls {
				if (j == 0 && content != "") || j > 0 {
					b.WriteString("\n")
				}
				b.WriteString("<tool_call>\n{\"name\": \"" + tc.Name + "\", \"arguments\": " + tc.Arguments + "}\n</tool_call>")
			}
			b.WriteString("<|im_end|>\n")
		case m.Role == core.RoleTool:
			if i == 0 || msgs[i-1].Role != core.RoleTool {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if last || msgs[i+1].Role != core.RoleTool {
				b.WriteString("<|im_end|>\n")
			}
		case m.Role == core.RoleSystem:
			// The first system message was rendered above.
		default:
			return "", fmt.Errorf("%w: unknown role %q", ErrTemplate, m.Role)
		}
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

// splitReasoning returns an assistant message's content and reasoning as
// Qwen3's template sees them: Reasoning when set, else the text before
// </think> in the content.
func splitReasoning(m core.Message) (content, reasoning string) {
	if m.Reasoning != "" {
		return m.Content, m.Reasoning
	}
	content = m.Content
	if strings.Contains(content, "</think>") {
		parts := strings.Split(content, "</think>")
		content = strings.TrimLeft(parts[len(parts)-1], "\n")
		before := strings.TrimRight(parts[0], "\n")
		th := strings.Split(before, "<think>")
		reasoning = strings.TrimLeft(th[len(th)-1], "\n")
	}
	return content, reasoning
}

// ParseToolCall parses the JSON a Qwen3 model writes inside
// <tool_call></tool_call>: the call's name and arguments, kept as the model
// wrote them (a JSON string is unquoted; none is "{}"). The call's id is
// left to the caller.
func ParseToolCall(body string) (core.ToolCall, bool) {
	var v struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &v); err != nil || v.Name == "" {
		return core.ToolCall{}, false
	}
	args := string(v.Arguments)
	var s string
	if json.Unmarshal(v.Arguments, &s) == nil {
		args = s
	}
	if args == "" || args == "null" {
		args = "{}"
	}
	return core.ToolCall{Type: "function", Name: v.Name, Arguments: args}, true
}
