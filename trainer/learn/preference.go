package learn

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/trainer/chat"
	"github.com/clawmesh/clawmesh/trainer/engine"
	"github.com/clawmesh/clawmesh/trainer/loss"
	"github.com/clawmesh/clawmesh/trainer/sample"
	"github.com/clawmesh/clawmesh/trainer/tokenizer"
)

// chatMLSource is plain ChatML: every turn "<|im_start|>{role}\n{content}<|im_end|>\n",
// and no reasoning block. Unlike Qwen3's template it keeps an assistant
// reply's text verbatim (Qwen3's strips leading newlines), so a tiny model's
// sampled tokens re-render to themselves.
const chatMLSource = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

// ChatML returns a plain ChatML renderer, the default of the preference
// scenario.
func ChatML() (chat.Renderer, error) {
	return chat.NewTemplate(chatMLSource, chat.TemplateOptions{EndOfTurn: "<|im_end|>"})
}

// DefaultPrompts are the user messages of the preference scenario.
var DefaultPrompts = []string{"Hi, how are you?", "What time is it?", "Can you help me?", "Tell me a joke."}

// Scenario defaults.
const (
	DefaultHint   = "Reply with OK."
	DefaultTarget = "OK"
)

// StartsWithWord is the default preference: the user likes replies that
// start straight away with a word (a letter), not with whitespace,
// punctuation or markup.
func StartsWithWord(reply string) bool {
	r, _ := utf8.DecodeRuneInString(reply)
	return r != utf8.RuneError && unicode.IsLetter(r)
}

// PreferenceOptions configures RunPreference. The zero value means the
// defaults.
type PreferenceOptions struct {
	// Prompts are the user messages the policy answers (default
	// DefaultPrompts).
	Prompts []string
	// Prefer is the user's preference: +1 for a reply it holds, −1 for one
	// it does not, as the Binary RL judge would vote (default StartsWithWord).
	Prefer func(reply string) bool
	// Hint is the OPD hint put on every step when the recipe uses OPD, as
	// the hint extractor would from the user's next message (default
	// DefaultHint).
	Hint string
	// Target is a reply whose log-probability is tracked (default
	// DefaultTarget, the reply the default hint asks for).
	Target string
	// Rounds of sample → score → Train (default 12).
	Rounds int
	// Samples is how many replies are drawn per prompt per round and per
	// evaluation (default 8).
	Samples int
	// MaxTokens bounds a reply (default 6).
	MaxTokens int
	// Temperature of sampling (0: 1).
	Temperature float64
	// Seed makes sampling reproducible; the same engine state, options and
	// seed give the same run.
	Seed uint64
	// Learn configures the Learner (its Recipe is the recipe run). A zero
	// Learn.Engine.LR means 1e-2, fit for the tiny model.
	Learn Options
	// Alone trains every reply alone against the running reward baseline,
	// as in live use; by default the replies to one prompt form a GRPO
	// group (Learn.GroupByContext).
	Alone bool
	// Renderer is the chat template (nil: ChatML).
	Renderer chat.Renderer
	// OnRound, when set, sees every round's report as it completes.
	OnRound func(RoundReport)
	// Now stamps rewards (default time.Now).
	Now func() time.Time
}

func (o PreferenceOptions) withDefaults() (PreferenceOptions, error) {
	if o.Prompts == nil {
		o.Prompts = DefaultPrompts
	}
	if o.Prefer == nil {
		o.Prefer = StartsWithWord
	}
	if o.Hint == "" {
		o.Hint = DefaultHint
	}
	if o.Target == "" {
		o.Target = DefaultTarget
	}
	if o.Rounds == 0 {
		o.Rounds = 12
	}
	if o.Samples == 0 {
		o.Samples = 8
	}
	if o.MaxTokens == 0 {
		o.MaxTokens = 6
	}
	if o.Temperature == 0 {
		o.Temperature = 1
	}
	if o.Learn.Engine.LR == 0 {
		o.Learn.Engine.LR = 1e-2
	}
	o.Learn.GroupByContext = o.Learn.GroupByContext || !o.Alone
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Renderer == nil {
		r, err := ChatML()
		if err != nil {
			return o, err
		}
		o.Renderer = r
	}
	switch {
	case len(o.Prompts) == 0, o.Rounds < 0, o.Samples < 1, o.MaxTokens < 1, !(o.Temperature > 0):
		return o, fmt.Errorf("%w: preference options %d prompts, %d rounds, %d samples, %d max tokens, temperature %v",
			ErrInvalidOptions, len(o.Prompts), o.Rounds, o.Samples, o.MaxTokens, o.Temperature)
	}
	return o, nil
}

