// Package sample owns turning recorded steps into training samples: the
// token ids of a step's context, rendered with the model's chat template,
// and of each of its actions, as the rollout recorded them or else
// rendered, a loss mask over the action, the rollout's old
// log-probabilities when they can be trusted, the reward and hint, and for
// on-policy distillation a teacher context (the hint added) followed by the
// same action tokens.
package sample

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/tokenizer"
)

var (
	// ErrNoContext is returned for a step whose request has no messages.
	ErrNoContext = errors.New("sample: step has no context messages")
	// ErrNoAction is returned for a step without an assistant action (no
	// choices, or a choice with no content, reasoning or tool call).
	ErrNoAction = errors.New("sample: step has no action")
	// ErrTooLong is returned when a sample would exceed Options.MaxTokens.
	ErrTooLong = errors.New("sample: too many tokens")
	// ErrRender is returned when the chat template fails on a step.
	ErrRender = errors.New("sample: render")
)

// Sample is one training sample: one action (choice) of one step.
type Sample struct {
	StepID core.StepID
	// Choice is the index of the choice among the step's choices.
	Choice int
	// Tokens are the prompt followed by the response.
	Tokens []int
	// PromptLen is where the response starts in Tokens.
	PromptLen int
	// LossMask is true exactly on the response: the assistant action of
	// this step up to and including the end-of-turn token, either as the
	// rollout produced it (its recorded token ids) or as the template
	// renders it (a <think> block, content, tool calls); see Build.
	LossMask []bool
	// OldLogprobs are the rollout's log-probabilities per token (len ==
	// len(Tokens), 0 on the prompt, NaN on the response tokens the rollout
	// gave none for: a recorded 0 is a token the policy was sure of), set
	// only when the choice was recorded with exact fidelity; nil means the
	// trainer must recompute them.
	OldLogprobs []float32
	Reward      float32
	HasReward   bool
	Hint        string
	// TeacherTokens, for on-policy distillation, are the teacher's prompt
	// (the context with the hint added, see Options.HintFormat) followed by
	// the same response tokens as Tokens; nil when there is no hint.
	TeacherTokens    []int
	TeacherPromptLen int
	// Group is shared by the samples of one prompt: the choices of a step
	// (n > 1) form one group. It is the step id.
	Group string
	// PolicyVersion is the adapter version that generated the action.
	PolicyVersion string
}

// ResponseLen is the number of response tokens.
func (s *Sample) ResponseLen() int { return len(s.Tokens) - s.PromptLen }

// Options configures a Builder. The zero value gives the defaults.
type Options struct {
	// MaxTokens bounds len(Tokens) and len(TeacherTokens) (0 → 32768).
	MaxTokens int
	// HintFormat turns a hint into the text appended to the content of the
	// context's last message, which is normally the user message or tool
	// result the action answers, to make the teacher's context. If the
	// last message is an assistant or system message, the hint is added as
	// a new user message instead. nil → "\n\n[Hint] " + hint.
	HintFormat func(hint string) string
}

// Builder turns steps into samples. It is safe for concurrent use.
type Builder struct {
	tok  *tokenizer.Tokenizer
	r    chat.Renderer
	opts Options
}

// NewBuilder returns a Builder rendering with r and tokenizing with tok.
func NewBuilder(tok *tokenizer.Tokenizer, r chat.Renderer, opts Options) *Builder {
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = 32768
	}
	if opts.HintFormat == nil {
		opts.HintFormat = func(h string) string { return "\n\n[Hint] " + h }
	}
	return &Builder{tok: tok, r: r, opts: opts}
}

