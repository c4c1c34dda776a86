package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/sim/live"
)

// TestDemoQuick runs `clawmesh demo --quick` as CI does: the whole mesh on
// loopback, and the personalization score must rise well beyond the
// measurement's noise, with the leader stopped half way and another taking
// over.
func TestDemoQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three model servers, three nodes and three trainers")
	}
	dir := t.TempDir()
	// The base model is taught afresh, as on a newcomer's machine, and
	// kept here.
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	out, png := filepath.Join(dir, "out.json"), filepath.Join(dir, "score.png")
	logs := filepath.Join(dir, "logs")
	stdout, stderr, code := runCLI(t, "demo", "--quick", "--json", out, "--plot", png, "--seed", "7", "--logs", logs)
	// On failure, what the trainers did round by round.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i := 1; i <= 3; i++ {
			b, _ := os.ReadFile(filepath.Join(logs, fmt.Sprintf("combined-trainer%d.log", i)))
			for line := range strings.Lines(string(b)) {
				for _, m := range []string{`msg="round started"`, `msg="share trained"`, `msg="version published"`, "level=ERROR"} {
					if strings.Contains(line, m) {
						t.Logf("trainer %d: %s", i, strings.TrimSpace(line))
					}
				}
			}
		}
	})
	if code != 0 {
		t.Fatalf("clawmesh demo --quick: code %d\n%s\n%s", code, stdout, stderr)
	}
	if ls, err := os.ReadDir(logs); err != nil || len(ls) != 6 {
		t.Errorf("--logs wrote %d files (%v), want 3 nodes' and 3 trainers'", len(ls), err)
	}
	followBatch(t, logs)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep live.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].Recipe != "combined" || !rep.Quick || rep.Seed != 7 || len(rep.Users) != 3 {
		t.Fatalf("report: %+v", rep)
	}
	run := rep.Runs[0]
	if len(run.Rounds) != 5 || run.Rounds[0].Version != "base" {
		t.Fatalf("rounds: %+v", run.Rounds)
	}
	// The base model follows the users' directive when a hint says it, and
	// without one starts its replies with a word about as often as the
	// tiny model it was taught from.
	if b := rep.Base; b == nil || b.Cached || b.HintedAfter < 0.8 || b.HintedBefore > 0.5 || math.Abs(b.PlainAfter-b.PlainBefore) > 0.2 {
		t.Errorf("base model: %+v", rep.Base)
	}
	// 3 users × 2 held-back prompts × 32 replies: a share moves by about
	// 0.035 from noise alone, so a rise of 0.2 is learning, not noise.
	best := 0.0
	for _, r := range run.Rounds[1:] {
		best = max(best, r.Score)
	}
	if best < run.Before+0.3 || run.After < run.Before+0.2 {
		t.Errorf("the score did not rise clearly: %.3f -> best %.3f, last %.3f (%+v)", run.Before, best, run.After, run.Rounds)
	}
	prev := uint64(0)
	for _, r := range run.Rounds[1:] {
		v, ok := strings.CutPrefix(r.Version, "v")
		n, err := strconv.ParseUint(v, 10, 64)
		if !ok || err != nil || n <= prev {
			t.Errorf("round %d served by %q after v%d", r.Round, r.Version, prev)
		}
		prev = n
		// Every session is a reply and the user's reaction to it: the
		// plugins reward the replies, and the corrections carry hints.
		if r.Steps == 0 || r.Batches == 0 || len(r.PerUser) != 3 || r.Rewarded < r.Steps/3 || r.Hinted == 0 {
			t.Errorf("round %+v", r)
		}
	}
	if f := run.Failover; f == nil || f.NewLeader == "" || f.NewLeader == f.Stopped || f.AfterRound != 2 {
		t.Errorf("failover: %+v", run.Failover)
	}
	for _, want := range []string{"stopping the trainers' leader", "failover:", "personalization score per round", "round 4", "what the words mean:"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the output lacks %q:\n%s", want, stdout)
		}
	}
	// The output ends saying where the files went, by absolute path.
	if want := "plot written to " + png + "\nJSON written to " + out + "\nlogs written to " + logs + "\n"; !strings.HasSuffix(stdout, want) {
		t.Errorf("the output does not end with\n%s\n%s", want, stdout)
	}
	p, err := os.ReadFile(png)
	if err != nil || !bytes.HasPrefix(p, []byte("\x89PNG\r\n\x1a\n")) || len(p) < 5000 {
		t.Errorf("the plot: %d bytes, %v", len(p), err)
	}

	// A second demo on this machine takes the base model from the cache.
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	base, cached, err := live.BaseModel(t.Context(), filepath.Join(cache, "clawmesh", "demo"), t.TempDir(), func(string, ...any) { t.Error("the base model was taught again") })
	if err != nil || !cached.Cached || cached.HintedAfter != rep.Base.HintedAfter {
		t.Fatalf("the cached base model: %s, %+v, %v", base, cached, err)
	}
	if _, err := os.Stat(filepath.Join(base, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
}

// followBatch follows a batch through the logs by its id: sealed on node 1,
// trained by a trainer in a round, and that round published as a version.
func followBatch(t *testing.T, logs string) {
	t.Helper()
	attr := func(line, key string) string {
		_, v, ok := strings.Cut(line, " "+key+"=")
		if !ok {
			return ""
		}
		v, _, _ = strings.Cut(v, " ")
		return strings.TrimSpace(v)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(logs, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	sealed := map[string]bool{}
	for line := range strings.Lines(read("combined-node1.log")) {
		if strings.Contains(line, `msg="batch sealed"`) {
			sealed[attr(line, "batch")] = true
		}
	}
	trainedIn, published := map[string]string{}, map[string]string{}
	for i := 1; i <= 3; i++ {
		for line := range strings.Lines(read(fmt.Sprintf("combined-trainer%d.log", i))) {
			switch {
			case strings.Contains(line, `msg="batch trained"`):
				trainedIn[attr(line, "batch")] = attr(line, "round")
			case strings.Contains(line, `msg="version published"`):
				published[attr(line, "round")] = attr(line, "version")
			}
		}
	}
	for id := range sealed {
		if r, ok := trainedIn[id]; ok && published[r] != "" {
			t.Logf("batch %s: sealed on node 1, trained in round %s, published as v%s", id, r, published[r])
			return
		}
	}
	t.Errorf("no batch sealed on node 1 (%d) can be followed to a published version in the trainers' logs (%d batches trained, %d versions)", len(sealed), len(trainedIn), len(published))
}

// TestDemoPlotPath checks where the plot goes: where --plot says, made
// absolute; else in the logs directory; else in the user's cache
// directory, never in the current one.
func TestDemoPlotPath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	t.Setenv("HOME", filepath.Join(dir, "home"))
	t.Chdir(dir)
	wd, _ := os.Getwd()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ plot, logs, want string }{
		{"score.png", "", filepath.Join(wd, "score.png")},
		{"", "logs", filepath.Join(wd, "logs", "clawmesh-demo.png")},
		{"", "", filepath.Join(cache, "clawmesh", "demo", "clawmesh-demo.png")},
	} {
		got, err := demoPlotPath(c.plot, c.logs)
		if err != nil || got != c.want {
			t.Errorf("--plot %q --logs %q: %q, %v; want %q", c.plot, c.logs, got, err, c.want)
		}
		if c.plot == "" {
			if _, err := os.Stat(filepath.Dir(got)); err != nil {
				t.Errorf("the plot's directory: %v", err)
			}
		}
	}
}

func TestDemoBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--recipe", "ppo"},
		{"demo", "--plot", "score.svg"},
		{"demo", "--rounds", "-1"},
		{"demo", "extra"},
	} {
		_, errs, code := runCLI(t, args...)
		if code == 0 || errs == "" || strings.Contains(errs, "main.") {
			t.Errorf("%v: code %d, %q", args, code, errs)
		}
	}
	out, errs, code := runCLI(t, "demo", "--help")
	if out += errs; code != 0 || !strings.Contains(out, "personalization score") || !strings.Contains(out, "--quick") {
		t.Errorf("demo --help: code %d\n%s", code, out)
	}
}

