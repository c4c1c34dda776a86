package learn

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/trainer/engine"
	"github.com/clawmesh/clawmesh/trainer/engine/native"
	"github.com/clawmesh/clawmesh/trainer/loss"
	"github.com/clawmesh/clawmesh/trainer/sample"
	"github.com/clawmesh/clawmesh/trainer/tokenizer"
)

// The learning tests run the preference scenario on the native engine's
// tiny model (2 layers, hidden 64) with the Tiny tokenizer: a random policy
// that a user nudges towards replies that start with a word. Everything
// runs through Learner.Train on steps recorded as the gateway records them.

// learnLR is the learning rate of every scenario run here: fast enough for a
// few rounds, slow enough that on-policy distillation does not overshoot.
const learnLR = 3e-3

func tinyEngine(t testing.TB, seed uint64) (*native.Engine, *tokenizer.Tokenizer) {
	t.Helper()
	tok, err := tokenizer.Tiny(tokenizer.TinyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := native.TinyConfig(tok.VocabSize())
	id, ok := tok.TokenID("<|im_end|>")
	if !ok {
		t.Fatal("tiny tokenizer has no <|im_end|>")
	}
	cfg.EOS = []int{id}
	eng, err := native.NewTiny(cfg, seed, native.Options{Seed: seed + 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, tok
}

// hintTeacher forks eng and teaches the fork to obey DefaultHint: the
// stand-in for an instruction-following base model.
func hintTeacher(t *testing.T, eng *native.Engine, tok *tokenizer.Tokenizer) engine.Engine {
	t.Helper()
	teacher, err := eng.Fork()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teacher.Close() })
	r, err := ChatML()
	if err != nil {
		t.Fatal(err)
	}
	b := sample.NewBuilder(tok, r, sample.Options{})
	before, after, err := TeachHint(context.Background(), teacher, b, DefaultPrompts, DefaultHint, DefaultTarget, 5, engine.Recipe{LR: 1e-2})
	if err != nil {
		t.Fatal(err)
	}
	if !(after > before) || after < -1 {
		t.Fatalf("teacher did not learn the hint: log p(OK | hint) %.3f → %.3f", before, after)
	}
	return teacher
}

func meanRounds(rs []RoundReport) float64 {
	var s float64
	for _, r := range rs {
		s += r.MeanReward
	}
	return s / float64(len(rs))
}

func TestBinaryRLLearnsPreference(t *testing.T) {
	eng, tok := tinyEngine(t, 1)
	rep, err := RunPreference(context.Background(), eng, tok, PreferenceOptions{
		Seed: 7, Rounds: 8,
		Learn: Options{Recipe: loss.RecipeRL, Engine: engine.Recipe{LR: learnLR}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Rounds {
		t.Logf("round %d: mean reward %+.3f, loss %+.4f, KL %.4f, used %d (recorded logprobs %d)",
			r.Round, r.MeanReward, r.Train.Loss, r.Train.KL, r.Train.Used, r.Train.Recorded)
		if r.Train.Used != 32 || r.Train.Rewarded != 32 || r.Train.OptSteps != 1 {
			t.Fatalf("round %d: %+v", r.Round, r.Train)
		}
	}
	t.Logf("before %+v", rep.Before)
	t.Logf("after  %+v", rep.After)
	first, last := meanRounds(rep.Rounds[:3]), meanRounds(rep.Rounds[len(rep.Rounds)-3:])
	if !(last > first) {
		t.Errorf("mean reward of the last rounds %.3f not above the first rounds' %.3f", last, first)
	}
	if !(rep.After.MeanReward > rep.Before.MeanReward) {
		t.Errorf("evaluated mean reward %.3f → %.3f", rep.Before.MeanReward, rep.After.MeanReward)
	}
	if !(rep.After.PreferredProb > rep.Before.PreferredProb) {
		t.Errorf("probability of the preferred behaviour %.3f → %.3f", rep.Before.PreferredProb, rep.After.PreferredProb)
	}
	// The gateway's recordings were used, not thrown away.
	if rep.Rounds[0].Train.Recorded == 0 {
		t.Errorf("no sample used its recorded log-probs")
	}
}

// TestBinaryRLAloneLearnsPreference is live use: every reply trains alone,
// its advantage the reward minus a running baseline of recent rewards (no
// group of replies to the same prompt to compare with).
func TestBinaryRLAloneLearnsPreference(t *testing.T) {
	eng, tok := tinyEngine(t, 1)
	rep, err := RunPreference(context.Background(), eng, tok, PreferenceOptions{
		Seed: 7, Rounds: 8, Alone: true,
		Learn: Options{Recipe: loss.RecipeRL, Engine: engine.Recipe{LR: learnLR}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Rounds {
		t.Logf("round %d: mean reward %+.3f, mean advantage %+.3f", r.Round, r.MeanReward, r.Train.Advantages.MeanAdv)
	}
	t.Logf("before %+v", rep.Before)
	t.Logf("after  %+v", rep.After)
	if !(rep.After.MeanReward > rep.Before.MeanReward) || !(rep.After.PreferredProb > rep.Before.PreferredProb) {
		t.Errorf("alone: mean reward %.3f → %.3f, P(preferred) %.3f → %.3f", rep.Before.MeanReward, rep.After.MeanReward,
			rep.Before.PreferredProb, rep.After.PreferredProb)
	}
}

func TestOPDMovesTowardHint(t *testing.T) {
	eng, tok := tinyEngine(t, 2)
	teacher := hintTeacher(t, eng, tok)
	rep, err := RunPreference(context.Background(), eng, tok, PreferenceOptions{
		Seed: 7, Rounds: 8,
		Learn: Options{Recipe: loss.RecipeOPD, Teacher: teacher, OPDBound: math.Inf(1), Engine: engine.Recipe{LR: learnLR}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Rounds {
		t.Logf("round %d: mean reward %+.3f, mean advantage %+.3f, loss %+.4f, KL %.4f",
			r.Round, r.MeanReward, r.Train.Advantages.MeanAdv, r.Train.Loss, r.Train.KL)
		// No reward at all: only the hint teaches.
		if r.Train.Rewarded != 0 || r.Train.Hinted != r.Train.Used || r.Train.Used != 32 {
			t.Fatalf("round %d: %+v", r.Round, r.Train)
		}
	}
	t.Logf("before %+v", rep.Before)
	t.Logf("after  %+v", rep.After)
	if !(rep.After.TargetLogprob > rep.Before.TargetLogprob+1) {
		t.Errorf("log p(%q) without the hint %.3f → %.3f: did not rise", DefaultTarget, rep.Before.TargetLogprob, rep.After.TargetLogprob)
	}
}

// TestRecipesSideBySide runs the three recipes on the same task from the
// same starting policy and reports them (go test -v, or clawmesh bench
// learn); it asserts no margin between them.
func TestRecipesSideBySide(t *testing.T) {
	eng, tok := tinyEngine(t, 3)
	recipes := []loss.Recipe{loss.RecipeRL, loss.RecipeOPD, loss.RecipeCombined}
	cmp, err := CompareRecipes(context.Background(), eng, tok, recipes, PreferenceOptions{
		Seed: 7, Rounds: 8,
		Learn: Options{OPDBound: math.Inf(1), Engine: engine.Recipe{LR: learnLR}},
	}, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !(cmp.TeacherAfter > cmp.TeacherBefore) {
		t.Fatalf("teacher did not learn the hint: %.3f → %.3f", cmp.TeacherBefore, cmp.TeacherAfter)
	}
	for i, rep := range cmp.Reports {
		if len(rep.Rounds) != 8 || rep.Recipe != recipes[i] {
			t.Fatalf("%v: %d rounds, recipe %v", recipes[i], len(rep.Rounds), rep.Recipe)
		}
		if rep.Before != cmp.Reports[0].Before {
			t.Errorf("%v started from another policy: %+v vs %+v", rep.Recipe, rep.Before, cmp.Reports[0].Before)
		}
	}
	var b strings.Builder
	cmp.Print(&b)
	t.Log("\n" + b.String())
}
