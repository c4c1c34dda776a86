package loss

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func TestRecipeText(t *testing.T) {
	cases := map[string]Recipe{
		"rl": RecipeRL, "GRPO": RecipeRL, " binary-rl ": RecipeRL,
		"opd": RecipeOPD, "Combined": RecipeCombined, "combine": RecipeCombined,
	}
	for in, want := range cases {
		got, err := ParseRecipe(in)
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, r := range []Recipe{RecipeRL, RecipeOPD, RecipeCombined} {
		b, err := r.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got Recipe
		if err := got.UnmarshalText(b); err != nil || got != r {
			t.Errorf("%v: round trip %v %v", r, got, err)
		}
	}
	if _, err := ParseRecipe("ppo"); !errors.Is(err, ErrUnknownRecipe) {
		t.Errorf("ppo: %v", err)
	}
	if _, err := Recipe(3).MarshalText(); !errors.Is(err, ErrUnknownRecipe) {
		t.Errorf("Recipe(3): %v", err)
	}
	if s := Recipe(3).String(); s != "recipe(3)" {
		t.Errorf("String %q", s)
	}
}

func TestStale(t *testing.T) {
	cases := []struct {
		sample, current uint64
		k               int
		want            bool
	}{
		{5, 5, 0, false},
		{4, 5, 0, true},
		{4, 5, 1, false},
		{3, 5, 1, true},
		{3, 5, 2, false},
		{0, 5, 4, true},
		{6, 5, 0, false}, // from a newer version: not behind
		{4, 5, -1, true}, // negative k behaves as 0
		{5, 5, -1, false},
		{math.MaxUint64 - math.MaxInt64 - 1, math.MaxUint64, math.MaxInt64, true},
		{math.MaxUint64 - math.MaxInt64, math.MaxUint64, math.MaxInt64, false},
	}
	for _, c := range cases {
		if got := Stale(c.sample, c.current, c.k); got != c.want {
			t.Errorf("Stale(%d, %d, %d) = %v, want %v", c.sample, c.current, c.k, got, c.want)
		}
	}
}

func signals() []SampleSignal {
	return []SampleSignal{
		// 0: rewarded, alone, with a hint
		{Reward: 1, HasReward: true, Mask: []bool{true, true, false},
			TeacherLogp: []float64{-1, -3, -1}, OldLogp: []float64{-2, -2, -2}, HasHint: true},
		// 1, 2: a group of two, no hints
		{Reward: 1, HasReward: true, Group: "p", Mask: []bool{true}},
		{Reward: -1, HasReward: true, Group: "p", Mask: []bool{true, true}},
		// 3: hint only
		{Mask: []bool{true, true}, TeacherLogp: []float64{0, -9}, OldLogp: []float64{-1, -1}, HasHint: true},
		// 4: nothing
		{Mask: []bool{true}},
	}
}

func TestAdvantages(t *testing.T) {
	s := 1 / (1 + groupEps)
	cases := []struct {
		recipe                    Recipe
		want                      [][]float64
		skipped, rewarded, hinted int
		tokens                    int
		observed                  uint64
	}{
		{RecipeRL, [][]float64{{0.5, 0.5, 0}, {s}, {-s, -s}, {0, 0}, {0}}, 2, 3, 0, 5, 3},
		{RecipeOPD, [][]float64{{1, -1, 0}, {0}, {0, 0}, {1, -2}, {0}}, 3, 0, 2, 4, 0},
		{RecipeCombined, [][]float64{{1.5, -0.5, 0}, {s}, {-s, -s}, {1, -2}, {0}}, 1, 3, 2, 7, 3},
	}
	for _, c := range cases {
		t.Run(c.recipe.String(), func(t *testing.T) {
			b := Baseline{}
			b.Observe(0.5)
			got, st := Advantages(c.recipe, signals(), &b, Weights{}, 0)
			if len(got) != len(c.want) {
				t.Fatalf("%d rows", len(got))
			}
			for i := range got {
				if !slices.EqualFunc(got[i], c.want[i], func(a, b float64) bool { return near(a, b, 1e-12) }) {
					t.Errorf("sample %d: %v, want %v", i, got[i], c.want[i])
				}
			}
			if st.Samples != 5 || st.Skipped != c.skipped || st.Rewarded != c.rewarded || st.Hinted != c.hinted || st.Tokens != c.tokens {
				t.Errorf("stats %+v", st)
			}
			if st.Baseline != 0.5 || b.Count() != 1+c.observed {
				t.Errorf("baseline %v, observed %d", st.Baseline, b.Count())
			}
			var sum, abs float64
			for i := range got {
				for tk, m := range signals()[i].Mask {
					if m {
						sum += got[i][tk]
						abs += math.Abs(got[i][tk])
					}
				}
			}
			if st.Tokens > 0 && (!near(st.MeanAdv, sum/float64(st.Tokens), 1e-12) || !near(st.MeanAbsAdv, abs/float64(st.Tokens), 1e-12)) {
				t.Errorf("means %v %v", st.MeanAdv, st.MeanAbsAdv)
			}
		})
	}
}

func TestAdvantagesEdges(t *testing.T) {
	// Unknown recipe: everything skipped, shapes kept.
	got, st := Advantages(Recipe(9), signals(), nil, Weights{}, 0)
	if st.Skipped != 5 || len(got[0]) != 3 {
		t.Errorf("unknown recipe: %+v %v", st, got)
	}
	// Empty batch.
	got, st = Advantages(RecipeCombined, nil, nil, Weights{}, 0)
	if len(got) != 0 || st != (Stats{}) {
		t.Errorf("empty: %v %+v", got, st)
	}
	// nil Mask: no tokens, even for OPD (which reads a nil mask as "all").
	got, _ = Advantages(RecipeOPD, []SampleSignal{{HasHint: true, TeacherLogp: []float64{0}, OldLogp: []float64{-1}}}, nil, Weights{}, 0)
	if len(got[0]) != 0 {
		t.Errorf("nil mask: %v", got)
	}
	// The OPD bound is passed through.
	got, _ = Advantages(RecipeOPD, signals()[3:4], nil, Weights{}, 0.5)
	if !slices.Equal(got[0], []float64{0.5, -0.5}) {
		t.Errorf("bound 0.5: %v", got)
	}
}
