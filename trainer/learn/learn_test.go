package learn

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// fakeEngine is a unit-test engine: log-probs are a fixed function of the
// token and its position (different for the base model and the adapter),
// and TrainStep records its batches.
type fakeEngine struct {
	vocab   int
	shift   float32 // distinguishes engines
	calls   []logprobCall
	batches [][]engine.TrainSample
	fail    error
	// oomAbove > 0: a step of more sequences than this in one micro-batch
	// is out of memory; micro records the micro-batch of every step asked.
	oomAbove int
	micro    []int
}

type logprobCall struct {
	seqs [][]int
	base bool
}

func (f *fakeEngine) lp(tok, pos int, base bool) float32 {
	v := -(0.1 + 0.01*float32(tok%50) + 0.001*float32(pos) + f.shift)
	if base {
		v -= 0.3
	}
	return v
}

func (f *fakeEngine) Info() engine.ModelInfo { return engine.ModelInfo{VocabSize: f.vocab} }

func (f *fakeEngine) Logprobs(_ context.Context, seqs [][]int, base bool) ([][]float32, error) {
	f.calls = append(f.calls, logprobCall{seqs, base})
	out := make([][]float32, len(seqs))
	for i, s := range seqs {
		out[i] = make([]float32, len(s))
		for t := 1; t < len(s); t++ {
			out[i][t] = f.lp(s[t], t, base)
		}
	}
	return out, nil
}

func (f *fakeEngine) TrainStep(_ context.Context, b []engine.TrainSample, rc engine.Recipe) (engine.StepStats, error) {
	if f.fail != nil {
		return engine.StepStats{}, f.fail
	}
	mb := rc.WithDefaults().MicroBatch
	f.micro = append(f.micro, mb)
	if f.oomAbove > 0 && min(mb, len(b)) > f.oomAbove {
		return engine.StepStats{}, engine.ErrOutOfMemory
	}
	f.batches = append(f.batches, slices.Clone(b))
	return engine.StepStats{Loss: float64(len(f.batches)), Tokens: len(b)}, nil
}

func (f *fakeEngine) Generate(context.Context, []int, engine.GenOptions) ([]int, []float32, error) {
	return nil, nil, errors.New("fake: no generation")
}
func (f *fakeEngine) ExportAdapter(context.Context, string) error { return nil }
func (f *fakeEngine) LoadAdapter(context.Context, string) error   { return nil }
func (f *fakeEngine) ResetAdapter() error                         { return nil }
func (f *fakeEngine) Close() error                                { return nil }

type fixture struct {
	tok *tokenizer.Tokenizer
	b   *sample.Builder
	eng *fakeEngine
	end int // <|im_end|>
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	tok, err := tokenizer.Tiny(tokenizer.TinyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ChatML()
	if err != nil {
		t.Fatal(err)
	}
	end, _ := tok.TokenID("<|im_end|>")
	return &fixture{tok: tok, b: sample.NewBuilder(tok, r, sample.Options{}), eng: &fakeEngine{vocab: tok.VocabSize()}, end: end}
}

type stepSpec struct {
	prompt, reply, adapter, hint string
	reward                       *float64
	record                       int  // 0: no tokens, 1: exact with end token, 2: exact without it
	certain                      bool // recorded log-probs of 0: the policy was sure of every token
}

func rew(v float64) *float64 { return &v }

// recordedLogprob is what the "gateway" recorded for every sampled token.
const recordedLogprob = -0.5

func (fx *fixture) step(id string, s stepSpec) *core.Step {
	c := core.Choice{Message: core.Message{Role: core.RoleAssistant, Content: s.reply}}
	if s.record > 0 {
		ids := fx.tok.Encode(s.reply)
		if s.record == 1 {
			ids = append(ids, fx.end)
		}
		lp := recordedLogprob
		if s.certain {
			lp = 0
		}
		for _, id := range ids {
			c.Tokens = append(c.Tokens, core.TokenLogprob{ID: id, Logprob: lp})
		}
		c.Fidelity = core.FidelityExact
	}
	st := &core.Step{ID: core.StepID(id), SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
		Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: s.prompt}}},
		Response: core.Response{Choices: []core.Choice{c}}, Adapter: s.adapter}
	if s.reward != nil || s.hint != "" {
		st.Reward = &core.Reward{Value: s.reward, Hint: s.hint}
	}
	return st
}

