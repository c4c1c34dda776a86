package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/reward"
)

const rewardHelp = `clawmesh reward: write, build and test WASM reward plugins.

Usage:
  clawmesh reward new NAME [--dir DIR]        scaffold a Go plugin in ./NAME
  clawmesh reward build DIR [-o OUT.wasm]     compile it (GOOS=wasip1, c-shared)
  clawmesh reward test PLUGIN.wasm... --steps steps.jsonl [--builtin]
                                              score recorded steps with it

Example:
  clawmesh reward new polite
  clawmesh reward build ./polite
  clawmesh pool export --data ~/.clawmesh > steps.jsonl
  clawmesh reward test polite/polite.wasm --steps steps.jsonl --builtin

The plugin ABI is in wasm-rewards/ABI.md; a plugin can be written in any
language that targets WebAssembly.`

func runReward(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageErr("a subcommand is needed: new, build or test")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, rewardHelp)
		return nil
	case "new":
		return rewardNew(args[1:], stdout, stderr)
	case "build":
		return rewardBuild(ctx, args[1:], stdout, stderr)
	case "test":
		return rewardTest(ctx, args[1:], stdout, stderr)
	}
	return usageErr("unknown subcommand %q: want new, build or test", args[0])
}

// parseAll parses flags that may come before, between or after the
// positional arguments, and returns the positional ones.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func rewardNew(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reward new", `clawmesh reward new NAME: scaffold a Go reward plugin.

Writes NAME/go.mod, NAME/main.go (a plugin that rewards thanks), a test, and
NAME/kit, a copy of the wasm-rewards kit that go.mod points at with a replace
directive, so the plugin builds offline with only a Go toolchain (≥ 1.24).

Example:
  clawmesh reward new polite && clawmesh reward build ./polite`, stderr)
	dir := fs.String("dir", "", "directory to create (default ./NAME)")
	pos, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("want exactly one plugin NAME")
	}
	d := *dir
	if d == "" {
		d = pos[0]
	}
	if err := reward.Scaffold(d, pos[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created %s; next: clawmesh reward build %s\n", d, d)
	return nil
}

func rewardBuild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reward build", `clawmesh reward build DIR: compile a Go reward plugin to WebAssembly.

Runs GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath in DIR;
needs the go command (≥ 1.24) on PATH.

Example:
  clawmesh reward build ./polite          # -> polite/polite.wasm`, stderr)
	out := fs.String("o", "", "output file (default DIR/<base of DIR>.wasm)")
	pos, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("want exactly one plugin directory")
	}
	path, err := reward.Build(ctx, pos[0], *out, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, path)
	return nil
}

func rewardTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reward test", `clawmesh reward test PLUGIN.wasm... --steps FILE: score recorded steps.

For every step of FILE (JSONL as 'clawmesh pool export' writes it) and every
plugin, prints the score or "abstain" with the reason, the hint if any, and
the time the call took. With --builtin the built-in plugins run too.

Example:
  clawmesh reward test polite.wasm --steps steps.jsonl --builtin`, stderr)
	stepsPath := fs.String("steps", "", "JSONL file of steps (required; - for stdin)")
	withBuiltin := fs.Bool("builtin", false, "also run the built-in plugins")
	deadline := fs.Duration("deadline", reward.DefaultDeadline, "deadline of one plugin call")
	memory := fs.Uint64("memory-mib", reward.DefaultMemoryLimit>>20, "memory cap of a plugin instance, MiB")
	pos, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if *stepsPath == "" {
		return usageErr("--steps is required")
	}
	if len(pos) == 0 && !*withBuiltin {
		return usageErr("name at least one PLUGIN.wasm, or --builtin")
	}
	var in io.Reader = os.Stdin
	if *stepsPath != "-" {
		f, err := os.Open(*stepsPath)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	steps, err := reward.ReadSteps(in)
	if err != nil {
		return fmt.Errorf("%s: %w", *stepsPath, err)
	}
	var plugins []reward.PluginConfig
	for _, p := range pos {
		plugins = append(plugins, reward.PluginConfig{Name: strings.TrimSuffix(filepath.Base(p), ".wasm"), Path: p, Enabled: true})
	}
	if *withBuiltin {
		for _, b := range reward.Builtins() {
			if b.Judge {
				continue // there is no LLM to ask here
			}
			plugins = append(plugins, b)
		}
	}
	r, err := reward.New(ctx, reward.Options{Plugins: plugins, Deadline: *deadline, MemoryLimit: *memory << 20})
	if err != nil {
		return err
	}
	defer r.Close(context.WithoutCancel(ctx))
	var scored, abstained int
	reward.TestPlugins(ctx, r, steps, func(res reward.StepResult) {
		verdict := "abstain"
		if v := res.Score.Value; v != nil {
			verdict = fmt.Sprintf("%+.2f", *v)
			scored++
		} else {
			abstained++
		}
		fmt.Fprintf(stdout, "%-24s %-12s %-8s %8s", res.Step, res.Plugin, verdict, res.Took.Round(10*time.Microsecond))
		if res.Score.Reason != "" {
			fmt.Fprintf(stdout, "  why: %s", oneLine(res.Score.Reason, 100))
		}
		if len(res.Score.Labels) > 0 {
			fmt.Fprintf(stdout, "  labels: %s", strings.Join(res.Score.Labels, ","))
		}
		if res.Score.Hint != "" {
			fmt.Fprintf(stdout, "  hint: %s", oneLine(res.Score.Hint, 120))
		}
		fmt.Fprintln(stdout)
	})
	fmt.Fprintf(stdout, "%d steps, %d scores, %d abstentions\n", len(steps), scored, abstained)
	return nil
}
