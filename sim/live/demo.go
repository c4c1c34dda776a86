package live

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer/learn"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// Recipes are the demo's recipes, in the order Run runs them by default.
var Recipes = []string{"binary", "opd", "combined"}

// ErrRecipe is an unknown recipe in Options.Recipes.
var ErrRecipe = errors.New("live: unknown recipe")

// Options configures Run. The zero value runs the three recipes, 8 rounds
// each, on seed 0, and teaches the base model afresh.
type Options struct {
	// Recipes are run one after another: binary (Binary RL on the users'
	// rewards), opd (on-policy distillation from the hints in their
	// corrections) or combined (nil: all three, as Recipes).
	Recipes []string
	// Rounds is how many versions each recipe trains (default 8).
	Rounds int
	// Seed seeds the users' choices and the sampling.
	Seed uint64
	// Quick is recorded in the report: the short run CI makes. It changes
	// nothing else.
	Quick bool
	// ModelCache is a directory where the base model is kept from run to
	// run, so that only a machine's first demo teaches it ("": taught
	// afresh, into a temporary directory).
	ModelCache string
	// Logs, when set, is an existing directory where each node and trainer
	// writes its log at debug level (RECIPE-node1.log,
	// RECIPE-trainer1.log, ...).
	Logs string
	// Progress is where the demo says what it does as it goes (nil:
	// nowhere).
	Progress io.Writer
	// Conflict runs the conflict scenario (scenario.ConflictUsers): users
	// whose preferences no shared adapter can meet at once, each node with
	// a personal adapter on top of the shared version; every round is
	// measured with the shared version alone and with shared + personal.
	Conflict bool
}

// Validate reports options Run cannot run.
func (o Options) Validate() error {
	for _, r := range o.Recipes {
		if !slices.Contains(Recipes, r) {
			return fmt.Errorf("%w %q", ErrRecipe, r)
		}
	}
	if o.Rounds < 0 {
		return fmt.Errorf("live: %d rounds", o.Rounds)
	}
	return nil
}

// Report is the outcome of `clawmesh demo`, its --json contract.
type Report struct {
	Date  string `json:"date"`
	Quick bool   `json:"quick"`
	// Conflict is set for `clawmesh demo --conflict`: its rounds carry
	// personal and shared_only.
	Conflict bool        `json:"conflict,omitempty"`
	Seed     uint64      `json:"seed"`
	Users    []UserInfo  `json:"users"`
	Runs     []RecipeRun `json:"runs"`
	Seconds  float64     `json:"seconds"`
	// Base is how the base model every recipe starts from was made.
	Base *Base `json:"base,omitempty"`
}