func TestTrainStalenessAndSkips(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.eng, fx.b, Options{Version: 5, Staleness: 1})
	if err != nil {
		t.Fatal(err)
	}
	steps := []*core.Step{
		fx.step("current", stepSpec{prompt: "hi", reply: "Hello", adapter: "5", reward: rew(1), record: 1}),
		fx.step("one-behind", stepSpec{prompt: "hi", reply: "Go away", adapter: "4", reward: rew(-1), record: 1}),
		fx.step("two-behind", stepSpec{prompt: "hi", reply: "Hello", adapter: "3", reward: rew(1), record: 1}),
		fx.step("unversioned", stepSpec{prompt: "hi", reply: "Hey", reward: rew(1)}),
		fx.step("no-reward", stepSpec{prompt: "hi", reply: "Hey", adapter: "v5"}),
		fx.step("hint-only", stepSpec{prompt: "hi", reply: "Hey", adapter: "5", hint: "Be brief."}),
		fx.step("empty", stepSpec{prompt: "hi", reply: "", adapter: "5", reward: rew(1)}),
		nil,
	}
	rep, err := l.Train(context.Background(), steps)
	if err != nil {
		t.Fatal(err)
	}
	want := Report{Recipe: loss.RecipeRL, Steps: 8, Samples: 6, Used: 3, Skipped: 2, BuildFailed: 1, Stale: 1, Unversioned: 1,
		Rewarded: 3, OptSteps: 1, Version: 6}
	got := Report{Recipe: rep.Recipe, Steps: rep.Steps, Samples: rep.Samples, Used: rep.Used, Skipped: rep.Skipped,
		BuildFailed: rep.BuildFailed, Stale: rep.Stale, Unversioned: rep.Unversioned, Rewarded: rep.Rewarded,
		OptSteps: rep.OptSteps, Version: rep.Version}
	if got != want {
		t.Fatalf("report\n got %+v\nwant %+v", got, want)
	}
	if math.Abs(rep.MeanReward-1.0/3) > 1e-9 {
		t.Fatalf("mean reward %v", rep.MeanReward)
	}
	if len(fx.eng.batches) != 1 || len(fx.eng.batches[0]) != 3 || l.Version() != 6 {
		t.Fatalf("%d batches, version %d", len(fx.eng.batches), l.Version())
	}
	// The same stale step is fresh again once the version is set back.
	l.SetVersion(4)
	rep, err = l.Train(context.Background(), steps[2:3])
	if err != nil || rep.Used != 1 || rep.Stale != 0 {
		t.Fatalf("after SetVersion: %+v, %v", rep, err)
	}
}