// TestDemoPlot checks the plot's frame: points at 0 and 1, and at the first
// and last round, lie inside the axes with room around them, so that they
// show whole, and the file is a PNG.
func TestDemoPlot(t *testing.T) {
	rep := &live.Report{}
	for i, r := range []string{"binary", "opd", "combined"} {
		run := live.RecipeRun{Recipe: r}
		for k := 0; k <= 8; k++ {
			run.Rounds = append(run.Rounds, live.Round{Round: k, Score: min(1, 0.1*float64(i)+0.15*float64(k))})
		}
		run.Before, run.After = run.Rounds[0].Score, run.Rounds[8].Score
		if i == 0 {
			run.Failover = &live.Failover{AfterRound: 4}
		}
		rep.Runs = append(rep.Runs, run)
	}
	p, err := demoPlot(rep)
	if err != nil {
		t.Fatal(err)
	}
	if p.Y.Min >= 0 || p.Y.Max <= 1 || p.X.Min >= 0 || p.X.Max <= 8 {
		t.Errorf("axes x [%g, %g], y [%g, %g]: no room around the points", p.X.Min, p.X.Max, p.Y.Min, p.Y.Max)
	}
	path := filepath.Join(t.TempDir(), "score.png")
	if err := plotDemo(rep, path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("the plot: %d bytes, %v", len(b), err)
	}
}

