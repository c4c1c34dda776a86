package loss

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
)

func TestBaselineEMA(t *testing.T) {
	var b Baseline // zero value: EMA with decay 0.9
	if b.Value() != 0 || b.Count() != 0 {
		t.Fatalf("empty baseline %v", b.Value())
	}
	b.Observe(1)
	if !near(b.Value(), 1, tol) { // bias-corrected: the first reward itself
		t.Errorf("after 1: %v", b.Value())
	}
	b.Observe(0)
	// weights 0.9·0.1 for the older, 0.1 for the newer, normalised: 0.09/0.19
	if !near(b.Value(), 0.09/0.19, tol) {
		t.Errorf("after 1, 0: %v", b.Value())
	}
	b.Observe(math.NaN())
	b.Observe(math.Inf(1))
	if b.Count() != 2 || !near(b.Value(), 0.09/0.19, tol) {
		t.Errorf("non-finite rewards changed the baseline: %d %v", b.Count(), b.Value())
	}
	// A long run of one value converges to it.
	for range 200 {
		b.Observe(-0.5)
	}
	if !near(b.Value(), -0.5, 1e-6) {
		t.Errorf("converged to %v", b.Value())
	}

	c := Baseline{Decay: 0.5}
	c.Observe(1)
	c.Observe(-1)
	if !near(c.Value(), (0.25-0.5)/0.75, tol) {
		t.Errorf("decay 0.5: %v", c.Value())
	}
	bad := Baseline{Decay: 1.5} // out of range: the default decay
	bad.Observe(1)
	bad.Observe(0)
	if !near(bad.Value(), 0.09/0.19, tol) {
		t.Errorf("decay 1.5: %v", bad.Value())
	}
}

func TestBaselineWindow(t *testing.T) {
	b := Baseline{Window: 3}
	for i, want := range []float64{1, 1.5, 2, 3, 4} {
		b.Observe(float64(i + 1))
		if !near(b.Value(), want, tol) {
			t.Errorf("after %d rewards: %v, want %v", i+1, b.Value(), want)
		}
	}
	// Shrinking the window keeps the newest rewards.
	b.Window = 2 // window holds 3, 4, 5
	if !near(b.Value(), 4.5, tol) {
		t.Errorf("shrunk: %v", b.Value())
	}
	b.Observe(6)
	if !near(b.Value(), 5.5, tol) {
		t.Errorf("shrunk then observed: %v", b.Value())
	}
	// Growing it keeps them in order and fills up.
	b.Window = 4
	b.Observe(7)
	b.Observe(8)
	b.Observe(9)
	if !near(b.Value(), 7.5, tol) {
		t.Errorf("grown: %v", b.Value())
	}
}

// TestBaselineJSON: a decoded baseline behaves exactly like the original,
// bit for bit, and malformed state is refused.
func TestBaselineJSON(t *testing.T) {
	rewards := []float64{1, -1, 0, 0.5, 1, 1, -0.25, 0.75}
	for _, proto := range []Baseline{{}, {Decay: 0.8}, {Window: 3}} {
		a := proto
		for _, r := range rewards[:5] {
			a.Observe(r)
		}
		data, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var b Baseline
		if err := json.Unmarshal(data, &b); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		for _, r := range rewards[5:] {
			a.Observe(r)
			b.Observe(r)
			if a.Value() != b.Value() || a.Count() != b.Count() {
				t.Fatalf("%s: diverged after decode: %v vs %v", data, a.Value(), b.Value())
			}
		}
		again, _ := json.Marshal(b)
		final, _ := json.Marshal(a)
		if string(again) != string(final) {
			t.Errorf("re-encoded %s, want %s", again, final)
		}
	}
	// Unencodable settings are normalised, not failed.
	if _, err := json.Marshal(Baseline{Decay: math.NaN(), Window: -1}); err != nil {
		t.Errorf("NaN decay: %v", err)
	}
	bad := []string{
		`not json`,
		`{"decay": 1.5}`,
		`{"window": -1}`,
		`{"weight": 2}`,
		`{"ema": 1, "weight": 0}`,
		`{"window": 1, "n": 2, "recent": [1, 2]}`,
		`{"window": 3, "n": 1, "recent": [1, 2]}`,
		`{"window": 3, "n": 3, "recent": [1, 1e300]}`,
	}
	for _, s := range bad {
		var b Baseline
		if err := b.UnmarshalJSON([]byte(s)); !errors.Is(err, ErrBadBaseline) {
			t.Errorf("%s: %v, want ErrBadBaseline", s, err)
		}
	}
}