// Build returns one sample per choice of s, in choice order.
//
// A sample's prompt is the context rendered with the generation prompt, as
// a server renders it. Its response is, for a choice recorded with exact
// fidelity, the recorded token ids themselves, followed by the template's
// end-of-turn token when the rollout left it out: the very sequence the
// model was fed and produced, the one its recorded log-probs were computed
// on. That holds whatever the template would make of the text (Qwen3's
// strips a reply's leading newlines and puts an empty <think> block before
// a reply without one; a sampled run of tokens need not be the one the
// tokenizer picks for its text). Other choices are rendered by the
// template, and their log-probs recomputed by the trainer.
//
// The exception is a request that turned thinking off
// (chat_template_kwargs.enable_thinking false, as vLLM and SGLang take it):
// the server then put the template's empty <think> block at the end of the
// generation prompt, so the model generated after it. Such a choice is
// rendered by the template, which writes the block, and its recording is
// kept where its ids are that rendering after the block (see
// oldLogprobs).
func (b *Builder) Build(s *core.Step) ([]Sample, error) {
	if s == nil || len(s.Request.Messages) == 0 {
		return nil, ErrNoContext
	}
	if len(s.Response.Choices) == 0 {
		return nil, fmt.Errorf("%w: step %s has no choices", ErrNoAction, s.ID)
	}
	var (
		reward    float32
		hasReward bool
		hint      string
	)
	if s.Reward != nil {
		if s.Reward.Value != nil {
			reward, hasReward = float32(*s.Reward.Value), true
		}
		hint = strings.TrimSpace(s.Reward.Hint)
	}
	ctx, tools := s.Request.Messages, s.Request.Tools
	var teacherPrompt []int
	if hint != "" {
		text, err := b.r.Render(b.withHint(ctx, hint), tools, true)
		if err != nil {
			return nil, fmt.Errorf("%w: step %s teacher context: %w", ErrRender, s.ID, err)
		}
		teacherPrompt = b.tok.Encode(text)
	}
	out := make([]Sample, 0, len(s.Response.Choices))
	for i, c := range s.Response.Choices {
		a := c.Message
		if a.Content == "" && a.Reasoning == "" && len(a.ToolCalls) == 0 {
			return nil, fmt.Errorf("%w: step %s choice %d is empty", ErrNoAction, s.ID, i)
		}
		a.Role = core.RoleAssistant
		prompt, completion, err := chat.ActionSpan(b.r, ctx, tools, a)
		if err != nil {
			return nil, fmt.Errorf("%w: step %s choice %d: %w", ErrRender, s.ID, i, err)
		}
		p := b.tok.Encode(prompt)
		var (
			resp []int
			old  []float32
		)
		if ids := recordedIDs(c); ids != nil && !thinkingOff(s.Request.Params) {
			// The prompt the model read, as the upstream returned it (vLLM's
			// prompt_token_ids), is exact where a re-rendered template may
			// not be.
			if pt := s.Response.PromptTokenIDs; len(pt) > 0 {
				p = slices.Clone(pt)
			}
			resp, old = b.fromRollout(ids, c, len(p))
		} else {
			if cutShort(c) {
				completion = b.withoutEnd(completion)
			}
			resp = b.tok.Encode(completion)
			old = b.oldLogprobs(c, resp, len(p))
		}
		n := len(p) + len(resp)
		if n > b.opts.MaxTokens || len(teacherPrompt)+len(resp) > b.opts.MaxTokens {
			return nil, fmt.Errorf("%w: step %s choice %d: %d tokens, teacher %d, max %d",
				ErrTooLong, s.ID, i, n, len(teacherPrompt)+len(resp), b.opts.MaxTokens)
		}
		smp := Sample{
			StepID:        s.ID,
			Choice:        i,
			Tokens:        slices.Concat(p, resp),
			PromptLen:     len(p),
			LossMask:      make([]bool, n),
			Reward:        reward,
			HasReward:     hasReward,
			Hint:          hint,
			Group:         string(s.ID),
			PolicyVersion: s.Adapter,
		}
		for j := len(p); j < n; j++ {
			smp.LossMask[j] = true
		}
		smp.OldLogprobs = old
		if teacherPrompt != nil {
			smp.TeacherTokens = slices.Concat(teacherPrompt, resp)
			smp.TeacherPromptLen = len(teacherPrompt)
		}
		out = append(out, smp)
	}
	return out, nil
}

// withHint returns a copy of ctx with the hint added (see Options.HintFormat).
func (b *Builder) withHint(ctx []core.Message, hint string) []core.Message {
	msgs := slices.Clone(ctx)
	last := &msgs[len(msgs)-1]
	if last.Role == core.RoleUser || last.Role == core.RoleTool {
		last.Content += b.opts.HintFormat(hint)
		return msgs
	}
	return append(msgs, core.Message{Role: core.RoleUser, Content: strings.TrimLeft(b.opts.HintFormat(hint), "\n")})
}