// TestDemoConflict: with --conflict each node serves a personal adapter
// stacked on the shared version, every round is measured both ways, and
// the table, the plot and the JSON show both; no personal adapter is found
// anywhere but on its own device.
func TestDemoConflict(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four model servers, three nodes and three trainers")
	}
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	out, png := filepath.Join(dir, "out.json"), filepath.Join(dir, "conflict.png")
	stdout, stderr, code := runCLI(t, "demo", "--conflict", "--quick", "--json", out, "--plot", png, "--seed", "3")
	if code != 0 {
		t.Fatalf("clawmesh demo --conflict --quick: code %d\n%s\n%s", code, stdout, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep live.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Conflict || len(rep.Runs) != 1 || rep.Runs[0].Recipe != "binary" || len(rep.Users) != 3 || rep.Users[1].Preference == rep.Users[0].Preference {
		t.Fatalf("report: %+v", rep)
	}
	run := rep.Runs[0]
	if len(run.Rounds) != 5 || run.PersonalElsewhere != 0 {
		t.Fatalf("rounds %d, personal adapters elsewhere %d", len(run.Rounds), run.PersonalElsewhere)
	}
	best := 0.0
	for i, r := range run.Rounds {
		if r.SharedOnly == nil || len(r.SharedOnly.PerUser) != 3 || len(r.PerUser) != 3 {
			t.Fatalf("round %d: %+v", i, r)
		}
		if i == 0 {
			if len(r.Personal) != 0 {
				t.Errorf("round 0 has personal versions %v", r.Personal)
			}
			continue
		}
		if want := fmt.Sprint("p", i); len(r.Personal) != 3 || r.Personal[0] != want || r.Personal[2] != want {
			t.Errorf("round %d: personal versions %v, want %s on every node", i, r.Personal, want)
		}
		best = max(best, r.Score)
	}
	// Noise moves a share of 64 replies by about 0.06 per user: a rise of
	// 0.2 in the mean of three is learning.
	if best < run.Before+0.2 {
		t.Errorf("shared + personal did not rise: %.2f -> best %.2f (%+v)", run.Before, best, run.Rounds)
	}
	for _, want := range []string{"shared version alone | shared + personal", "no personal adapter is anywhere but on its own device", "alice", "bob", "carol"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the output lacks %q:\n%s", want, stdout)
		}
	}
	if p, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(p, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("the plot: %v", err)
	}
}
