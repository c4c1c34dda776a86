// Command clawmesh is the one binary of a clawmesh mesh: it runs a device's
// node beside an agent, reads and feeds its DataPool, builds and tests reward
// plugins, and measures the parts. It parses flags, builds configs and calls
// into the packages; the logic lives there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands []command

func init() {
	commands = []command{
		{"node", "run a device node: the gateway your agent points at, recording into the pool", runNode},
		{"setup", "route an agent through the node (setup openclaw), or serve a model pulled with Ollama through llama-server (setup ollama --model NAME)", runSetup},
		{"service", "run the node at login, restarted on failure: install, status, logs, uninstall", runService},
		{"serve", "serve a model with the native Go engine: an OpenAI-compatible LLM server with hot adapter swap", runServe},
		{"pool", "inspect, export and import the DataPool (stats, ls, show, export, import, preview)", runPool},
		{"scrub", "show what would leave this device: text or steps with personal data and secrets replaced", func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runScrub(ctx, args, os.Stdin, stdout, stderr)
		}},
		{"mesh", "make a mesh and see it: init, status, peers, batches, batch, revoke", runMesh},
		{"invite", "print an invite token for another device or a trainer to join the mesh", runInvite},
		{"join", "join a mesh with an invite token", runJoin},
		{"trainer", "run a trainer peer in the trainers' raft group (status, leave, config)", runTrainer},
		{"tasks", "train on a task set with a verifier plugin: add, ls, status (on a trainer)", runTasks},
		{"weights", "the adapter versions the trainers publish: list them, fetch one, pin one, export one for another server (ls, get, use, export)", runWeights},
		{"personal", "your personal adapter, learned from this device's steps on top of the mesh's: status, reset, off, on", runPersonal},
		{"login", "print a single-use URL that lets a browser into a running node's admin pages", runLogin},
		{"reward", "write, build and test WASM reward plugins (new, build, test)", runReward},
		{"demo", "run a whole mesh on this machine and watch it learn three simulated users' preferences", runDemo},
		{"sim", "simulate the mesh at 1,000 devices: churn, partitions, relays, poisoners (deterministic)", runSim},
		{"bench", "measure the parts (gateway, pool, engine, learn, scrub, mesh, trainers)", runBench},
		{"version", "print the version", runVersion},
	}
}

// version and revision are set at build time by release builds
// (scripts/release.sh): -ldflags "-X main.version=v0.1.0 -X main.revision=<commit>".
// Other builds take the revision from the VCS stamp Go adds.
var (
	version  = "dev"
	revision = ""
)

func usage(w io.Writer) {
	fmt.Fprintf(w, `clawmesh: agents that learn from their own use, on your devices, together.

Usage: clawmesh <command> [flags] [args]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `
Run 'clawmesh <command> --help' for a command's flags and examples.

Quick start: run an LLM server (Ollama, vLLM, llama.cpp ...), then
  clawmesh node --upstream http://127.0.0.1:11434/v1
and point your agent's OpenAI base URL at http://127.0.0.1:8400/v1.
`)
}

// errUsage marks an error whose message is a usage problem: main prints it
// with a pointer to --help and exits 2. Other errors exit 1; printError
// says how every error is printed.
var errUsage = errors.New("usage")

func usageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

// flagError is a bad flag of the command cmd ("clawmesh pool ls"), whose
// --help lists that command's flags.
type flagError struct {
	cmd string
	err error
}

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		}
		printError(stderr, c.name, err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	// As for a bad flag: the error and where help is, not the whole help.
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "clawmesh: unknown flag %s: flags come after the command\n", args[0])
	} else {
		fmt.Fprintf(stderr, "clawmesh: unknown command %q\n", args[0])
	}
	fmt.Fprintln(stderr, "Run 'clawmesh --help' for the commands.")
	return 2
}

// internalPrefixes are the package prefixes of the packages' errors
// ("pool: step not found"), which say where an error came from to a
// programmer and nothing to a user.
var internalPrefixes = map[string]bool{
	"node": true, "pool": true, "reward": true, "wire": true, "share": true, "mesh": true, "setup": true,
	"trainer": true, "gateway": true, "session": true, "scrub": true, "store": true, "peer": true,
	"member": true, "batch": true, "weights": true, "adminapi": true, "engine": true, "serve": true,
	"core": true, "meter": true, "group": true, "p2p": true, "raftstore": true, "raftnet": true,
	"adapter": true, "adapters": true, "learn": true, "tokenizer": true, "torch": true, "native": true,
	"swap": true, "safetensors": true, "httpguard": true, "sse": true, "tasks": true, "sample": true,
	"bench": true, "loss": true, "personal": true,
}

// userMessage is an error's message as a user reads it: without the
// packages' prefixes, and without a part said twice in a row. A last part
// is kept whatever it says: it is no prefix.
func userMessage(msg string) string {
	var out []string
	parts := strings.Split(msg, ": ")
	for i, part := range parts {
		if internalPrefixes[part] && i < len(parts)-1 || len(out) > 0 && out[len(out)-1] == part {
			continue
		}
		out = append(out, part)
	}
	if len(out) == 0 {
		return msg
	}
	return strings.Join(out, ": ")
}

// newFlags makes a FlagSet whose --help prints the given text before the
// flags, and whose parse errors are usage errors.
func newFlags(name, help string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("clawmesh "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\nFlags:\n", help)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args, flags before, between or after the positional
// arguments (`pool import logs.jsonl --data DIR`); after "--" everything is
// positional. A bad flag is a usage error, --help is flag.ErrHelp.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	// The flag package prints a bad flag's error and the whole help; the
	// caller prints the error alone, with a pointer to --help.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	defer fs.SetOutput(out)
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(out)
				fs.Usage()
				return err
			}
			return &flagError{cmd: strings.TrimSpace(fs.Name()), err: fmt.Errorf("%w: %v", errUsage, err)}
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	// Leave the positional arguments in fs.Args(); the flags keep their values.
	return fs.Parse(append([]string{"--"}, pos...))
}

func runVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "Usage: clawmesh version\n\nPrints the version of this clawmesh binary, the revision it was built from\n(with +dirty for a tree with changes) and the Go release that built it.\n", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	fmt.Fprintln(stdout, versionLine(debug.ReadBuildInfo()))
	return nil
}

// versionLine says which clawmesh this is: the version set at build time
// (else the module's), the VCS revision and time it was built from, with
// "+dirty" when the tree had changes, and the Go release.
func versionLine(bi *debug.BuildInfo, ok bool) string {
	v := version
	if !ok {
		return "clawmesh " + v
	}
	if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if revision != "" {
		rev, at, dirty = strings.TrimSuffix(revision, "+dirty"), "", strings.HasSuffix(revision, "+dirty")
	}
	line := "clawmesh " + v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+dirty"
		}
		line += " (" + rev
		if at != "" {
			line += ", " + at
		}
		line += ")"
	}
	return line + " " + bi.GoVersion
}