// recordedIDs returns the token ids of a choice recorded with exact
// fidelity, or nil.
func recordedIDs(c core.Choice) []int {
	if c.Fidelity != core.FidelityExact || len(c.Tokens) == 0 {
		return nil
	}
	ids := make([]int, len(c.Tokens))
	for i, t := range c.Tokens {
		if t.ID < 0 {
			return nil
		}
		ids[i] = t.ID
	}
	return ids
}

// cutShort reports whether the model did not end the reply itself: the
// upstream stopped it at its token limit. Such a reply is trained as it
// was cut, with no end-of-turn token after it: the model did not choose to
// stop there, and a reward must not teach it to.
func cutShort(c core.Choice) bool { return c.FinishReason == "length" }

// withoutEnd returns a rendered completion without the renderer's
// end-of-turn marker at its end (see chat.ActionSpan).
func (b *Builder) withoutEnd(completion string) string {
	if te, ok := b.r.(chat.TurnEnder); ok && te.EndOfTurn() != "" {
		return strings.TrimSuffix(completion, te.EndOfTurn())
	}
	return completion
}

// fromRollout makes the response of a recorded choice from its ids: the
// ids, then the end-of-turn token unless they end with it or with another
// special token (an end of sequence), or the reply was cut short. It
// returns the response and the old log-probs of a sample whose response
// starts at offset: the recorded ones, NaN for an end-of-turn token the
// rollout did not produce.
func (b *Builder) fromRollout(ids []int, c core.Choice, offset int) ([]int, []float32) {
	resp := ids
	if end, ok := b.endOfTurn(); ok && !cutShort(c) {
		if last := ids[len(ids)-1]; last != end && !b.tok.IsSpecial(last) {
			resp = append(slices.Clone(ids), end)
		}
	}
	lp := make([]float32, offset+len(resp))
	for i := offset + len(ids); i < len(lp); i++ {
		lp[i] = float32(math.NaN())
	}
	for i, t := range c.Tokens {
		lp[offset+i] = float32(t.Logprob)
	}
	return resp, lp
}

// endOfTurn returns the id of the renderer's end-of-turn token, when it
// has one that is a single token.
func (b *Builder) endOfTurn() (int, bool) {
	te, ok := b.r.(chat.TurnEnder)
	if !ok || te.EndOfTurn() == "" {
		return 0, false
	}
	if id, ok := b.tok.TokenID(te.EndOfTurn()); ok {
		return id, true
	}
	if ids := b.tok.Encode(te.EndOfTurn()); len(ids) == 1 {
		return ids[0], true
	}
	return 0, false
}

// thinkingOff reports whether request params turn the template's thinking
// off: {"chat_template_kwargs": {"enable_thinking": false}}.
func thinkingOff(params json.RawMessage) bool {
	if len(params) == 0 {
		return false
	}
	var p struct {
		Kwargs struct {
			EnableThinking *bool `json:"enable_thinking"`
		} `json:"chat_template_kwargs"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	return p.Kwargs.EnableThinking != nil && !*p.Kwargs.EnableThinking
}

// oldLogprobs aligns the rollout's token log-probabilities with the
// re-tokenized response resp (which starts at offset in the sample). The
// rollout's ids must equal resp, or resp without its final end-of-turn
// token (servers often omit the stop token), or resp after a leading
// template-inserted block that holds only tags and whitespace (the empty
// <think></think> a server puts in the generation prompt when thinking is
// off). Any other difference means the recorded tokens are not this text:
// nil.
func (b *Builder) oldLogprobs(c core.Choice, resp []int, offset int) []float32 {
	ids := recordedIDs(c)
	if ids == nil {
		return nil
	}
	for _, trimEnd := range []int{0, 1} {
		body := resp[:len(resp)-trimEnd]
		if len(ids) > len(body) {
			continue
		}
		k := len(body) - len(ids)
		if !slices.Equal(body[k:], ids) || !b.onlyMarkup(resp[:k]) {
			continue
		}
		lp := make([]float32, offset+len(resp))
		for i := offset; i < len(lp); i++ {
			lp[i] = float32(math.NaN())
		}
		for i, t := range c.Tokens {
			lp[offset+k+i] = float32(t.Logprob)
		}
		return lp
	}
	return nil
}

// onlyMarkup reports whether ids are added tokens and whitespace only.
func (b *Builder) onlyMarkup(ids []int) bool {
	for _, id := range ids {
		if !b.tok.IsAdded(id) && strings.TrimSpace(string(b.tok.TokenBytes(id))) != "" {
			return false
		}
	}
	return true
}
