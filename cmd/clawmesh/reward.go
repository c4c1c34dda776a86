package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/node"
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

With --verifier, main.go is a verifier for a task set instead: it reads the
task's answer from its input (input.task) and scores a reply +1 when it
matches (the same number, or the same text after trimming), else -1.

Examples:
  clawmesh reward new polite && clawmesh reward build ./polite
  clawmesh reward new --verifier checker && clawmesh reward build ./checker
  clawmesh tasks add math.jsonl --reward ./checker/checker.wasm --data DIR`, stderr)
	dir := fs.String("dir", "", "directory to create (default ./NAME)")
	verifier := fs.Bool("verifier", false, "scaffold a verifier: a plugin that scores a task's reply against its answer")
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
	scaffold := reward.Scaffold
	if *verifier {
		scaffold = reward.ScaffoldVerifier
	}
	if err := scaffold(d, pos[0]); errors.Is(err, reward.ErrExists) {
		return withHint(fmt.Errorf("%s already exists and is not empty", d), "Name a new directory ('clawmesh reward new %s --dir DIR'), or empty it", pos[0])
	} else if err != nil {
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
	if fi, err := os.Stat(pos[0]); err != nil || !fi.IsDir() {
		return withHint(fmt.Errorf("no plugin directory %s", pos[0]), "Make one with 'clawmesh reward new NAME', or give the directory of one")
	}
	path, err := reward.Build(ctx, pos[0], *out, stderr)
	if err != nil {
		return buildFailed(pos[0], err)
	}
	fmt.Fprintln(stdout, path)
	return nil
}

func rewardTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reward test", `clawmesh reward test PLUGIN.wasm... --steps FILE: score recorded steps.

For every step of FILE (JSONL as 'clawmesh pool export' writes it) and every
plugin, prints the score or "abstain" with the reason, the hint if any, and
the time the call took. With --builtin the built-in plugins run too.

Plugins may not call the judge (an LLM) unless --judge names an
OpenAI-compatible server to ask; then every plugin named here may, and with
--builtin the built-in PRM judge runs too.

Examples:
  clawmesh reward test polite.wasm --steps steps.jsonl --builtin
  clawmesh reward test myjudge.wasm --steps steps.jsonl --judge http://127.0.0.1:11434/v1 --judge-model qwen3:8b`, stderr)
	stepsPath := fs.String("steps", "", "JSONL file of steps (required; - for stdin)")
	withBuiltin := fs.Bool("builtin", false, "also run the built-in plugins")
	deadline := fs.Duration("deadline", reward.DefaultDeadline, "deadline of one plugin call")
	memory := fs.Uint64("memory-mib", reward.DefaultMemoryLimit>>20, "memory cap of a plugin instance, MiB")
	judgeURL := fs.String("judge", "", "base URL of an OpenAI-compatible server (ending in /v1) that judge calls ask; permits judge to the plugins")
	judgeModel := fs.String("judge-model", "", "model name sent with judge calls")
	judgeTimeout := fs.Duration("judge-timeout", reward.DefaultJudgeTimeout, "time budget of the judge calls of one plugin call")
	judgeToken := fs.String("judge-token", "", "bearer token for the --judge server (default $CLAWMESH_UPSTREAM_TOKEN)")
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
	var judge func(context.Context, string) (string, error)
	if *judgeURL != "" {
		u, err := url.Parse(*judgeURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageErr("--judge must be an http(s) base URL, such as http://127.0.0.1:11434/v1")
		}
		token := *judgeToken
		if token == "" {
			token = os.Getenv("CLAWMESH_UPSTREAM_TOKEN")
		}
		judge = node.Judge(*judgeURL, *judgeModel, token)
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
		return withHint(fmt.Errorf("%s: %w", *stepsPath, err), "Give --steps what 'clawmesh pool export' writes: one step a line, as JSON")
	}
	var plugins []reward.PluginConfig
	for _, p := range pos {
		plugins = append(plugins, reward.PluginConfig{Name: strings.TrimSuffix(filepath.Base(p), ".wasm"), Path: p, Enabled: true, Judge: judge != nil})
	}
	if *withBuiltin {
		for _, b := range reward.Builtins() {
			if b.Judge && judge == nil {
				continue // there is no LLM to ask
			}
			plugins = append(plugins, b)
		}
	}
	// FailureLimit -1: a plugin that fails is run on every step all the
	// same, so that each line says why. Strict: a file that is not a usable
	// plugin (a .go file, a module without the exports) is an error, not a
	// plugin that abstains on every step.
	r, err := reward.New(ctx, reward.Options{Plugins: plugins, Deadline: *deadline, MemoryLimit: *memory << 20,
		Judge: judge, JudgeTimeout: *judgeTimeout, FailureLimit: -1, Strict: true})
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
	fmt.Fprintf(stdout, "%s, %s, %s\n", plural(len(steps), "step", "steps"), plural(scored, "score", "scores"), plural(abstained, "abstention", "abstentions"))
	return nil
}
