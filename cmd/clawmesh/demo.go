package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer/learn"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

const demoHelp = `Usage: clawmesh demo [--quick] [--recipe binary|opd|combined|all] [--json FILE] [--plot FILE.png] [--seed N]

Runs a whole mesh on this machine and shows it learn. Three nodes, each a
gateway in front of its own model server with the tiny model, join one mesh
with invite tokens; three trainers (a raft group) join it too. Three
simulated users, one per node, talk to their node over HTTP with the OpenAI
wire protocol and react to the replies by a hidden preference each
(corrections, re-asks, thanks, explicit feedback). The built-in reward
plugins score the steps, the nodes scrub them and ship them as batches, the
trainers train a round and publish an adapter version, and the nodes fetch it
and hot-swap it into their model servers. Half way, the trainers' leader is
stopped; the others elect a new one and go on.

The personalization score is the share of replies to held-back prompts
(never trained on) that their user would accept, sampled from the model
servers themselves, so it says what the users would now get. It is measured
before training and after every version.

Recipes: binary (Binary RL on the users' rewards), opd (on-policy
distillation from the hints in their corrections), combined (both); all runs
the three one after another and prints them side by side.

The base model is the tiny model taught, on prompts no user asks, to start
its reply with a word when a hint in its context asks for it: it stands in
for an instruction-following model, so that OPD's teacher (the base model
reading the user's correction) has something to teach. Without a hint it
behaves as the tiny model does. The first demo on a machine teaches it (under
a minute on 2 cores) and keeps it in the user's cache directory.

Examples:
  clawmesh demo                         # all three recipes, a few minutes
  clawmesh demo --quick                 # fewer rounds, the combined recipe
  clawmesh demo --json out.json --plot score.png
`

// demoReport is the outcome of `clawmesh demo`, the --json contract.
type demoReport struct {
	Date    string     `json:"date"`
	Quick   bool       `json:"quick"`
	Seed    uint64     `json:"seed"`
	Users   []demoUser `json:"users"`
	Runs    []demoRun  `json:"runs"`
	Seconds float64    `json:"seconds"`
	// Base is how the base model every recipe starts from was made.
	Base *demoBase `json:"base,omitempty"`
}

// demoBase describes the demo's base model: the tiny model taught to
// follow the users' directive when a hint in its context says it.
type demoBase struct {
	Name string `json:"name"`
	// The share of sampled replies to the teaching prompts that start with
	// a word, with a hint in the context and without, before and after
	// the teaching.
	HintedBefore float64 `json:"hinted_before"`
	HintedAfter  float64 `json:"hinted_after"`
	PlainBefore  float64 `json:"plain_before"`
	PlainAfter   float64 `json:"plain_after"`
	Seconds      float64 `json:"seconds"`
	// Cached is set when the model was made by an earlier demo on this
	// machine (the figures are that demo's).
	Cached bool `json:"cached,omitempty"`
}

// demoUser describes one simulated user.
type demoUser struct {
	Name       string `json:"name"`
	Node       int    `json:"node"`
	Preference string `json:"preference"`
	Style      string `json:"style"`
}

// demoRun is one recipe's run.
type demoRun struct {
	Recipe string      `json:"recipe"`
	Rounds []demoRound `json:"rounds"`
	// Before and After are the score before training and after the last
	// version.
	Before   float64       `json:"score_before"`
	After    float64       `json:"score_after"`
	Failover *demoFailover `json:"failover,omitempty"`
	Seconds  float64       `json:"seconds"`
}

// demoRound is one measurement: the version serving on every node, and the
// score it gets.
type demoRound struct {
	Round   int       `json:"round"`
	Version string    `json:"version"`
	Score   float64   `json:"score"`
	PerUser []float64 `json:"per_user"`
	// Liked is the share of the round's training replies their user liked
	// (round 0: none yet).
	Liked float64 `json:"liked"`
	Steps int     `json:"steps_recorded"`
	// Rewarded and Hinted count the recorded steps the reward plugins gave
	// a reward and an OPD hint.
	Rewarded int `json:"steps_rewarded"`
	Hinted   int `json:"steps_hinted"`
	Batches  int `json:"batches_trained"`
}