// Base describes the demo's base model: the tiny model taught to follow
// the users' directive when a hint in its context says it.
type Base struct {
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

// UserInfo describes one simulated user.
type UserInfo struct {
	Name       string `json:"name"`
	Node       int    `json:"node"`
	Preference string `json:"preference"`
	Style      string `json:"style"`
}

// RecipeRun is one recipe's run.
type RecipeRun struct {
	Recipe string  `json:"recipe"`
	Rounds []Round `json:"rounds"`
	// Before and After are the score before training and after the last
	// version.
	Before   float64   `json:"score_before"`
	After    float64   `json:"score_after"`
	Failover *Failover `json:"failover,omitempty"`
	// LeaderChanges are every change of the trainers' leader seen during
	// the run, in order: the planned stop half way (Planned) and any other
	// (an election nobody asked for).
	LeaderChanges []LeaderChange `json:"leader_changes"`
	Seconds       float64        `json:"seconds"`
	// PersonalElsewhere counts the files outside a node's own personal
	// directory found holding one of its personal adapters (--conflict:
	// searched in every node's and trainer's data; the run fails on any).
	PersonalElsewhere int `json:"personal_elsewhere,omitempty"`
}

// LeaderChange is one change of the trainers' leader.
type LeaderChange struct {
	// At is when it was seen, in seconds since the recipe's run started;
	// Round the round under way then (0: before the first).
	At    float64 `json:"at"`
	Round int     `json:"round"`
	From  string  `json:"from"`
	To    string  `json:"to"`
	// Term is the election's number.
	Term uint64 `json:"term"`
	// Planned is the demo's own stop of the leader (Failover).
	Planned bool `json:"planned"`
}

// Round is one measurement: the version serving on every node, and the
// score it gets.
type Round struct {
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
	// Personal is the personal version each user's node serves on top of
	// Version (--conflict; none in round 0), and SharedOnly the scores
	// the shared version alone gets on the same prompts: Score and
	// PerUser are then shared + personal.
	Personal   []string    `json:"personal,omitempty"`
	SharedOnly *SharedOnly `json:"shared_only,omitempty"`
}

// SharedOnly is a round's score with the shared version alone.
type SharedOnly struct {
	Score   float64   `json:"score"`
	PerUser []float64 `json:"per_user"`
}

// Failover is the trainer stopped half way.
type Failover struct {
	AfterRound int     `json:"after_round"`
	Stopped    string  `json:"stopped"`
	NewLeader  string  `json:"new_leader"`
	Seconds    float64 `json:"seconds"`
}

// Run runs the demo: it says who the users are, makes the base model (or
// takes it from o.ModelCache), then runs each recipe on a mesh of its own
// and measures the score before training and after every version.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Recipes == nil {
		o.Recipes = Recipes
	}
	if o.Rounds == 0 {
		o.Rounds = 8
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	start := time.Now()
	users := scenario.Users()
	if o.Conflict {
		users = scenario.ConflictUsers()
	}
	rep := &Report{Date: start.UTC().Format(time.DateOnly), Quick: o.Quick, Seed: o.Seed, Conflict: o.Conflict}
	for i, u := range users {
		rep.Users = append(rep.Users, UserInfo{Name: u.Name, Node: i + 1, Preference: u.Pref.Name, Style: u.Style.String()})
		fmt.Fprintf(progress, "user %-6s on node %d: likes replies that %s; shows it by %s\n", u.Name, i+1, u.Pref.Name, u.Style)
	}
	PrintLegend(progress)
	cache, err := os.MkdirTemp("", "clawmesh-demo-cache-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(cache)
	if err := os.Mkdir(filepath.Join(cache, "wazero"), 0o700); err != nil {
		return nil, err
	}
	base, b, err := BaseModel(ctx, o.ModelCache, cache, func(f string, a ...any) { fmt.Fprintf(progress, f+"\n", a...) })
	if err != nil {
		return nil, fmt.Errorf("making the base model: %w", err)
	}
	rep.Base = b
	how := fmt.Sprintf("taught in %.0f s", b.Seconds)
	if b.Cached {
		how = "kept from an earlier demo in " + base
	}
	fmt.Fprintf(progress, "base model %s (%s): replies that start with a word %.2f -> %.2f with the hint, %.2f -> %.2f without\n",
		baseModelName, how, b.HintedBefore, b.HintedAfter, b.PlainBefore, b.PlainAfter)
	for _, r := range o.Recipes {
		run, err := runRecipe(ctx, recipeOptions{Recipe: r, Rounds: o.Rounds, Seed: o.Seed, Users: users, Failover: true, Cache: filepath.Join(cache, "wazero"), Base: base, Logs: o.Logs, Personal: o.Conflict}, progress)
		if err != nil {
			return nil, fmt.Errorf("recipe %s: %w", r, err)
		}
		rep.Runs = append(rep.Runs, run)
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// baseModelName is the name of the demo's base model.
const baseModelName = "tiny-directives"

// baseTeach is how the demo's base model is taught.
var baseTeach = learn.TeachOptions{Steps: 24, Anchors: 4, AnchorTokens: 6, Seed: 1, KLCoef: 8}

// BaseModel returns the directory of the demo's base model (a model
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
// pays for the teaching; tmp is where it goes when there is no cache. say
// tells what it does when it teaches.
func BaseModel(ctx context.Context, cache, tmp string, say func(string, ...any)) (string, *Base, error) {
	key := sha256.New()
	fmt.Fprintf(key, "%s|%+v|%q|%q|%d", baseModelName, baseTeach, scenario.TeachPrompts, scenario.WordHints, runtime.NumCPU())
	dir := filepath.Join(tmp, baseModelName)
	if cache != "" {
		dir = filepath.Join(cache, fmt.Sprintf("%s-%x", baseModelName, key.Sum(nil)[:6]))
		var b Base
		if data, err := os.ReadFile(filepath.Join(dir, "lesson.json")); err == nil && json.Unmarshal(data, &b) == nil {
			if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
				b.Cached = true
				return dir, &b, nil
			}
		}
	}
	say("teaching the tiny model to follow a hint that asks for a reply starting with a word (once per machine) ...")
	start := time.Now()
	eng, txt, err := newTiny(native.Options{Name: baseModelName, Seed: 1})
	if err != nil {
		return "", nil, err
	}
	defer eng.Close()
	tok := txt.Tokenizer
	pupil, err := eng.Fork()
	if err != nil {
		return "", nil, err
	}
	defer pupil.Close()
	b := sample.NewBuilder(tok, chat.Qwen3(), sample.Options{})
	lesson, err := learn.TeachDirective(ctx, pupil, tok, b, scenario.TeachPrompts,
		learn.Directive{Hints: scenario.WordHints, Follows: scenario.StartsASCIILetter.Accepts}, baseTeach)
	if err != nil {
		return "", nil, err
	}
	merged, err := pupil.(*native.Engine).MergeAdapter()
	if err != nil {
		return "", nil, err
	}
	defer merged.Close()
	base := &Base{Name: baseModelName, HintedBefore: lesson.HintedBefore, HintedAfter: lesson.HintedAfter,
		PlainBefore: lesson.PlainBefore, PlainAfter: lesson.PlainAfter, Seconds: time.Since(start).Seconds()}
	// Written whole beside its place, then renamed into it: a demo stopped
	// half way leaves no half model to reuse.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", nil, err
	}
	part, err := os.MkdirTemp(filepath.Dir(dir), baseModelName+".part-")
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

// newTiny makes the tiny random model (seed 1), as `clawmesh serve --tiny`
// does.
func newTiny(opts native.Options) (*native.Engine, modeldir.Text, error) {
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		return nil, txt, err
	}
	eng, err := native.NewTiny(cfg, 1, opts)
	return eng, txt, err
}

// groupRecipe is the trainers' name of a demo recipe.
func groupRecipe(r string) string {
	if r == "binary" {
		return loss.RecipeRL.String()
	}
	return r
}

// PrintLegend says, in a few lines, what the words the demo prints mean.
func PrintLegend(w io.Writer) {
	fmt.Fprint(w, `what the words mean:
  score    share of replies to held-back prompts (never trained on) their user accepts
  vN       adapter version N the trainers published (base: none); liked: share of a round's replies liked
  leader   the trainer that runs the rounds and signs versions, elected by the trainers (raft; term: the election's number)
  recipes  binary: RL on the users' rewards; opd: on-policy distillation from the hints in corrections; combined: both
`)
}

// Print writes the score per round, one column per recipe (with
// Conflict, one table per recipe, each user's score with the shared
// version alone and with shared + personal side by side).
func (rep *Report) Print(w io.Writer) {
	if rep.Conflict {
		rep.printConflict(w)
		return
	}
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
		if n := unplanned(r.LeaderChanges); n > 0 {
			fmt.Fprintf(w, "; %d unplanned change(s) of leader", n)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "total %.0f s\n", rep.Seconds)
}

// unplanned counts the changes of leader the demo did not make.
func unplanned(cs []LeaderChange) int {
	n := 0
	for _, c := range cs {
		if !c.Planned {
			n++
		}
	}
	return n
}

// printConflict writes the conflict scenario's tables.
func (rep *Report) printConflict(w io.Writer) {
	for _, r := range rep.Runs {
		fmt.Fprintf(w, "\n%s: each user's score, shared version alone | shared + personal (share of replies to held-back prompts their user accepts)\n", r.Recipe)
		fmt.Fprintf(w, "%-6s %-8s", "round", "version")
		for _, u := range rep.Users {
			fmt.Fprintf(w, " %15s", u.Name)
		}
		fmt.Fprintf(w, " %15s\n", "all")
		for _, rd := range r.Rounds {
			fmt.Fprintf(w, "%-6d %-8s", rd.Round, rd.Version)
			for i := range rep.Users {
				sh, pe := "-", "-"
				if rd.SharedOnly != nil && i < len(rd.SharedOnly.PerUser) {
					sh = fmt.Sprintf("%.2f", rd.SharedOnly.PerUser[i])
				}
				if i < len(rd.PerUser) {
					pe = fmt.Sprintf("%.2f", rd.PerUser[i])
				}
				fmt.Fprintf(w, " %6s | %6s", sh, pe)
			}
			sh := "-"
			if rd.SharedOnly != nil {
				sh = fmt.Sprintf("%.2f", rd.SharedOnly.Score)
			}
			fmt.Fprintf(w, " %6s | %6.2f\n", sh, rd.Score)
		}
		last := r.Rounds[len(r.Rounds)-1]
		fmt.Fprintf(w, "%s: after %d rounds, shared alone %s, shared + personal %s", r.Recipe, len(r.Rounds)-1, conflictLine(rep.Users, last.SharedOnly), perUserLine(rep.Users, last.PerUser))
		fmt.Fprintf(w, " (%.0f s)\n", r.Seconds)
	}
	fmt.Fprintf(w, "total %.0f s\n", rep.Seconds)
}

func conflictLine(users []UserInfo, so *SharedOnly) string {
	if so == nil {
		return "-"
	}
	return perUserLine(users, so.PerUser)
}

func perUserLine(users []UserInfo, xs []float64) string {
	var parts []string
	for i, x := range xs {
		if i < len(users) {
			parts = append(parts, fmt.Sprintf("%s %.2f", users[i].Name, x))
		}
	}
	return strings.Join(parts, ", ")
}
