package serve

import (
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
)

// Tags of Qwen's output format, as the chat template writes them.
const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
)

// piece is what the output parser releases: text for the reply's content
// or its reasoning, or one complete tool call.
type piece struct {
	Content   string
	Reasoning string
	Tool      *core.ToolCall
}

// outParser turns generated text, pushed in arbitrary fragments, into
// content, reasoning (<think>...</think>) and tool calls
// (<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>). It is a pure
// state machine: it holds back only what may still turn into a tag or
// whitespace that a tag would swallow, so pushing a text whole or in any
// split releases the same concatenated result. Whitespace follows the Qwen3
// template: newlines around the reasoning, after </think> and before or
// between tool calls are the template's, not the reply's.
type outParser struct {
	tools bool // parse tool calls (the request offered tools)
	mode  parseMode
	buf   string // pushed but not yet released
	// started is set once anything but leading newlines arrived in content
	// mode: <think> is recognised only at the very start.
	started bool
	// reasoned is set once reasoning text was released (leading newlines
	// of the reasoning are dropped until then); skipNL drops the newlines
	// that follow </think> or a tool call.
	reasoned, skipNL bool
	calls            int // tool calls released
}

type parseMode uint8

const (
	modeContent parseMode = iota
	modeReasoning
	modeTool
)

// newOutParser returns a parser; inThink says the prompt already opened a
// <think> block, so the output starts as reasoning.
func newOutParser(tools, inThink bool) *outParser {
	p := &outParser{tools: tools}
	if inThink {
		p.mode, p.started = modeReasoning, true
	}
	return p
}

// Push feeds the next fragment of text and returns what can be released.
func (p *outParser) Push(s string) []piece {
	p.buf += s
	return p.drain(false)
}

// Finish releases everything held back: the generation ended.
func (p *outParser) Finish() []piece {
	return p.drain(true)
}

// Calls reports how many tool calls were released.
func (p *outParser) Calls() int { return p.calls }

func (p *outParser) drain(final bool) []piece {
	var out []piece
	emit := func(pc piece) {
		if pc.Content == "" && pc.Reasoning == "" && pc.Tool == nil {
			return
		}
		// Merge text into the previous piece of the same kind.
		if n := len(out); n > 0 && pc.Tool == nil && out[n-1].Tool == nil &&
			(pc.Content == "") == (out[n-1].Content == "") && (pc.Reasoning == "") == (out[n-1].Reasoning == "") {
			out[n-1].Content += pc.Content
			out[n-1].Reasoning += pc.Reasoning
			return
		}
		out = append(out, pc)
	}
	for {
		switch p.mode {
		case modeReasoning:
			if !p.reasoned {
				p.buf = strings.TrimLeft(p.buf, "\n")
			}
			if i := strings.Index(p.buf, thinkClose); i >= 0 {
				emit(piece{Reasoning: strings.TrimRight(p.buf[:i], "\n")})
				p.buf = p.buf[i+len(thinkClose):]
				p.mode, p.skipNL = modeContent, true
				continue
			}
			if final {
				emit(piece{Reasoning: p.buf})
				p.buf = ""
				return out
			}
			// Hold back a possible start of </think> and trailing newlines
			// (they belong to the template if </think> follows).
			keep := holdBack(p.buf, thinkClose)
			rel := strings.TrimRight(p.buf[:len(p.buf)-keep], "\n")
			if rel != "" {
				p.reasoned = true
			}
			emit(piece{Reasoning: rel})
			p.buf = p.buf[len(rel):]
			return out

		case modeTool:
			i := strings.Index(p.buf, toolCallClose)
			if i < 0 && !final {
				return out
			}
			if i < 0 {
				// Cut off inside a tool call: the text stays content.
				emit(piece{Content: toolCallOpen + p.buf})
				p.buf = ""
				return out
			}
			body := p.buf[:i]
			p.buf = p.buf[i+len(toolCallClose):]
			p.mode = modeContent
			if tc, ok := chat.ParseToolCall(body); ok {
				p.calls++
				p.skipNL = true
				emit(piece{Tool: &tc})
			} else {
				emit(piece{Content: toolCallOpen + body + toolCallClose})
			}

		default: // modeContent
			if p.skipNL {
				p.buf = strings.TrimLeft(p.buf, "\n")
				if p.buf == "" && !final {
					return out
				}
				p.skipNL = false
			}
			if !p.started {
				rest := strings.TrimLeft(p.buf, "\n")
				if strings.HasPrefix(rest, thinkOpen) {
					p.buf, p.started, p.mode = rest[len(thinkOpen):], true, modeReasoning
					continue
				}
				if !final && strings.HasPrefix(thinkOpen, rest) {
					return out // "", "\n" or a start of "<think>": wait
				}
				p.started = true
			}
			if p.tools {
				if i := strings.Index(p.buf, toolCallOpen); i >= 0 {
					emit(piece{Content: strings.TrimRight(p.buf[:i], "\n")})
					p.buf = p.buf[i+len(toolCallOpen):]
					p.mode = modeTool
					continue
				}
			}
			if final {
				if p.calls == 0 || strings.Trim(p.buf, "\n") != "" {
					emit(piece{Content: p.buf})
				}
				p.buf = ""
				return out
			}
			keep := 0
			if p.tools {
				keep = holdBack(p.buf, toolCallOpen)
			}
			rel := p.buf[:len(p.buf)-keep]
			if p.tools {
				// Newlines before a tool call are the template's.
				rel = strings.TrimRight(rel, "\n")
			}
			emit(piece{Content: rel})
			p.buf = p.buf[len(rel):]
			return out
		}
	}
}

// holdBack returns the length of the longest suffix of s that is a proper
// prefix of tag (text that may still become tag).
func holdBack(s, tag string) int {
	for n := min(len(s), len(tag)-1); n > 0; n-- {
		if strings.HasSuffix(s, tag[:n]) {
			return n
		}
	}
	return 0
}