func TestTrainSkipRulesByRecipe(t *testing.T) {
	for _, tc := range []struct {
		recipe              loss.Recipe
		used, skipped, hint int
	}{
		{loss.RecipeRL, 2, 1, 0},
		{loss.RecipeOPD, 2, 1, 2},
		{loss.RecipeCombined, 3, 0, 2},
	} {
		t.Run(tc.recipe.String(), func(t *testing.T) {
			fx := newFixture(t)
			l, err := New(fx.eng, fx.b, Options{Recipe: tc.recipe})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := l.Train(context.Background(), []*core.Step{
				fx.step("reward", stepSpec{prompt: "hi", reply: "Hello", reward: rew(1)}),
				fx.step("hint", stepSpec{prompt: "hi", reply: "Hello", hint: "Say OK."}),
				fx.step("both", stepSpec{prompt: "hi", reply: "Hello", hint: "Say OK.", reward: rew(-1)}),
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Used != tc.used || rep.Skipped != tc.skipped || rep.Hinted != tc.hint {
				t.Fatalf("%+v", rep)
			}
		})
	}
}

func TestTrainOldLogprobs(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.eng, fx.b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Train(context.Background(), []*core.Step{
		fx.step("exact", stepSpec{prompt: "hi", reply: "Hello there", reward: rew(1), record: 1}),
		fx.step("cut", stepSpec{prompt: "hi", reply: "Hello there", reward: rew(1), record: 2}),
		fx.step("none", stepSpec{prompt: "hi", reply: "Hello there", reward: rew(1)}),
		// A recorded log-prob of 0 is a certainty, not a gap.
		fx.step("certain", stepSpec{prompt: "hi", reply: "Hello there", reward: rew(1), record: 1, certain: true}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Recorded != 3 || rep.Recomputed != 2 {
		t.Fatalf("recorded %d, recomputed %d", rep.Recorded, rep.Recomputed)
	}
	// One recomputation pass, with the adapter, for "cut" and "none" only.
	var policy []logprobCall
	for _, c := range fx.eng.calls {
		if !c.base {
			policy = append(policy, c)
		}
	}
	if len(policy) != 1 || len(policy[0].seqs) != 2 {
		t.Fatalf("policy logprob calls %+v", policy)
	}
	b := fx.eng.batches[0]
	for i, name := range []string{"exact", "cut", "none", "certain"} {
		s := b[i]
		last := len(s.Tokens) - 1
		for t2, m := range s.LossMask {
			if !m {
				continue
			}
			want := float32(recordedLogprob)
			if name == "certain" {
				want = 0
			}
			if name == "none" || name == "cut" && t2 == last {
				want = fx.eng.lp(s.Tokens[t2], t2, false)
			}
			if s.OldLogprobs[t2] != want {
				t.Fatalf("%s: old logprob at %d = %v, want %v", name, t2, s.OldLogprobs[t2], want)
			}
		}
		// Reference log-probs come from the base model.
		if s.RefLogprobs[last] != fx.eng.lp(s.Tokens[last], last, true) {
			t.Fatalf("%s: ref logprobs %v", name, s.RefLogprobs)
		}
	}
}

func TestTrainOPDAlignment(t *testing.T) {
	for _, ownTeacher := range []bool{false, true} {
		t.Run("teacher="+strconv.FormatBool(ownTeacher), func(t *testing.T) {
			fx := newFixture(t)
			o := Options{Recipe: loss.RecipeOPD, OPDBound: math.Inf(1)}
			teacher := fx.eng
			if ownTeacher {
				teacher = &fakeEngine{vocab: fx.eng.vocab, shift: 0.05}
				o.Teacher = teacher
			}
			l, err := New(fx.eng, fx.b, o)
			if err != nil {
				t.Fatal(err)
			}
			st := fx.step("s", stepSpec{prompt: "What time is it?", reply: "Noon", hint: "Reply with OK.", record: 1})
			rep, err := l.Train(context.Background(), []*core.Step{st})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Used != 1 || rep.Hinted != 1 {
				t.Fatalf("%+v", rep)
			}
			smps, err := fx.b.Build(st)
			if err != nil {
				t.Fatal(err)
			}
			s := smps[0]
			// The teacher scored the hint-enhanced context, base model by
			// default, its own adapter otherwise.
			var found bool
			for _, c := range teacher.calls {
				if len(c.seqs) == 1 && slices.Equal(c.seqs[0], s.TeacherTokens) {
					found = true
					if c.base == ownTeacher {
						t.Fatalf("teacher called with base=%v", c.base)
					}
				}
			}
			if !found {
				t.Fatalf("teacher never scored the teacher tokens")
			}
			adv := fx.eng.batches[0][0].Advantages
			for pos := range s.Tokens {
				want := float32(0)
				if pos >= s.PromptLen {
					j := pos - s.PromptLen
					k := s.TeacherPromptLen + j
					want = teacher.lp(s.TeacherTokens[k], k, !ownTeacher) - recordedLogprob
				}
				if math.Abs(float64(adv[pos]-want)) > 1e-6 {
					t.Fatalf("advantage at %d = %v, want %v (prompt %d, teacher prompt %d)", pos, adv[pos], want, s.PromptLen, s.TeacherPromptLen)
				}
			}
		})
	}
}

func TestTrainRLAdvantages(t *testing.T) {
	// Options{} is the default: the two steps share a prompt, so they form
	// one group.
	for _, o := range []Options{{Grouping: GroupByStep}, {}} {
		grouped := o.Grouping == GroupByContext
		fx := newFixture(t)
		l, err := New(fx.eng, fx.b, o)
		if err != nil {
			t.Fatal(err)
		}
		_, err = l.Train(context.Background(), []*core.Step{
			fx.step("a", stepSpec{prompt: "hi", reply: "Hello", reward: rew(1), record: 1}),
			fx.step("b", stepSpec{prompt: "hi", reply: "Go", reward: rew(0), record: 1}),
		})
		if err != nil {
			t.Fatal(err)
		}
		// Grouped: (r − mean)/std = ±1. Alone: r − baseline, baseline 0.
		want := [2]float32{1, 0}
		if grouped {
			want = [2]float32{1, -1}
		}
		for i, s := range fx.eng.batches[0] {
			for pos, m := range s.LossMask {
				w := float32(0)
				if m {
					w = want[i]
				}
				if math.Abs(float64(s.Advantages[pos]-w)) > 1e-5 {
					t.Fatalf("grouped=%v sample %d pos %d: advantage %v, want %v", grouped, i, pos, s.Advantages[pos], w)
				}
			}
		}
		if bl := l.Baseline(); bl.Count() != 2 {
			t.Fatalf("baseline saw %d rewards", bl.Count())
		}
	}
}

// TestTrainEpisodes: the turns of multi-turn episodes (different prompts:
// the second turn's context holds the first reply and a tool result) form
// one group per task prompt when EpisodeOf says so, and every turn of an
// episode gets its episode's advantage. Without EpisodeOf the later turns
// are alone and corrected only by the baseline.
func TestTrainEpisodes(t *testing.T) {
	for _, tagged := range []bool{true, false} {
		fx := newFixture(t)
		steps := []*core.Step{
			// Episode 0: two turns, reward 1.
			fx.step("e0t0", stepSpec{prompt: "task", reply: "call", reward: rew(1), record: 1}),
			fx.step("e0t1", stepSpec{prompt: "task call result", reply: "yes", reward: rew(1), record: 1}),
			// Episode 1: three turns, reward 0.
			fx.step("e1t0", stepSpec{prompt: "task", reply: "look", reward: rew(0), record: 1}),
			fx.step("e1t1", stepSpec{prompt: "task look seen", reply: "more", reward: rew(0), record: 1}),
			fx.step("e1t2", stepSpec{prompt: "task look seen more again", reply: "no", reward: rew(0), record: 1}),
		}
		tags := map[*core.Step][2]string{}
		for _, st := range steps {
			tags[st] = [2]string{"prompt-1", string(st.ID[:2])}
		}
		o := Options{}
		if tagged {
			o.EpisodeOf = func(st *core.Step) (string, string, bool) {
				t, ok := tags[st]
				return t[0], t[1], ok
			}
		}
		l, err := New(fx.eng, fx.b, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Train(context.Background(), steps); err != nil {
			t.Fatal(err)
		}
		// Tagged: two episodes, rewards 1 and 0: ±1 for every turn (per
		// turn, 2 against 3, it would be ±1.22 and ∓0.82). Untagged: the
		// first turns share a prompt (±1); the later turns are alone: r − 0.
		want := []float32{1, 1, -1, -1, -1}
		if !tagged {
			want = []float32{1, 1, -1, 0, 0}
		}
		for i, s := range fx.eng.batches[0] {
			for pos, m := range s.LossMask {
				if m && math.Abs(float64(s.Advantages[pos]-want[i])) > 1e-5 {
					t.Fatalf("tagged=%v: turn %d: advantage %v, want %v", tagged, i, s.Advantages[pos], want[i])
				}
			}
		}
		bl := l.Baseline()
		if n := bl.Count(); tagged && n != 2 || !tagged && n != 5 {
			t.Fatalf("tagged=%v: the baseline saw %d rewards", tagged, n)
		}
	}
}

func TestTrainEpochsAndMiniBatches(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.eng, fx.b, Options{Epochs: 2, MiniBatch: 2, Version: 3})
	if err != nil {
		t.Fatal(err)
	}
	var steps []*core.Step
	for i := range 5 {
		steps = append(steps, fx.step(strconv.Itoa(i), stepSpec{prompt: "hi", reply: "Hello " + strconv.Itoa(i), reward: rew(float64(i % 2)), record: 1}))
	}
	rep, err := l.Train(context.Background(), steps)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, b := range fx.eng.batches {
		sizes = append(sizes, len(b))
	}
	if !slices.Equal(sizes, []int{2, 2, 1, 2, 2, 1}) || rep.OptSteps != 6 || rep.Version != 4 {
		t.Fatalf("sizes %v, %+v", sizes, rep)
	}
	if rep.FirstLoss != 1 || rep.LastLoss != 6 || rep.Loss != 3.5 {
		t.Fatalf("loss %v %v %v", rep.FirstLoss, rep.LastLoss, rep.Loss)
	}
}

// A step out of memory is taken again in smaller micro-batches, which later
// steps keep; one that does not fit a single sequence fails.
func TestTrainOutOfMemory(t *testing.T) {
	fx := newFixture(t)
	fx.eng.oomAbove = 2
	l, err := New(fx.eng, fx.b, Options{Epochs: 2, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	var steps []*core.Step
	for i := range 5 {
		steps = append(steps, fx.step(strconv.Itoa(i), stepSpec{prompt: "hi", reply: "Hello " + strconv.Itoa(i), reward: rew(float64(i % 2)), record: 1}))
	}
	rep, err := l.Train(context.Background(), steps)
	if err != nil {
		t.Fatal(err)
	}
	// 8 (default) → out of memory; 5 sequences → 2, which fits; the second
	// epoch starts at 2.
	if !slices.Equal(fx.eng.micro, []int{8, 2, 2}) || rep.OptSteps != 2 || len(fx.eng.batches) != 2 {
		t.Fatalf("micro-batches %v, %+v", fx.eng.micro, rep)
	}
	fx.eng.oomAbove, fx.eng.micro = 0, nil
	fx.eng.fail = engine.ErrOutOfMemory
	if _, err := l.Train(context.Background(), steps); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("step that never fits: %v", err)
	}
}

func TestTrainNothingAndErrors(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.eng, fx.b, Options{Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Train(context.Background(), []*core.Step{fx.step("x", stepSpec{prompt: "hi", reply: "Hello"})})
	if err != nil || rep.OptSteps != 0 || rep.Skipped != 1 || l.Version() != 2 || len(fx.eng.batches) != 0 {
		t.Fatalf("%+v %v", rep, err)
	}
	boom := errors.New("boom")
	fx.eng.fail = boom
	_, err = l.Train(context.Background(), []*core.Step{fx.step("y", stepSpec{prompt: "hi", reply: "Hello", reward: rew(1)})})
	if !errors.Is(err, boom) || l.Version() != 2 {
		t.Fatalf("err %v, version %d", err, l.Version())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fx.eng.fail = nil
	if _, err := l.Train(ctx, []*core.Step{fx.step("z", stepSpec{prompt: "hi", reply: "Hello", reward: rew(1), record: 1})}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	fx := newFixture(t)
	for _, o := range []Options{
		{Recipe: loss.Recipe(9)},
		{OPDBound: -1},
		{OPDBound: math.NaN()},
		{Epochs: -1},
		{MiniBatch: -2},
		{Grouping: GroupByStep + 1},
		{Grouping: -1},
		{Weights: loss.Weights{RL: math.NaN()}},
		{Engine: engine.Recipe{LR: -1}},
	} {
		if _, err := New(fx.eng, fx.b, o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if _, err := New(nil, fx.b, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("nil engine: %v", err)
	}
	if _, err := New(fx.eng, fx.b, Options{}); err != nil {
		t.Errorf("zero options: %v", err)
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]int64{"7": 7, "v12": 12, " 3 ": 3, "": -1, "v": -1, "abc": -1, "-1": -1, "1.5": -1} {
		v, ok := ParseVersion(in)
		if got := map[bool]int64{true: int64(v), false: -1}[ok]; got != want {
			t.Errorf("ParseVersion(%q) = %d, %v", in, v, ok)
		}
	}
}

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"7", "v12", "", "v", "18446744073709551615", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := ParseVersion(s)
		if !ok {
			return
		}
		if w, ok2 := ParseVersion(strconv.FormatUint(v, 10)); !ok2 || w != v {
			t.Fatalf("%q → %d does not round-trip", s, v)
		}
	})
}
