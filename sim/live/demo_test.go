package live

import (
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/trainer"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o  Options
		ok bool
	}{
		{Options{}, true},
		{Options{Recipes: []string{"binary", "opd", "combined"}, Rounds: 4}, true},
		{Options{Recipes: []string{"rl"}}, false},
		{Options{Rounds: -1}, false},
	} {
		err := tc.o.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.o, err)
		}
	}
	if err := (Options{Recipes: []string{"ppo"}}).Validate(); !errors.Is(err, ErrRecipe) {
		t.Errorf("an unknown recipe: %v", err)
	}
}

// TestReportPrint checks the table of the score per round: a column per
// recipe, a row per round, and a line per recipe with its failover.
func TestReportPrint(t *testing.T) {
	rep := &Report{Seconds: 42, Runs: []RecipeRun{
		{Recipe: "binary", Before: 0.25, After: 0.75, Seconds: 20,
			Rounds:   []Round{{Version: "base", Score: 0.25}, {Round: 1, Version: "v1", Score: 0.5}, {Round: 2, Version: "v2", Score: 0.75}},
			Failover: &Failover{AfterRound: 1, NewLeader: "12D3KooWABCDEFGH", Seconds: 1.25}},
		{Recipe: "opd", Before: 0.25, After: 0.5, Seconds: 21,
			Rounds: []Round{{Version: "base", Score: 0.25}, {Round: 1, Version: "v1", Score: 0.5}}},
	}}
	var b strings.Builder
	rep.Print(&b)
	want := `
personalization score per round (share of replies to held-back prompts their user accepts)
round            binary              opd
0          0.250 (base)     0.250 (base)
1          0.500 (v1  )     0.500 (v1  )
2          0.750 (v2  )                 
binary: 0.250 -> 0.750 in 2 rounds (v2), 20 s; leader stopped after round 1, …CDEFGH took over in 1.2 s
opd: 0.250 -> 0.500 in 1 rounds (v1), 21 s
total 42 s
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestLeaderWatch checks that a change of the trainers' leader gets a
// failover line, whoever caused it, and nothing else does.
func TestLeaderWatch(t *testing.T) {
	var w leaderWatch
	for i, c := range []struct {
		st   trainer.Status
		want string
	}{
		{trainer.Status{}, ""},
		{trainer.Status{Leader: "12D3KooWAAAAAAAA", Term: 1}, ""},
		{trainer.Status{Leader: "12D3KooWAAAAAAAA", Term: 1}, ""},
		{trainer.Status{Term: 2}, ""}, // an election under way
		{trainer.Status{Leader: "12D3KooWBBBBBBBB", Term: 2}, "failover: …BBBBBB leads the trainers now (was …AAAAAA; election term 2); training goes on"},
		{trainer.Status{Leader: "12D3KooWBBBBBBBB", Term: 2}, ""},
	} {
		if got := w.see(c.st); got != c.want {
			t.Errorf("%d: %q, want %q", i, got, c.want)
		}
	}
}

// TestPrintLegend checks that the words the demo prints are explained.
func TestPrintLegend(t *testing.T) {
	var b strings.Builder
	PrintLegend(&b)
	for _, w := range []string{"score", "vN", "leader", "term", "binary", "opd", "combined", "liked"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("the legend lacks %q:\n%s", w, b.String())
		}
	}
}
