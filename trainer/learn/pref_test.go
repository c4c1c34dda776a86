package learn

import (
	"context"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/engine/native/nativetest"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/tokenizer"
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
	// Two threads, whatever the machine: every run of a test is the same.
	return nativetest.Tiny(t, seed, 2)
}

// minHintGap is how much more likely, in nats, the taught base must find
// the target with the hint than without it: enough that a teacher scoring
// under the hinted context says something the plain context does not
// (observed: 25 to 35 over seeds 1–6).
const minHintGap = 10.0

// hintReader teaches a copy of the tiny model of seed to read DefaultHint
// and merges it (HintReader): a frozen base that answers DefaultTarget when
// hinted, and not otherwise.
func hintReader(t *testing.T, seed uint64) (engine.Forker, *tokenizer.Tokenizer) {
	t.Helper()
	eng, tok := tinyEngine(t, seed)
	hr, lesson, err := HintReader(context.Background(), eng, tok, PreferenceOptions{}, TeachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hr.Close() })
	t.Logf("hint lesson: log p(%q | hint) %.2f → %.2f, without the hint %.2f → %.2f",
		DefaultTarget, lesson.HintedBefore, lesson.HintedAfter, lesson.UnhintedBefore, lesson.UnhintedAfter)
	if lesson.HintedAfter < -1 || lesson.Gap() < minHintGap {
		t.Fatalf("the base did not learn to read the hint: log p(%q) %.3f with it, %.3f without (gap %.2f < %v)",
			DefaultTarget, lesson.HintedAfter, lesson.UnhintedAfter, lesson.Gap(), minHintGap)
	}
	return hr.(engine.Forker), tok
}

func meanRounds(rs []RoundReport) float64 {
	var s float64
	for _, r := range rs {
		s += r.MeanReward
	}
	return s / float64(len(rs))
}

// Binary RL must raise the evaluated mean reward (±1) and the probability
// of a preferred first token by at least these. Observed on the tiny model
// (seed 1): −0.31 → +0.81 and 0.32 → 0.92–0.95, grouped or alone.
const (
	minRewardGain = 0.25
	minPrefGain   = 0.15
)

func checkLearned(t *testing.T, rep PreferenceReport) {
	t.Helper()
	if g := rep.After.MeanReward - rep.Before.MeanReward; g < minRewardGain {
		t.Errorf("evaluated mean reward %.3f → %.3f: gained %.3f, want at least %.2f", rep.Before.MeanReward, rep.After.MeanReward, g, minRewardGain)
	}
	if g := rep.After.PreferredProb - rep.Before.PreferredProb; g < minPrefGain {
		t.Errorf("probability of the preferred behaviour %.3f → %.3f: gained %.3f, want at least %.2f",
			rep.Before.PreferredProb, rep.After.PreferredProb, g, minPrefGain)
	}
}