// Eval measures the policy on the scenario.
type Eval struct {
	// MeanReward is the mean ±1 reward of Samples replies per prompt drawn
	// from the policy.
	MeanReward float64
	// PreferredProb is, averaged over prompts, the policy's probability that
	// the reply's first token already satisfies the preference (Prefer of
	// that token's text), computed exactly from Logprobs over the whole
	// vocabulary.
	PreferredProb float64
	// TargetLogprob is, averaged over prompts, the policy's log-probability
	// of replying exactly Target (end-of-turn included), with no hint in the
	// context.
	TargetLogprob float64
}

// RoundReport is one round of the scenario.
type RoundReport struct {
	Round int
	// MeanReward is the mean reward of the round's replies, sampled from
	// the policy before the round's update.
	MeanReward float64
	Train      Report
}

// PreferenceReport is the outcome of RunPreference.
type PreferenceReport struct {
	Recipe        loss.Recipe
	Before, After Eval
	Rounds        []RoundReport
}

// RunPreference is the learning scenario: a user with a preference (by
// default, replies that start with a word) talks to the policy of eng. Each
// round draws Samples replies per prompt at the given temperature, records
// each as a step the way the gateway does (token ids and log-probs with
// exact fidelity, the adapter version that served it), scores it ±1 by the
// preference and, when the recipe uses OPD, attaches the hint, then trains
// on the round's steps with a Learner. The policy is evaluated before the
// first round and after the last. eng's adapter is trained in place.
func RunPreference(ctx context.Context, eng engine.Engine, tok *tokenizer.Tokenizer, o PreferenceOptions) (PreferenceReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return PreferenceReport{}, err
	}
	b := sample.NewBuilder(tok, o.Renderer, sample.Options{})
	l, err := New(eng, b, o.Learn)
	if err != nil {
		return PreferenceReport{}, err
	}
	sc := &scenario{eng: eng, tok: tok, b: b, o: o}
	if id, ok := tok.TokenID("<|im_end|>"); ok {
		sc.stop = []int{id}
	}
	if err := sc.prepare(); err != nil {
		return PreferenceReport{}, err
	}
	rep := PreferenceReport{Recipe: o.Learn.Recipe}
	if rep.Before, err = sc.eval(ctx, 0); err != nil {
		return rep, err
	}
	useRL := o.Learn.Recipe == loss.RecipeRL || o.Learn.Recipe == loss.RecipeCombined
	useOPD := o.Learn.Recipe == loss.RecipeOPD || o.Learn.Recipe == loss.RecipeCombined
	for round := 1; round <= o.Rounds; round++ {
		steps, mean, err := sc.rollout(ctx, round, l.Version())
		if err != nil {
			return rep, err
		}
		for _, st := range steps {
			r := st.Reward
			if !useRL {
				r.Value = nil
				r.Scores = nil
			}
			if useOPD {
				r.Hint = o.Hint
			}
		}
		tr, err := l.Train(ctx, steps)
		if err != nil {
			return rep, fmt.Errorf("learn: round %d: %w", round, err)
		}
		rr := RoundReport{Round: round, MeanReward: mean, Train: tr}
		rep.Rounds = append(rep.Rounds, rr)
		if o.OnRound != nil {
			o.OnRound(rr)
		}
	}
	if rep.After, err = sc.eval(ctx, o.Rounds+1); err != nil {
		return rep, err
	}
	return rep, nil
}

type scenario struct {
	eng  engine.Engine
	tok  *tokenizer.Tokenizer
	b    *sample.Builder
	o    PreferenceOptions
	stop []int

	prompts   [][]int // generation prompt of each prompt
	preferred []bool  // Prefer of each token's text, by id
	targets   []sample.Sample
}

func (sc *scenario) messages(p string) []core.Message {
	return []core.Message{{Role: core.RoleUser, Content: p}}
}

// prepare renders the prompts, classifies the vocabulary by the preference
// and builds the target reply's samples.
func (sc *scenario) prepare() error {
	for i, p := range sc.o.Prompts {
		text, err := sc.o.Renderer.Render(sc.messages(p), nil, true)
		if err != nil {
			return fmt.Errorf("learn: render prompt %d: %w", i, err)
		}
		sc.prompts = append(sc.prompts, sc.tok.Encode(text))
		st := &core.Step{ID: core.StepID("target-" + strconv.Itoa(i)), Request: core.Request{Messages: sc.messages(p)},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: sc.o.Target}}}}}
		smps, err := sc.b.Build(st)
		if err != nil {
			return fmt.Errorf("learn: target reply: %w", err)
		}
		sc.targets = append(sc.targets, smps[0])
	}
	vocab := sc.eng.Info().VocabSize
	sc.preferred = make([]bool, vocab)
	for id := range vocab {
		sc.preferred[id] = !sc.tok.IsSpecial(id) && sc.o.Prefer(sc.tok.Decode([]int{id}))
	}
	return nil
}

