package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/clawmesh/clawmesh/sim/live"
)

const demoHelp = `Usage: clawmesh demo [--quick] [--conflict] [--recipe binary|opd|combined|all] [--json FILE] [--plot FILE.png] [--seed N]

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

With --conflict, the users disagree: alice wants a reply that starts with
a word, bob an indented one (a space or a new line first), and carol, who
agrees with neither, clean text (no garbled character). One shared adapter
cannot please both alice and bob, so each node also
trains a personal adapter on its own user's steps only (as [personal] mode
= "local" does on a device) and serves it stacked on the shared version.
Every round is measured twice, per user: with the shared version alone (on
a model server of its own) and with shared + personal (the user's node).
It runs the binary recipe unless --recipe says otherwise; the table, the
plot and the JSON (rounds[].personal, rounds[].shared_only) show both.

Examples:
  clawmesh demo                         # all three recipes, a few minutes
  clawmesh demo --quick                 # fewer rounds, the combined recipe
  clawmesh demo --json out.json --plot score.png
  clawmesh demo --conflict              # preferences that conflict, and personal adapters

At the end it says where it wrote the plot, the JSON and the logs, by
absolute path. Unless --plot names a file, the plot goes to
clawmesh-demo.png in the --logs directory, else in the user's cache
directory (clawmesh/demo, e.g. ~/.cache/clawmesh/demo on Linux).
`

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", demoHelp, stderr)
	quick := fs.Bool("quick", false, "fewer rounds and one recipe (combined unless --recipe says): the short form CI runs")
	recipe := fs.String("recipe", "", "binary, opd, combined or all (default all; combined with --quick)")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file (- for stdout): the score per round, the planned failover, and every change of the trainers' leader (leader_changes, planned or not)")
	plot := fs.String("plot", "", "write a plot of the score per round to this PNG file (default clawmesh-demo.png in the --logs directory, else in the user's cache directory, clawmesh/demo; - for none)")
	seed := fs.Uint64("seed", 1, "seed of the users' choices and of the sampling")
	rounds := fs.Int("rounds", 0, "versions trained per recipe (default 8, 4 with --quick)")
	conflict := fs.Bool("conflict", false, "users whose preferences conflict (a word first, an indented reply) and one who agrees with neither, each node with a personal adapter on the shared version; shows both per user")
	logs := fs.String("logs", "", "write each node's and trainer's log (debug level) to a file in this directory: RECIPE-node1.log, RECIPE-trainer1.log, ...")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("demo takes no arguments (got %q)", fs.Arg(0))
	}
	if *conflict && *recipe == "" {
		*recipe = "binary"
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
	if *plot != "" && *plot != "-" && !strings.HasSuffix(strings.ToLower(*plot), ".png") {
		return usageErr("--plot writes a PNG: give a file name ending in .png")
	}

	progress := stdout
	if *jsonOut == "-" {
		progress = stderr
	}
	if *logs != "" {
		if err := os.MkdirAll(*logs, 0o755); err != nil {
			return fmt.Errorf("--logs: %w", err)
		}
	}
	modelCache, err := os.UserCacheDir()
	if err == nil {
		modelCache = filepath.Join(modelCache, "clawmesh", "demo")
	} else {
		modelCache = ""
	}
	rep, err := live.Run(ctx, live.Options{Recipes: recipes, Rounds: *rounds, Seed: *seed, Quick: *quick,
		ModelCache: modelCache, Logs: *logs, Progress: progress, Conflict: *conflict})
	if err != nil {
		return err
	}
	rep.Print(progress)
	// What the demo wrote, said last and by absolute path, so that it can
	// be found from wherever the demo ran.
	var written []string
	if *plot != "-" {
		path, err := demoPlotPath(*plot, *logs)
		if err != nil {
			return fmt.Errorf("writing the plot: %w", err)
		}
		if err := plotDemo(rep, path); err != nil {
			return fmt.Errorf("writing the plot: %w", err)
		}
		written = append(written, "plot written to "+path)
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		b = append(b, '\n')
		if *jsonOut == "-" {
			_, err = stdout.Write(b)
		} else {
			err = os.WriteFile(*jsonOut, b, 0o644)
			written = append(written, "JSON written to "+absPath(*jsonOut))
		}
		if err != nil {
			return err
		}
	}
	if *logs != "" {
		written = append(written, "logs written to "+absPath(*logs))
	}
	for _, l := range written {
		fmt.Fprintln(progress, l)
	}
	return nil
}

// demoPlotPath is the absolute path the plot goes to: plot when given,
// else clawmesh-demo.png in the logs directory when there is one, else in
// the user's cache directory (clawmesh/demo, beside the base model), else
// in the temporary directory. It never lands in the current directory
// unasked (in a clone, as a file git does not know).
func demoPlotPath(plot, logs string) (string, error) {
	if plot != "" {
		return absPath(plot), nil
	}
	dir := logs
	if dir == "" {
		if c, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(c, "clawmesh", "demo")
		} else {
			dir = os.TempDir()
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return absPath(filepath.Join(dir, "clawmesh-demo.png")), nil
}

// absPath is p made absolute, or p when it cannot be.
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
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
