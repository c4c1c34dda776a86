// Package chat owns turning a conversation into the exact text a model was
// trained to read: its chat template. It has a native Go renderer of Qwen3's
// ChatML template (system prompt with the tools block, <think> reasoning,
// <tool_call> and <tool_response> tags), a Jinja renderer (gonja) for the
// chat_template of any tokenizer_config.json, and ActionSpan, which finds
// where an assistant action starts and ends in the rendered text so the
// trainer can build a loss mask.
package chat

import (
	"errors"
	"fmt"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

var (
	// ErrBadJSON is returned when a tool's parameters are not valid JSON.
	ErrBadJSON = errors.New("chat: invalid JSON")
	// ErrTemplate is returned when a chat template fails to load or render.
	ErrTemplate = errors.New("chat: template")
	// ErrNotPrefix is returned by ActionSpan when the rendered prompt is not a
	// prefix of the rendered conversation with the action, so the action's
	// text cannot be located.
	ErrNotPrefix = errors.New("chat: prompt is not a prefix of the full conversation")
	// ErrNoEnd is returned by ActionSpan when the action's end-of-turn marker
	// is missing from the rendered text.
	ErrNoEnd = errors.New("chat: end of turn not found after the action")
	// ErrEmpty is returned for a conversation without messages.
	ErrEmpty = errors.New("chat: no messages")
)

// Renderer renders a conversation with a chat template.
type Renderer interface {
	// Render returns the text of msgs (and the tools offered) as the model
	// reads it. With addGenerationPrompt the text ends with the opening of
	// an assistant turn, ready for the model to continue.
	Render(msgs []core.Message, tools []core.Tool, addGenerationPrompt bool) (string, error)
}

// TurnEnder is implemented by renderers that know the text closing an
// assistant turn (Qwen's <|im_end|>), the last thing the model generates.
type TurnEnder interface {
	EndOfTurn() string
}

// ActionSpan renders context with a generation prompt, then context followed
// by action, and returns the prompt and the action's text: what follows the
// prompt up to and including the renderer's end-of-turn marker (what the
// model generated, including any template-added <think> block and the end
// token). Text the template adds after the marker (a newline) is not part of
// the action. A renderer that is not a TurnEnder yields the whole rest.
func ActionSpan(r Renderer, context []core.Message, tools []core.Tool, action core.Message) (prompt, completion string, err error) {
	prompt, err = r.Render(context, tools, true)
	if err != nil {
		return "", "", err
	}
	msgs := make([]core.Message, 0, len(context)+1)
	msgs = append(append(msgs, context...), action)
	full, err := r.Render(msgs, tools, false)
	if err != nil {
		return "", "", err
	}
	if !strings.HasPrefix(full, prompt) {
		return "", "", ErrNotPrefix
	}
	completion = full[len(prompt):]
	if te, ok := r.(TurnEnder); ok && te.EndOfTurn() != "" {
		end := te.EndOfTurn()
		i := strings.LastIndex(completion, end)
		if i < 0 {
			return "", "", fmt.Errorf("%w: %q", ErrNoEnd, end)
		}
		completion = completion[:i+len(end)]
	}
	return prompt, completion, nil
}