// seed mixes the scenario seed with a round, prompt and sample index
// (splitmix64), so every reply is drawn from its own reproducible stream.
func (sc *scenario) seed(round, prompt, i int) uint64 {
	z := sc.o.Seed ^ uint64(round)<<40 ^ uint64(prompt)<<20 ^ uint64(i)
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// rollout draws Samples replies per prompt and records each as a scored
// step served by policy version v. It returns the steps and their mean
// reward.
func (sc *scenario) rollout(ctx context.Context, round int, v uint64) ([]*core.Step, float64, error) {
	var steps []*core.Step
	var sum float64
	for pi, prompt := range sc.prompts {
		for i := range sc.o.Samples {
			ids, lps, err := sc.eng.Generate(ctx, prompt, engine.GenOptions{
				MaxTokens: sc.o.MaxTokens, Temperature: sc.o.Temperature,
				Seed: sc.seed(round, pi, i), Stop: sc.stop,
			})
			if err != nil {
				return nil, 0, fmt.Errorf("learn: generate: %w", err)
			}
			finish, body := "length", ids
			if n := len(ids); n > 0 && sc.isStop(ids[n-1]) {
				finish, body = "stop", ids[:n-1]
			}
			reply := sc.tok.Decode(body)
			toks := make([]core.TokenLogprob, len(ids))
			for k, id := range ids {
				toks[k] = core.TokenLogprob{Token: sc.tok.Decode([]int{id}), ID: id, Logprob: float64(lps[k])}
			}
			r := -1.0
			if sc.o.Prefer(reply) {
				r = 1
			}
			sum += r
			id := fmt.Sprintf("round%d-prompt%d-reply%d", round, pi, i)
			steps = append(steps, &core.Step{
				ID:        core.StepID(id),
				SessionID: core.SessionID(id),
				Turn:      core.TurnMain,
				API:       core.APIChat,
				State:     core.StateScored,
				Request:   core.Request{Messages: sc.messages(sc.o.Prompts[pi])},
				Response: core.Response{Choices: []core.Choice{{
					Message:      core.Message{Role: core.RoleAssistant, Content: reply},
					FinishReason: finish,
					Tokens:       toks,
					Fidelity:     core.FidelityExact,
				}}},
				Adapter: strconv.FormatUint(v, 10),
				Reward: &core.Reward{Value: &r, At: sc.o.Now(),
					Scores: []core.Score{{Plugin: "preference", Value: &r, Weight: 1}}},
			})
		}
	}
	return steps, sum / float64(len(steps)), nil
}

func (sc *scenario) isStop(id int) bool {
	for _, s := range sc.stop {
		if s == id {
			return true
		}
	}
	return false
}

// eval measures the current policy; round picks the sampling streams.
func (sc *scenario) eval(ctx context.Context, round int) (Eval, error) {
	var ev Eval
	_, mean, err := sc.rollout(ctx, -1-round, 0)
	if err != nil {
		return ev, err
	}
	ev.MeanReward = mean
	// First-token distribution: the prompt followed by every token id.
	vocab := len(sc.preferred)
	for _, prompt := range sc.prompts {
		seqs := make([][]int, vocab)
		for id := range vocab {
			seqs[id] = append(append(make([]int, 0, len(prompt)+1), prompt...), id)
		}
		lps, err := sc.eng.Logprobs(ctx, seqs, false)
		if err != nil {
			return ev, fmt.Errorf("learn: eval: %w", err)
		}
		var p float64
		for id, lp := range lps {
			if sc.preferred[id] {
				p += math.Exp(float64(lp[len(prompt)]))
			}
		}
		ev.PreferredProb += p / float64(len(sc.prompts))
	}
	seqs := make([][]int, len(sc.targets))
	for i, s := range sc.targets {
		seqs[i] = s.Tokens
	}
	lps, err := sc.eng.Logprobs(ctx, seqs, false)
	if err != nil {
		return ev, fmt.Errorf("learn: eval: %w", err)
	}
	for i, s := range sc.targets {
		for t, m := range s.LossMask {
			if m {
				ev.TargetLogprob += float64(lps[i][t]) / float64(len(sc.targets))
			}
		}
	}
	return ev, nil
}

// TeachHint trains eng's adapter to answer reply to each prompt when the
// context carries hint (added the way sample.Builder adds hints), by
// maximising the reply's likelihood: clipped policy-gradient steps with
// advantage 1 on the reply's tokens. A tiny random base model cannot read a
// hint; an engine taught this way stands in for an instruction-following
// model as the OPD teacher (Options.Teacher). It returns the reply's mean
// log-probability under the hinted contexts before and after.
func TeachHint(ctx context.Context, eng engine.Engine, b *sample.Builder, prompts []string, hint, reply string, steps int, rc engine.Recipe) (before, after float64, err error) {
	var batch []engine.TrainSample
	for i, p := range prompts {
		st := &core.Step{ID: core.StepID("hint-" + strconv.Itoa(i)),
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: p}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: reply}}}},
			Reward:   &core.Reward{Hint: hint}}
		smps, err := b.Build(st)
		if err != nil {
			return 0, 0, fmt.Errorf("learn: teach hint: %w", err)
		}
		s := smps[0]
		n := len(s.TeacherTokens)
		ts := engine.TrainSample{Tokens: s.TeacherTokens, LossMask: make([]bool, n), Advantages: make([]float32, n)}
		for t := s.TeacherPromptLen; t < n; t++ {
			ts.LossMask[t], ts.Advantages[t] = true, 1
		}
		batch = append(batch, ts)
	}
	mean := func() (float64, error) {
		seqs := make([][]int, len(batch))
		for i, s := range batch {
			seqs[i] = s.Tokens
		}
		lps, err := eng.Logprobs(ctx, seqs, false)
		if err != nil {
			return 0, err
		}
		var m float64
		for i, s := range batch {
			for t, on := range s.LossMask {
				if on {
					m += float64(lps[i][t]) / float64(len(batch))
				}
			}
		}
		return m, nil
	}
	if before, err = mean(); err != nil {
		return 0, 0, fmt.Errorf("learn: teach hint: %w", err)
	}
	for range steps {
		if _, err := eng.TrainStep(ctx, batch, rc); err != nil {
			return before, 0, fmt.Errorf("learn: teach hint: %w", err)
		}
	}
	if after, err = mean(); err != nil {
		return before, 0, fmt.Errorf("learn: teach hint: %w", err)
	}
	return before, after, nil
}

