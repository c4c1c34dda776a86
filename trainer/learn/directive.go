package learn

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// Directive is a kind of instruction a user gives in words ("start the
// reply with a word"), in the phrasings a hint carries it, and the test a
// reply that follows it passes.
type Directive struct {
	// Hints are the directive's phrasings, as OPD hints.
	Hints []string
	// Follows reports whether a reply does what the directive asks.
	Follows func(reply string) bool
}

// DirectiveLesson reports TeachDirective: the share of sampled replies that
// follow the directive, with one of its hints in the context and with none,
// before and after teaching.
type DirectiveLesson struct {
	HintedBefore, HintedAfter float64
	PlainBefore, PlainAfter   float64
}

// TeachDirective trains eng's adapter to follow d when one of d's hints is
// in the context (added the way b adds hints to a teacher's context), and
// to behave as before when none is. It is TeachHint for an instruction
// that many replies can follow rather than one reply to learn: the model
// samples its own replies to each prompt, and each step raises, after a
// hinted context, those that follow d (advantage +1) and lowers those that
// do not (−1), while a KL penalty holds the same replies after the plain
// context where the model had them. o.Anchors is how many replies per
// prompt, o.AnchorTokens bounds them, and o.Seed draws them.
//
// The lesson wants many prompts: on the tiny model, 36 prompts × 4 replies
// over 24 steps with a KL weight of 8 teach it to follow the hint on
// prompts it was not taught on, while with 6 prompts × 8 replies the hinted
// replies collapsed to none following d. Raising only the followers, or
// advantages centred or normalised per prompt, taught far less in the same
// steps.
//
// A tiny random model does not follow instructions; one taught this way
// stands in for an instruction-following base model, whose OPD teacher
// (the base under the hinted context) then has something to say.
func TeachDirective(ctx context.Context, eng engine.Engine, tok *tokenizer.Tokenizer, b *sample.Builder, prompts []string, d Directive, o TeachOptions) (DirectiveLesson, error) {
	o = o.withDefaults()
	var lesson DirectiveLesson
	if o.Steps < 0 || !(o.LR > 0) || o.Anchors < 1 || o.AnchorTokens < 1 || len(d.Hints) == 0 || d.Follows == nil || len(prompts) == 0 {
		return lesson, fmt.Errorf("%w: teach directive: options %+v, %d hints, %d prompts", ErrInvalidOptions, o, len(d.Hints), len(prompts))
	}
	fail := func(err error) (DirectiveLesson, error) {
		return lesson, fmt.Errorf("learn: teach directive: %w", err)
	}
	ctxs, err := directiveContexts(b, prompts, d.Hints)
	if err != nil {
		return fail(err)
	}
	var hinted, plain []engine.TrainSample
	for i, c := range ctxs {
		for k := range o.Anchors {
			ids, _, err := eng.Generate(ctx, c.plain, engine.GenOptions{MaxTokens: o.AnchorTokens, Temperature: 1,
				Seed: o.Seed ^ uint64(i)<<32 ^ uint64(k)})
			if err != nil {
				return fail(err)
			}
			if len(ids) == 0 {
				continue
			}
			adv := float32(-1)
			if d.Follows(replyText(tok, ids)) {
				adv = 1
			}
			hp := c.hinted[k%len(c.hinted)]
			hinted = append(hinted, replySample(slices.Concat(hp, ids), len(hp), adv))
			plain = append(plain, replySample(slices.Concat(c.plain, ids), len(c.plain), 0))
		}
	}
	shares := func() (h, p float64, err error) {
		if h, err = directiveShare(ctx, eng, tok, ctxs, true, d.Follows, o); err != nil {
			return 0, 0, err
		}
		p, err = directiveShare(ctx, eng, tok, ctxs, false, d.Follows, o)
		return h, p, err
	}
	err = teach(ctx, eng, hinted, plain, o, func(after bool) (err error) {
		if after {
			lesson.HintedAfter, lesson.PlainAfter, err = shares()
		} else {
			lesson.HintedBefore, lesson.PlainBefore, err = shares()
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	return lesson, nil
}

// directiveContext is one prompt rendered for generation, plainly and with
// each hint.
type directiveContext struct {
	plain  []int
	hinted [][]int
}

func directiveContexts(b *sample.Builder, prompts, hints []string) ([]directiveContext, error) {
	out := make([]directiveContext, len(prompts))
	for i, p := range prompts {
		for j, h := range hints {
			st := &core.Step{ID: core.StepID("directive-" + strconv.Itoa(i) + "-" + strconv.Itoa(j)),
				Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: p}}},
				Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "x"}}}},
				Reward:   &core.Reward{Hint: h}}
			smps, err := b.Build(st)
			if err != nil {
				return nil, err
			}
			s := smps[0]
			if s.TeacherTokens == nil {
				return nil, fmt.Errorf("empty hint %q", h)
			}
			out[i].plain = s.Tokens[:s.PromptLen]
			out[i].hinted = append(out[i].hinted, s.TeacherTokens[:s.TeacherPromptLen])
		}
	}
	return out, nil
}

// directiveShare is the share of replies, o.Anchors per prompt (each hint
// in turn when hinted), drawn with seeds apart from the teaching's, that
// follow the directive.
func directiveShare(ctx context.Context, eng engine.Engine, tok *tokenizer.Tokenizer, ctxs []directiveContext, hinted bool, follows func(string) bool, o TeachOptions) (float64, error) {
	n, ok := 0, 0
	for i, c := range ctxs {
		for k := range o.Anchors {
			p := c.plain
			if hinted {
				p = c.hinted[(i+k)%len(c.hinted)]
			}
			ids, _, err := eng.Generate(ctx, p, engine.GenOptions{MaxTokens: o.AnchorTokens, Temperature: 1,
				Seed: ^o.Seed ^ uint64(i)<<32 ^ uint64(k)})
			if err != nil {
				return 0, err
			}
			n++
			if follows(replyText(tok, ids)) {
				ok++
			}
		}
	}
	return float64(ok) / float64(max(n, 1)), nil
}

// replyText is a reply's text as a chat completion carries it: the
// decoded tokens up to the end of the turn.
func replyText(tok *tokenizer.Tokenizer, ids []int) string {
	s := tok.Decode(ids)
	if i := strings.Index(s, "<|im_end|>"); i >= 0 {
		s = s[:i]
	}
	return s
}
