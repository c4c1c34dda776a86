package learn

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/clawmesh/clawmesh/trainer/sample"
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
	// as in live use (Learn.Grouping = GroupByStep); by default the replies
	// to one prompt form a GRPO group (Learn.Grouping's default).
	Alone bool
	// Renderer is the chat template (nil: ChatML).
	Renderer chat.Renderer
	// HintFormat turns the hint into the text added to the teacher's
	// context (sample.Options.HintFormat; nil: sample's default). A format
	// that returns "" gives the teacher the student's own context: the
	// control of the OPD tests.
	HintFormat func(hint string) string
	// OnRound, when set, sees every round's report as it completes.
	OnRound func(RoundReport)
	// EvalRounds computes RoundReport.PreferredProb after every round: the
	// learning curve, at the cost of a forward pass over the vocabulary per
	// prompt each round.
	EvalRounds bool
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
	if o.Alone {
		o.Learn.Grouping = GroupByStep
	}
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

func (o PreferenceOptions) builder(tok *tokenizer.Tokenizer) *sample.Builder {
	return sample.NewBuilder(tok, o.Renderer, sample.Options{HintFormat: o.HintFormat})
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
	// PreferredProb is Eval.PreferredProb after the round's update, when
	// PreferenceOptions.EvalRounds is set (else 0).
	PreferredProb float64
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
	b := o.builder(tok)
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
		if o.EvalRounds {
			if rr.PreferredProb, err = sc.preferredProb(ctx); err != nil {
				return rep, err
			}
		}
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
	if ev.PreferredProb, err = sc.preferredProb(ctx); err != nil {
		return ev, err
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

// preferredProb is, averaged over the prompts, the policy's exact
// probability that the reply's first token satisfies the preference.
func (sc *scenario) preferredProb(ctx context.Context) (float64, error) {
	// First-token distribution: the prompt followed by every token id.
	vocab := len(sc.preferred)
	var mean float64
	for _, prompt := range sc.prompts {
		seqs := make([][]int, vocab)
		for id := range vocab {
			seqs[id] = append(append(make([]int, 0, len(prompt)+1), prompt...), id)
		}
		lps, err := sc.eng.Logprobs(ctx, seqs, false)
		if err != nil {
			return 0, fmt.Errorf("learn: eval: %w", err)
		}
		var p float64
		for id, lp := range lps {
			if sc.preferred[id] {
				p += math.Exp(float64(lp[len(prompt)]))
			}
		}
		mean += p / float64(len(sc.prompts))
	}
	return mean, nil
}

// HintLesson reports TeachHint: the reply's mean log-probability over the
// prompts with the hint in the context and without it, before and after.
type HintLesson struct {
	HintedBefore, HintedAfter     float64
	UnhintedBefore, UnhintedAfter float64
}

// Gap is how much more likely the reply is with the hint than without it
// after teaching (nats): how well the taught model reads the hint.
func (h HintLesson) Gap() float64 { return h.HintedAfter - h.UnhintedAfter }

// TeachOptions configures TeachHint. The zero value means the defaults.
type TeachOptions struct {
	// Steps is how many optimizer steps teach (default 12).
	Steps int
	// LR is the learning rate (default 3e-3).
	LR float64
	// Anchors is how many of its own replies per prompt the model samples
	// before teaching, to hold its behaviour without the hint (default 8).
	Anchors int
	// AnchorTokens bounds an anchor reply (default 6).
	AnchorTokens int
	// Seed draws the anchor replies.
	Seed uint64
	// KLCoef weighs the penalty that holds the replies without the hint
	// (default 1).
	KLCoef float64
}

func (o TeachOptions) withDefaults() TeachOptions {
	if o.Steps == 0 {
		o.Steps = 12
	}
	if o.LR == 0 {
		o.LR = 3e-3
	}
	if o.Anchors == 0 {
		o.Anchors = 8
	}
	if o.AnchorTokens == 0 {
		o.AnchorTokens = 6
	}
	if o.KLCoef == 0 {
		o.KLCoef = 1
	}
	return o
}

// TeachHint trains eng's adapter to answer reply to each prompt when the
// context carries hint (added the way b adds hints to a teacher's
// context), and only then. Each step raises the reply's likelihood after
// the hinted context (advantage +1) and holds, with a KL penalty towards
// the policy eng had before teaching, the likelihood of the reply and of
// the model's own sampled replies after the plain context: what the model
// learns is to read the hint, not to say reply whatever it is asked, and
// without the hint it behaves as it did. A tiny random model cannot read a
// hint; one taught this way stands in for an instruction-following model
// (see HintReader).
func TeachHint(ctx context.Context, eng engine.Engine, b *sample.Builder, prompts []string, hint, reply string, o TeachOptions) (HintLesson, error) {
	o = o.withDefaults()
	var lesson HintLesson
	if o.Steps < 0 || !(o.LR > 0) || o.Anchors < 0 || o.AnchorTokens < 1 {
		return lesson, fmt.Errorf("%w: teach options %+v", ErrInvalidOptions, o)
	}
	fail := func(err error) (HintLesson, error) { return lesson, fmt.Errorf("learn: teach hint: %w", err) }
	var hinted, plain, anchors []engine.TrainSample
	for i, p := range prompts {
		st := &core.Step{ID: core.StepID("hint-" + strconv.Itoa(i)),
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: p}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: reply}}}},
			Reward:   &core.Reward{Hint: hint}}
		smps, err := b.Build(st)
		if err != nil {
			return fail(err)
		}
		s := smps[0]
		if s.TeacherTokens == nil {
			return fail(fmt.Errorf("empty hint %q", hint))
		}
		hinted = append(hinted, replySample(s.TeacherTokens, s.TeacherPromptLen, 1))
		plain = append(plain, replySample(s.Tokens, s.PromptLen, 0))
		prompt := s.Tokens[:s.PromptLen]
		for k := range o.Anchors {
			ids, _, err := eng.Generate(ctx, prompt, engine.GenOptions{MaxTokens: o.AnchorTokens, Temperature: 1,
				Seed: o.Seed ^ uint64(i)<<32 ^ uint64(k)})
			if err != nil {
				return fail(err)
			}
			if len(ids) > 0 {
				anchors = append(anchors, replySample(slices.Concat(prompt, ids), len(prompt), 0))
			}
		}
	}
	means := func() (h, u float64, err error) {
		if h, err = replyLogprobs(ctx, eng, hinted); err != nil {
			return 0, 0, err
		}
		u, err = replyLogprobs(ctx, eng, plain)
		return h, u, err
	}
	err := teach(ctx, eng, hinted, slices.Concat(plain, anchors), o, func(after bool) (err error) {
		if after {
			lesson.HintedAfter, lesson.UnhintedAfter, err = means()
		} else {
			lesson.HintedBefore, lesson.UnhintedBefore, err = means()
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	return lesson, nil
}

// teach holds held (advantage 0) where eng's policy has them now, then
// takes o.Steps optimizer steps on raised and held together, with the KL
// penalty o.KLCoef towards that policy on held; measure runs before the
// steps and after them.
func teach(ctx context.Context, eng engine.Engine, raised, held []engine.TrainSample, o TeachOptions, measure func(after bool) error) error {
	seqs := make([][]int, len(held))
	for i, s := range held {
		seqs[i] = s.Tokens
	}
	refs, err := eng.Logprobs(ctx, seqs, false)
	if err != nil {
		return err
	}
	for i := range held {
		held[i].RefLogprobs = refs[i]
	}
	if err := measure(false); err != nil {
		return err
	}
	rc := engine.Recipe{LR: o.LR, Loss: loss.Config{KLCoef: o.KLCoef}}
	batch := slices.Concat(raised, held)
	for range o.Steps {
		if _, err := eng.TrainStep(ctx, batch, rc); err != nil {
			return err
		}
	}
	return measure(true)
}

// replySample trains tokens[promptLen:] with advantage adv.
func replySample(tokens []int, promptLen int, adv float32) engine.TrainSample {
	n := len(tokens)
	ts := engine.TrainSample{Tokens: tokens, LossMask: make([]bool, n), Advantages: make([]float32, n)}
	for t := promptLen; t < n; t++ {
		ts.LossMask[t], ts.Advantages[t] = true, adv
	}
	return ts
}

// replyLogprobs returns the policy's log-probability of the samples' masked
// tokens, averaged over the samples.
func replyLogprobs(ctx context.Context, eng engine.Engine, batch []engine.TrainSample) (float64, error) {
	seqs := make([][]int, len(batch))
	for i, s := range batch {
		seqs[i] = s.Tokens
	}
	lps, err := eng.Logprobs(ctx, seqs, false)
	if err != nil {
		return 0, err
	}
	var mean float64
	for i, s := range batch {
		for t, on := range s.LossMask {
			if on {
				mean += float64(lps[i][t]) / float64(len(batch))
			}
		}
	}
	return mean, nil
}

// HintReader returns a new engine whose frozen base model reads o's hint:
// a fork of base is taught by TeachHint (with t) and its adapter merged into the weights (engine.Merger). It stands in for
// the instruction-following base model of a real deployment. On it, OPD
// with the default teacher (Options.Teacher nil) scores with that frozen
// base under the hinted context, while the policy, its fresh adapter,
// starts from the base's behaviour without the hint: the setting in which
// the base is the teacher and its scores never go stale. base's forks
// must be engine.Mergers (the native engine's are); base is not
// changed.
func HintReader(ctx context.Context, base engine.Forker, tok *tokenizer.Tokenizer, o PreferenceOptions, t TeachOptions) (engine.Engine, HintLesson, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, HintLesson{}, err
	}
	pupil, err := base.Fork()
	if err != nil {
		return nil, HintLesson{}, err
	}
	defer pupil.Close()
	mg, ok := pupil.(engine.Merger)
	if !ok {
		return nil, HintLesson{}, fmt.Errorf("%w: %T cannot merge its adapter", ErrInvalidOptions, pupil)
	}
	lesson, err := TeachHint(ctx, pupil, o.builder(tok), o.Prompts, o.Hint, o.Target, t)
	if err != nil {
		return nil, lesson, err
	}
	merged, err := mg.MergeAdapter()
	if err != nil {
		return nil, lesson, fmt.Errorf("learn: merge the taught adapter: %w", err)
	}
	return merged, lesson, nil
}

// Comparison is the preference scenario run once per recipe, each run from
// the same starting policy.
type Comparison struct {
	Reports []PreferenceReport
	// Lesson is how the base model was taught the hint (zero when it was
	// not).
	Lesson HintLesson
}

// CompareRecipes runs RunPreference with o once per recipe, each time on a
// fork of the same engine (so every run starts from the same policy, and
// base is not trained). Unless o.Learn.Teacher is set, that engine is
// HintReader(base, teach): a base model that reads the hint, so that OPD's
// default teacher, the frozen base, has something to teach. With
// o.Learn.Teacher set it is base, and the teacher is used as it is.
func CompareRecipes(ctx context.Context, base engine.Forker, tok *tokenizer.Tokenizer, recipes []loss.Recipe, o PreferenceOptions, teach TeachOptions) (Comparison, error) {
	var cmp Comparison
	o, err := o.withDefaults()
	if err != nil {
		return cmp, err
	}
	from := base
	if o.Learn.Teacher == nil {
		hr, lesson, err := HintReader(ctx, base, tok, o, teach)
		if err != nil {
			return cmp, fmt.Errorf("learn: teaching the base the hint: %w", err)
		}
		defer hr.Close()
		cmp.Lesson = lesson
		var ok bool
		if from, ok = hr.(engine.Forker); !ok {
			return cmp, fmt.Errorf("%w: %T cannot fork", ErrInvalidOptions, hr)
		}
	}
	for _, rc := range recipes {
		student, err := from.Fork()
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