// Comparison is the preference scenario run once per recipe, each run from
// the same starting policy.
type Comparison struct {
	Reports []PreferenceReport
	// TeacherBefore and TeacherAfter are the teacher's log p(Target | hint)
	// before and after it was taught the hint (both 0 when none was).
	TeacherBefore, TeacherAfter float64
}

// CompareRecipes runs RunPreference with o once per recipe, each time on a
// fork of base (so every run starts from base's policy as it is, and base
// is not trained). With teach > 0, one more fork is first taught to obey
// o.Hint by TeachHint (teach steps) and scores OPD as the teacher: the
// stand-in for an instruction-following base model, which a random tiny
// model is not; o.Learn.Teacher, if set, is used as it is instead.
func CompareRecipes(ctx context.Context, base engine.Forker, tok *tokenizer.Tokenizer, recipes []loss.Recipe, o PreferenceOptions, teach int) (Comparison, error) {
	var cmp Comparison
	o, err := o.withDefaults()
	if err != nil {
		return cmp, err
	}
	if o.Learn.Teacher == nil && teach > 0 {
		teacher, err := base.Fork()
		if err != nil {
			return cmp, err
		}
		defer teacher.Close()
		b := sample.NewBuilder(tok, o.Renderer, sample.Options{})
		cmp.TeacherBefore, cmp.TeacherAfter, err = TeachHint(ctx, teacher, b, o.Prompts, o.Hint, o.Target, teach, engine.Recipe{LR: 1e-2})
		if err != nil {
			return cmp, fmt.Errorf("learn: teaching the teacher: %w", err)
		}
		o.Learn.Teacher = teacher
	}
	for _, rc := range recipes {
		student, err := base.Fork()
		if err != nil {
			return cmp, err
		}
		ro := o
		ro.Learn.Recipe = rc
		rep, err := RunPreference(ctx, student, tok, ro)
		student.Close()
		if err != nil {
			return cmp, fmt.Errorf("learn: recipe %v: %w", rc, err)
		}
		cmp.Reports = append(cmp.Reports, rep)
	}
	return cmp, nil
}

// Print writes the comparison as a table: per recipe, the mean reward, the
// probability of a preferred first token and log p(Target) without the hint,
// before → after.
func (c Comparison) Print(w io.Writer) {
	fmt.Fprintf(w, "%-9s %22s %26s %22s\n", "recipe", "mean reward", "P(preferred first token)", "log p(target)")
	for _, r := range c.Reports {
		b, a := r.Before, r.After
		fmt.Fprintf(w, "%-9v %+9.3f → %+9.3f %11.3f → %11.3f %9.2f → %9.2f\n", r.Recipe,
			b.MeanReward, a.MeanReward, b.PreferredProb, a.PreferredProb, b.TargetLogprob, a.TargetLogprob)
	}
}
