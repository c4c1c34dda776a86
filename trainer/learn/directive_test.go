package learn

import (
	"context"
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/model/chat"
	simscenario "github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// startsWithLetter is the directive's test: an a-z or A-Z first byte.
func startsWithLetter(s string) bool {
	return s != "" && (s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z')
}

// TestTeachDirective teaches the tiny model to start its reply with a word
// when a hint asks for it, as the demo teaches its base model, and checks
// that it then does so on prompts it was not taught on, while without a
// hint it behaves much as before.
func TestTeachDirective(t *testing.T) {
	ctx := context.Background()
	eng, tok := tinyEngine(t, 1)
	b := sample.NewBuilder(tok, chat.Qwen3(), sample.Options{})
	d := Directive{Hints: simscenario.WordHints, Follows: startsWithLetter}
	taught := simscenario.TeachPrompts
	other := []string{"What time is it?", "Tell me a joke.", "Summarise this log.", "Write a haiku.", "Where are my keys?", "Suggest a book."}
	o := TeachOptions{Steps: 24, Anchors: 4, AnchorTokens: 6, Seed: 1, KLCoef: 8}

	pupil, err := eng.Fork()
	if err != nil {
		t.Fatal(err)
	}
	defer pupil.Close()
	lesson, err := TeachDirective(ctx, pupil, tok, b, taught, d, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("taught prompts: %+v", lesson)
	if lesson.HintedBefore > 0.5 || lesson.HintedAfter < 0.8 {
		t.Errorf("with the hint, %.2f -> %.2f of the replies start with a word; want a random model's share to rise past 0.8", lesson.HintedBefore, lesson.HintedAfter)
	}
	if d := lesson.PlainAfter - lesson.PlainBefore; d > 0.2 || d < -0.2 {
		t.Errorf("without the hint the share moved %.2f -> %.2f: the lesson leaks into the plain context", lesson.PlainBefore, lesson.PlainAfter)
	}

	// Prompts it was not taught on.
	ctxs, err := directiveContexts(b, other, d.Hints)
	if err != nil {
		t.Fatal(err)
	}
	m := o.withDefaults()
	m.Seed = 77
	hinted, err := directiveShare(ctx, pupil, tok, ctxs, true, d.Follows, m)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := directiveShare(ctx, pupil, tok, ctxs, false, d.Follows, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("other prompts: hinted %.2f, plain %.2f", hinted, plain)
	if hinted < 0.75 || hinted-plain < 0.4 {
		t.Errorf("on prompts not taught: %.2f start with a word with the hint, %.2f without", hinted, plain)
	}

	// The engine it was forked from is untouched.
	before, err := directiveShare(ctx, eng, tok, ctxs, true, d.Follows, m)
	if err != nil {
		t.Fatal(err)
	}
	if before > 0.5 {
		t.Errorf("the untaught engine follows the hint %.2f of the time", before)
	}

	for _, bad := range []struct {
		prompts []string
		d       Directive
		o       TeachOptions
	}{
		{nil, d, o},
		{taught, Directive{Follows: startsWithLetter}, o},
		{taught, Directive{Hints: d.Hints}, o},
		{taught, d, TeachOptions{Anchors: -1}},
		{taught, d, TeachOptions{LR: -1}},
	} {
		if _, err := TeachDirective(ctx, pupil, tok, b, bad.prompts, bad.d, bad.o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%d prompts, %d hints, follows %v, %+v: %v", len(bad.prompts), len(bad.d.Hints), bad.d.Follows != nil, bad.o, err)
		}
	}
}