// demoFailover is the trainer stopped half way.
type demoFailover struct {
	AfterRound int     `json:"after_round"`
	Stopped    string  `json:"stopped"`
	NewLeader  string  `json:"new_leader"`
	Seconds    float64 `json:"seconds"`
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", demoHelp, stderr)
	quick := fs.Bool("quick", false, "fewer rounds and one recipe (combined unless --recipe says): the short form CI runs")
	recipe := fs.String("recipe", "", "binary, opd, combined or all (default all; combined with --quick)")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file (- for stdout)")
	plot := fs.String("plot", "", "write a plot of the score per round to this PNG file (default clawmesh-demo.png; - for none)")
	seed := fs.Uint64("seed", 1, "seed of the users' choices and of the sampling")
	rounds := fs.Int("rounds", 0, "versions trained per recipe (default 8, 4 with --quick)")
	logs := fs.String("logs", "", "write each node's and trainer's log (debug level) to a file in this directory: RECIPE-node1.log, RECIPE-trainer1.log, ...")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("demo takes no arguments (got %q)", fs.Arg(0))
	}
	recipes, err := demoRecipes(*recipe, *quick)
	if err != nil {
		return err
	}
	if *rounds < 0 || *rounds > 50 {
		return usageErr("--rounds must be between 1 and 50")
	}
	if *rounds == 0 {
		*rounds = 8
		if *quick {
			*rounds = 4
		}
	}
	if *plot == "" {
		*plot = "clawmesh-demo.png"
	}
	if *plot != "-" && !strings.HasSuffix(strings.ToLower(*plot), ".png") {
		return usageErr("--plot writes a PNG: give a file name ending in .png")
	}

	start := time.Now()
	users := scenario.Users()
	rep := demoReport{Date: start.UTC().Format(time.DateOnly), Quick: *quick, Seed: *seed}
	progress := stdout
	if *jsonOut == "-" {
		progress = stderr
	}
	for i, u := range users {
		rep.Users = append(rep.Users, demoUser{Name: u.Name, Node: i + 1, Preference: u.Pref.Name, Style: u.Style.String()})
		fmt.Fprintf(progress, "user %-6s on node %d: likes replies that %s; shows it by %s\n", u.Name, i+1, u.Pref.Name, u.Style)
	}
	if *logs != "" {
		if err := os.MkdirAll(*logs, 0o755); err != nil {
			return fmt.Errorf("--logs: %w", err)
		}
	}
	cache, err := os.MkdirTemp("", "clawmesh-demo-cache-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cache)
	if err := os.Mkdir(filepath.Join(cache, "wazero"), 0o700); err != nil {
		return err
	}
	modelCache, err := os.UserCacheDir()
	if err == nil {
		modelCache = filepath.Join(modelCache, "clawmesh", "demo")
	} else {
		modelCache = ""
	}
	base, b, err := demoBaseModel(ctx, modelCache, cache, func(f string, a ...any) { fmt.Fprintf(progress, f+"\n", a...) })
	if err != nil {
		return fmt.Errorf("making the base model: %w", err)
	}
	rep.Base = b
	how := fmt.Sprintf("taught in %.0f s", b.Seconds)
	if b.Cached {
		how = "kept from an earlier demo in " + base
	}
	fmt.Fprintf(progress, "base model %s (%s): replies that start with a word %.2f -> %.2f with the hint, %.2f -> %.2f without\n",
		demoModel, how, b.HintedBefore, b.HintedAfter, b.PlainBefore, b.PlainAfter)
	for _, r := range recipes {
		run, err := demoRecipe(ctx, demoOptions{Recipe: r, Rounds: *rounds, Seed: *seed, Users: users, Failover: true, Cache: filepath.Join(cache, "wazero"), Base: base, Logs: *logs}, progress)
		if err != nil {
			return fmt.Errorf("recipe %s: %w", r, err)
		}
		rep.Runs = append(rep.Runs, run)
	}
	rep.Seconds = time.Since(start).Seconds()
	printDemoTable(progress, rep)
	if *plot != "-" {
		if err := plotDemo(rep, *plot); err != nil {
			return fmt.Errorf("writing the plot: %w", err)
		}
		fmt.Fprintf(progress, "plot written to %s\n", *plot)
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		b = append(b, '\n')
		if *jsonOut == "-" {
			_, err = stdout.Write(b)
		} else {
			err = os.WriteFile(*jsonOut, b, 0o644)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// demoModel is the name of the demo's base model.
const demoModel = "tiny-directives"

// demoTeach is how the demo's base model is taught.
var demoTeach = learn.TeachOptions{Steps: 24, Anchors: 4, AnchorTokens: 6, Seed: 1, KLCoef: 8}

// demoBaseModel returns the directory of the demo's base model (a model
// directory that `clawmesh serve --model` and `clawmesh trainer --base`
// load): the tiny model taught, on prompts no user asks, to start its reply
// with a word when a hint in its context asks for it
// (learn.TeachDirective), the adapter merged into its weights. Without a
// hint it behaves much as the tiny model does, so the users' preferences
// are still to learn; with one, OPD's teacher (the base under the hinted
// context) has something to teach, as an instruction-following model's
// would.
//
// The model is kept under cache (the user's cache directory), named by a
// hash of everything that makes it, so that only a machine's first demo
// pays for the teaching; tmp is where it goes when there is no cache.
func demoBaseModel(ctx context.Context, cache, tmp string, say func(string, ...any)) (string, *demoBase, error) {
	key := sha256.New()
	fmt.Fprintf(key, "%s|%+v|%q|%q|%d", demoModel, demoTeach, scenario.TeachPrompts, scenario.WordHints, runtime.NumCPU())
	dir := filepath.Join(tmp, demoModel)
	if cache != "" {
		dir = filepath.Join(cache, fmt.Sprintf("%s-%x", demoModel, key.Sum(nil)[:6]))
		var b demoBase
		if data, err := os.ReadFile(filepath.Join(dir, "lesson.json")); err == nil && json.Unmarshal(data, &b) == nil {
			if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
				b.Cached = true
				return dir, &b, nil
			}
		}
	}
	say("teaching the tiny model to follow a hint that asks for a reply starting with a word (once per machine) ...")
	start := time.Now()
	eng, tok, _, err := newTiny(1, native.Options{Name: demoModel, Seed: 1})
	if err != nil {
		return "", nil, err
	}
	defer eng.Close()
	pupil, err := eng.Fork()
	if err != nil {
		return "", nil, err
	}
	defer pupil.Close()
	b := sample.NewBuilder(tok, chat.Qwen3(), sample.Options{})
	lesson, err := learn.TeachDirective(ctx, pupil, tok, b, scenario.TeachPrompts,
		learn.Directive{Hints: scenario.WordHints, Follows: scenario.StartsASCIILetter.Accepts}, demoTeach)
	if err != nil {
		return "", nil, err
	}
	merged, err := pupil.(*native.Engine).MergeAdapter()
	if err != nil {
		return "", nil, err
	}
	defer merged.Close()
	base := &demoBase{Name: demoModel, HintedBefore: lesson.HintedBefore, HintedAfter: lesson.HintedAfter,
		PlainBefore: lesson.PlainBefore, PlainAfter: lesson.PlainAfter, Seconds: time.Since(start).Seconds()}
	// Written whole beside its place, then renamed into it: a demo stopped
	// half way leaves no half model to reuse.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", nil, err
	}
	part, err := os.MkdirTemp(filepath.Dir(dir), demoModel+".part-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(part)
	if err := merged.(*native.Engine).SaveModel(part); err != nil {
		return "", nil, err
	}
	if err := tok.Save(filepath.Join(part, "tokenizer.json")); err != nil {
		return "", nil, err
	}
	data, _ := json.MarshalIndent(base, "", "  ")
	if err := os.WriteFile(filepath.Join(part, "lesson.json"), data, 0o644); err != nil {
		return "", nil, err
	}
	if err := os.Chmod(part, 0o755); err != nil {
		return "", nil, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(part, dir); err != nil {
		return "", nil, err
	}
	return dir, base, nil
}

// demoRecipes parses --recipe.
func demoRecipes(s string, quick bool) ([]string, error) {
	switch s {
	case "":
		if quick {
			return []string{"combined"}, nil
		}
		return []string{"binary", "opd", "combined"}, nil
	case "all":
		return []string{"binary", "opd", "combined"}, nil
	case "binary", "rl":
		return []string{"binary"}, nil
	case "opd", "combined":
		return []string{s}, nil
	}
	return nil, usageErr("unknown recipe %q: use binary, opd, combined or all", s)
}

// groupRecipe is the trainers' name of a demo recipe.
func groupRecipe(r string) string {
	if r == "binary" {
		return loss.RecipeRL.String()
	}
	return r
}

// printDemoTable prints the score per round, one column per recipe.
func printDemoTable(w io.Writer, rep demoReport) {
	fmt.Fprintf(w, "\npersonalization score per round (share of replies to held-back prompts their user accepts)\n")
	fmt.Fprintf(w, "%-6s", "round")
	n := 0
	for _, r := range rep.Runs {
		fmt.Fprintf(w, " %16s", r.Recipe)
		n = max(n, len(r.Rounds))
	}
	fmt.Fprintln(w)
	for i := range n {
		fmt.Fprintf(w, "%-6d", i)
		for _, r := range rep.Runs {
			if i < len(r.Rounds) {
				fmt.Fprintf(w, " %9.3f (%-4s)", r.Rounds[i].Score, r.Rounds[i].Version)
			} else {
				fmt.Fprintf(w, " %16s", "")
			}
		}
		fmt.Fprintln(w)
	}
	for _, r := range rep.Runs {
		last := r.Rounds[len(r.Rounds)-1]
		fmt.Fprintf(w, "%s: %.3f -> %.3f in %d rounds (%s), %.0f s", r.Recipe, r.Before, r.After, len(r.Rounds)-1, last.Version, r.Seconds)
		if f := r.Failover; f != nil {
			fmt.Fprintf(w, "; leader stopped after round %d, %s took over in %.1f s", f.AfterRound, shortPeer(mesh.PeerID(f.NewLeader)), f.Seconds)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "total %.0f s\n", rep.Seconds)
}