func TestBinaryRLLearnsPreference(t *testing.T) {
	eng, tok := tinyEngine(t, 1)
	rep, err := RunPreference(context.Background(), eng, tok, PreferenceOptions{
		Seed: 7, Rounds: 8, EvalRounds: true,
		Learn: Options{Recipe: loss.RecipeRL, Engine: engine.Recipe{LR: learnLR}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Rounds {
		t.Logf("round %d: mean reward %+.3f, loss %+.4f, KL %.4f, used %d (recorded logprobs %d), P(preferred) after %.3f",
			r.Round, r.MeanReward, r.Train.Loss, r.Train.KL, r.Train.Used, r.Train.Recorded, r.PreferredProb)
		if r.Train.Used != 32 || r.Train.Rewarded != 32 || r.Train.OptSteps != 1 {
			t.Fatalf("round %d: %+v", r.Round, r.Train)
		}
		if !(r.PreferredProb > 0 && r.PreferredProb <= 1) {
			t.Fatalf("round %d: P(preferred) after it %v", r.Round, r.PreferredProb)
		}
	}
	// The last round's curve point is the final evaluation's: the same
	// policy, measured the same way.
	if last := rep.Rounds[len(rep.Rounds)-1].PreferredProb; last != rep.After.PreferredProb {
		t.Errorf("P(preferred) after the last round %v, evaluated after the run %v", last, rep.After.PreferredProb)
	}
	t.Logf("before %+v", rep.Before)
	t.Logf("after  %+v", rep.After)
	first, last := meanRounds(rep.Rounds[:3]), meanRounds(rep.Rounds[len(rep.Rounds)-3:])
	t.Logf("mean reward of the first three rounds %+.3f, of the last three %+.3f", first, last)
	if last-first < minRewardGain {
		t.Errorf("mean reward of the last rounds %.3f not %.2f above the first rounds' %.3f", last, minRewardGain, first)
	}
	checkLearned(t, rep)
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
	checkLearned(t, rep)
}

// TestOPDMovesTowardHint is on-policy distillation with the default
// teacher: the frozen base model (one that reads the hint, see hintReader)
// scores the policy's replies under the hint-enhanced context. The policy,
// a fresh adapter on that base, never sees the hint and must move towards
// what the base does when hinted. A control run, the same but for a hint
// format that adds nothing to the teacher's context, shows that the move
// comes from the hint reaching the teacher.
func TestOPDMovesTowardHint(t *testing.T) {
	base, tok := hintReader(t, 3)
	run := func(name string, format func(string) string) PreferenceReport {
		student, err := base.Fork()
		if err != nil {
			t.Fatal(err)
		}
		defer student.Close()
		rep, err := RunPreference(context.Background(), student, tok, PreferenceOptions{
			Seed: 7, Rounds: 8, HintFormat: format,
			// Teacher nil: the frozen base; OPDBound 0: the default bound.
			Learn: Options{Recipe: loss.RecipeOPD, Engine: engine.Recipe{LR: learnLR}},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Rounds {
			t.Logf("%s round %d: mean reward %+.3f, mean advantage %+.3f, loss %+.4f, KL %.4f",
				name, r.Round, r.MeanReward, r.Train.Advantages.MeanAdv, r.Train.Loss, r.Train.KL)
			// No reward at all: only the hint teaches.
			if r.Train.Rewarded != 0 || r.Train.Hinted != r.Train.Used || r.Train.Used != 32 {
				t.Fatalf("%s round %d: %+v", name, r.Round, r.Train)
			}
		}
		t.Logf("%s before %+v", name, rep.Before)
		t.Logf("%s after  %+v", name, rep.After)
		return rep
	}
	hinted := run("hinted", nil)
	control := run("control", func(string) string { return "" })
	if hinted.Before != control.Before {
		t.Fatalf("the runs started from different policies: %+v, %+v", hinted.Before, control.Before)
	}
	rise := hinted.After.TargetLogprob - hinted.Before.TargetLogprob
	ctl := control.After.TargetLogprob - control.Before.TargetLogprob
	t.Logf("log p(%q) without the hint: %+.2f nats with the hint reaching the teacher, %+.2f without", DefaultTarget, rise, ctl)
	// Observed: a rise of 15 nats (seed 3; 3 to 17 over seeds 1–6, see
	// RATIONALE.md), and none in the control.
	if rise < 5 {
		t.Errorf("log p(%q) without the hint %.3f → %.3f: rose by %.2f nats, want at least 5",
			DefaultTarget, hinted.Before.TargetLogprob, hinted.After.TargetLogprob, rise)
	}
	if rise-ctl < 5 {
		t.Errorf("log p(%q) rose by %.2f nats with the hint and %.2f without: the hint made too little difference", DefaultTarget, rise, ctl)
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
		Learn: Options{Engine: engine.Recipe{LR: learnLR}},
	}, TeachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Lesson.Gap() < minHintGap {
		t.Fatalf("the base did not learn to read the hint: %+v", cmp.Lesson)
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
