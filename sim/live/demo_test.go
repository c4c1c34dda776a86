package live

import (
	"encoding/json"
	"errors"
	"reflect"
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

// TestLeaderWatch checks that a change of the trainers' leader is seen,
// with a failover line, whoever caused it, and nothing else is.
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
		ch := w.see(c.st)
		got := ""
		if ch != nil {
			got = ch.Line()
			if ch.From != "12D3KooWAAAAAAAA" || ch.To != "12D3KooWBBBBBBBB" || ch.Term != 2 || ch.Planned {
				t.Errorf("%d: the change %+v", i, *ch)
			}
		}
		if got != c.want {
			t.Errorf("%d: %q, want %q", i, got, c.want)
		}
	}
}

// TestReportLeaderChangesJSON: the report's JSON has every change of
// leader of a run, the planned one and one nobody asked for, and the
// summary line counts the unplanned ones.
func TestReportLeaderChangesJSON(t *testing.T) {
	run := RecipeRun{Recipe: "combined", Before: 0.25, After: 0.5, Seconds: 30,
		Rounds:   []Round{{Version: "base", Score: 0.25}, {Round: 1, Version: "v1", Score: 0.5}},
		Failover: &Failover{AfterRound: 1, Stopped: "12D3KooWAAAAAAAA", NewLeader: "12D3KooWBBBBBBBB", Seconds: 1.5},
		LeaderChanges: []LeaderChange{
			{At: 12.5, Round: 1, From: "12D3KooWAAAAAAAA", To: "12D3KooWBBBBBBBB", Term: 2, Planned: true},
			{At: 20, Round: 2, From: "12D3KooWBBBBBBBB", To: "12D3KooWCCCCCCCC", Term: 3},
		}}
	b, err := json.Marshal(&Report{Runs: []RecipeRun{run}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Runs []struct {
			LeaderChanges []map[string]any `json:"leader_changes"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"at": 12.5, "round": 1.0, "from": "12D3KooWAAAAAAAA", "to": "12D3KooWBBBBBBBB", "term": 2.0, "planned": true},
		{"at": 20.0, "round": 2.0, "from": "12D3KooWBBBBBBBB", "to": "12D3KooWCCCCCCCC", "term": 3.0, "planned": false},
	}
	if len(got.Runs) != 1 || !reflect.DeepEqual(got.Runs[0].LeaderChanges, want) {
		t.Errorf("leader_changes in the JSON: %s", b)
	}
	var p strings.Builder
	(&Report{Runs: []RecipeRun{run}}).Print(&p)
	if !strings.Contains(p.String(), "took over in 1.5 s; 1 unplanned change(s) of leader\n") {
		t.Errorf("the summary does not count the unplanned change:\n%s", p.String())
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

// TestReportPrintConflict: with Conflict, each user's score with the
// shared version alone and with shared + personal stand side by side.
func TestReportPrintConflict(t *testing.T) {
	rep := &Report{Conflict: true, Seconds: 60, Users: []UserInfo{{Name: "alice"}, {Name: "bob"}}, Runs: []RecipeRun{
		{Recipe: "binary", Seconds: 50, Rounds: []Round{
			{Version: "base", Score: 0.3, PerUser: []float64{0.2, 0.4}, SharedOnly: &SharedOnly{Score: 0.3, PerUser: []float64{0.2, 0.4}}},
			{Round: 1, Version: "v1", Score: 0.95, PerUser: []float64{1, 0.9}, Personal: []string{"p1", "p1"}, SharedOnly: &SharedOnly{Score: 0.5, PerUser: []float64{1, 0}}},
		}}}}
	var b strings.Builder
	rep.Print(&b)
	want := `
binary: each user's score, shared version alone | shared + personal (share of replies to held-back prompts their user accepts)
round  version            alice             bob             all
0      base       0.20 |   0.20   0.40 |   0.40   0.30 |   0.30
1      v1         1.00 |   1.00   0.00 |   0.90   0.50 |   0.95
binary: after 1 rounds, shared alone alice 1.00, bob 0.00, shared + personal alice 1.00, bob 0.90 (50 s)
total 60 s
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