func TestBaselineDeterministic(t *testing.T) {
	run := func() float64 {
		var b Baseline
		for i := range 1000 {
			b.Observe(math.Sin(float64(i)))
		}
		return b.Value()
	}
	if x, y := run(), run(); math.Float64bits(x) != math.Float64bits(y) {
		t.Errorf("%v != %v", x, y)
	}
}

func TestRLAdvantages(t *testing.T) {
	s := 1 / (1 + groupEps) // (r − mean)/(std + eps) for a ±1 pair
	cases := []struct {
		name     string
		rewards  []float64
		groups   []string
		baseline []float64 // rewards observed before
		want     []float64
	}{
		{"empty", nil, nil, nil, []float64{}},
		{"alone, no history", []float64{1, -1, 0}, nil, nil, []float64{1, -1, 0}},
		{"alone, baseline 0.5", []float64{1, -1}, nil, []float64{0.5}, []float64{0.5, -1.5}},
		{"pair", []float64{1, -1}, []string{"p", "p"}, []float64{0.9}, []float64{s, -s}},
		{"group of four", []float64{1, 0, 0, -1}, []string{"g", "g", "g", "g"}, nil,
			[]float64{1 / (math.Sqrt(0.5) + groupEps), 0, 0, -1 / (math.Sqrt(0.5) + groupEps)}},
		{"equal rewards", []float64{0.1, 0.1, 0.1}, []string{"g", "g", "g"}, nil, []float64{0, 0, 0}},
		{"group of one uses the baseline", []float64{1, 1, -1}, []string{"a", "b", "b"}, []float64{-1}, []float64{2, s, -s}},
		{"mixed, short groups", []float64{1, -1, 0.5}, []string{"g", "g"}, []float64{0.5}, []float64{s, -s, 0}},
		{"two groups", []float64{1, 1, -1, 0}, []string{"x", "y", "x", "y"}, nil,
			[]float64{s, 0.5 / (0.5 + groupEps), -s, -0.5 / (0.5 + groupEps)}},
		{"non-finite", []float64{math.NaN(), 1, math.Inf(1), -1}, []string{"g", "g", "", "g"}, nil, []float64{0, s, 0, -s}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b Baseline
			for _, r := range c.baseline {
				b.Observe(r)
			}
			got := RLAdvantages(c.rewards, c.groups, &b)
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if !near(got[i], c.want[i], 1e-12) {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

// TestRLEpisodeAdvantages: the turns of one episode share its advantage,
// and an episode counts once in its group however many turns it took.
func TestRLEpisodeAdvantages(t *testing.T) {
	s := 1 / (1 + groupEps) // a ±1 pair of episodes
	// Episode a (three turns, reward 1) against episode b (one turn, −1):
	// per episode a pair, ±s for every turn. Counted per turn it would be
	// a group of four with mean 0.5, and a's turns would get less.
	got := RLEpisodeAdvantages([]float64{1, 1, 1, -1}, []string{"p", "p", "p", "p"}, []string{"a", "a", "a", "b"}, nil)
	if want := []float64{s, s, s, -s}; !slices.EqualFunc(got, want, func(x, y float64) bool { return near(x, y, 1e-12) }) {
		t.Errorf("per episode: %v, want %v", got, want)
	}
	perTurn := RLAdvantages([]float64{1, 1, 1, -1}, []string{"p", "p", "p", "p"}, nil)
	if near(perTurn[0], s, 1e-3) {
		t.Errorf("per turn gave the per-episode advantages %v: the case does not tell them apart", perTurn)
	}
	// The same episode name in two groups is two episodes; an episode
	// alone in its group, and a sample with no episode name, use the
	// baseline; the baseline observes each episode once.
	var b Baseline
	b.Observe(0.5)
	got = RLEpisodeAdvantages(
		[]float64{1, 1, -1, 0, 0, 0.25},
		[]string{"x", "x", "x", "y", "y", ""},
		[]string{"e1", "e1", "e2", "e1", "e1", ""}, &b)
	if want := []float64{s, s, -s, -0.5, -0.5, -0.25}; !slices.EqualFunc(got, want, func(x, y float64) bool { return near(x, y, 1e-12) }) {
		t.Errorf("mixed: %v, want %v", got, want)
	}
	if b.Count() != 1+4 {
		t.Errorf("the baseline observed %d rewards, want 5 (one before, one per episode)", b.Count())
	}
	// A turn's reward may differ within its episode: the episode's is
	// their mean.
	got = RLEpisodeAdvantages([]float64{1, 0, -0.5}, []string{"g", "g", "g"}, []string{"a", "a", "b"}, nil)
	h := 0.5 / (0.5 + groupEps) // episodes 0.5 and −0.5
	if want := []float64{h, h, -h}; !slices.EqualFunc(got, want, func(x, y float64) bool { return near(x, y, 1e-12) }) {
		t.Errorf("mean of turns: %v, want %v", got, want)
	}
}

// TestRLAdvantagesBaselineUpdate: the batch is corrected by the baseline as
// it stood before the batch, then every finite reward is observed; the order
// of the samples in the batch does not matter.
func TestRLAdvantagesBaselineUpdate(t *testing.T) {
	var a, b Baseline
	a.Observe(0.2)
	b.Observe(0.2)
	got := RLAdvantages([]float64{1, -1, math.NaN(), 0.5}, nil, &a)
	if !near(got[0], 0.8, tol) || !near(got[1], -1.2, tol) || got[2] != 0 || !near(got[3], 0.3, tol) {
		t.Errorf("advantages %v", got)
	}
	if a.Count() != 4 {
		t.Errorf("observed %d rewards, want 4", a.Count())
	}
	rev := RLAdvantages([]float64{0.5, math.NaN(), -1, 1}, nil, &b)
	if !slices.Equal(rev, []float64{got[3], got[2], got[1], got[0]}) {
		t.Errorf("reversed batch gave %v", rev)
	}
	// nil baseline: 0, nothing to update.
	if got := RLAdvantages([]float64{0.5}, nil, nil); got[0] != 0.5 {
		t.Errorf("nil baseline: %v", got)
	}
}

func TestOPDAdvantages(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		name         string
		teacher, old []float64
		mask         []bool
		bound        float64
		want         []float64
	}{
		{"inside bound", []float64{-1, -2, -0.5}, []float64{-1.5, -1, -0.5}, []bool{true, true, true}, 0, []float64{0.5, -1, 0}},
		{"clipped at default 2", []float64{0, -30}, []float64{-10, -1}, []bool{true, true}, 0, []float64{2, -2}},
		{"explicit bound", []float64{0, -30}, []float64{-10, -1}, []bool{true, true}, 1, []float64{1, -1}},
		{"no bound", []float64{0, -30}, []float64{-10, -1}, []bool{true, true}, inf, []float64{10, -29}},
		{"negative bound means default", []float64{0}, []float64{-10}, []bool{true}, -3, []float64{2}},
		{"NaN bound means default", []float64{0}, []float64{-10}, []bool{true}, nan, []float64{2}},
		{"masked", []float64{-1, -1}, []float64{-2, -2}, []bool{false, true}, 0, []float64{0, 1}},
		{"nil mask selects all", []float64{-1, -1}, []float64{-2, -3}, nil, 0, []float64{1, 2}},
		{"short teacher", []float64{-1}, []float64{-2, -2}, []bool{true, true, true}, 0, []float64{1, 0, 0}},
		{"non-finite", []float64{nan, -1, inf}, []float64{-1, -inf, -1}, []bool{true, true, true}, 0, []float64{0, 0, 0}},
		{"empty", nil, nil, nil, 0, []float64{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := OPDAdvantages(c.teacher, c.old, c.mask, c.bound)
			if !slices.EqualFunc(got, c.want, func(a, b float64) bool { return near(a, b, 1e-12) }) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestCombined(t *testing.T) {
	mask := []bool{true, false, true, true}
	opd := []float64{1, 5, -0.5, math.NaN()}
	cases := []struct {
		name string
		rl   float64
		opd  []float64
		w    Weights
		want []float64
	}{
		{"default weights", 0.5, opd, Weights{}, []float64{1.5, 0, 0, 0.5}},
		{"weighted", 1, opd, Weights{RL: 2, OPD: 0.5}, []float64{2.5, 0, 1.75, 2}},
		{"rl only", -1, nil, Weights{}, []float64{-1, 0, -1, -1}},
		{"opd only via weights", 3, opd, Weights{OPD: 1}, []float64{1, 0, -0.5, 0}},
		{"non-finite rl", math.Inf(1), opd, Weights{}, []float64{1, 0, -0.5, 0}},
		{"non-finite weight", 1, opd, Weights{RL: math.NaN(), OPD: 2}, []float64{2, 0, -1, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Combined(c.rl, c.opd, mask, c.w)
			if !slices.EqualFunc(got, c.want, func(a, b float64) bool { return near(a, b, 1e-12) }) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestBroadcast(t *testing.T) {
	mask := []bool{true, false, true}
	if got := Broadcast(0.5, mask); !slices.Equal(got, []float64{0.5, 0, 0.5}) {
		t.Errorf("got %v", got)
	}
	if got := Broadcast(math.NaN(), mask); !slices.Equal(got, []float64{0, 0, 0}) {
		t.Errorf("NaN: %v", got)
	}
	if got := Broadcast(1, nil); len(got) != 0 {
		t.Errorf("nil mask: %v", got)
	}
}
