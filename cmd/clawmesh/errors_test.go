package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// TestErrorsSayWhatToDo runs the binary into the common failures of its
// commands (nothing running on the data directory, a process that stopped
// and left its address, the wrong kind of directory, no mesh, a bad config
// file or flag, a port in use, a refused token, and a running node's and
// a running trainer's refusals) and checks what it prints: a non-zero exit, and on stderr
// exactly two lines, what is wrong and then what to do, naming a command;
// no HTTP status nor the dialer's internals.
func TestErrorsSayWhatToDo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a node and a trainer")
	}
	bin := buildBinary(t)
	home := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CLAWMESH_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+home)

	// Addresses: one nothing listens on (a process that stopped), one a
	// process holds.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	empty := t.TempDir()
	staleNode, staleTrainer := t.TempDir(), t.TempDir()
	if err := adminapi.WriteAddr(staleNode, node.AddrFile, dead); err != nil {
		t.Fatal(err)
	}
	if err := adminapi.WriteAddr(staleTrainer, trainer.AddrFile, dead); err != nil {
		t.Fatal(err)
	}
	badConfig := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(badConfig, []byte("listen = [1,\n"), 0o600)

	// One node, in a mesh, running on a.
	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	runMeshNode(t, a, "http://127.0.0.1:9/v1", share.Policy{})
	stranger := "12D3KooWGzKqUuR5iJzuSrL6Tq2z4QeG2fBhDiDfdVL6ME8VQ5kA"

	// One trainer, in a mesh of its own.
	ctx := context.Background()
	cl, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Dir: filepath.Join(t.TempDir(), "mesh"),
		Timing: trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond},
		Group:  group.Config{Deadline: 4 * time.Second, LocalSteps: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr := cl.DataDir(0)
	if err := cl.WaitUntil(ctx, time.Minute, "the trainer's admin API and version 0", func() bool {
		_, err := trainer.ReadAddr(tr)
		return err == nil && len(cl.Trainer(0).Lineage()) > 0
	}); err != nil {
		t.Fatal(err)
	}

	// wrongToken makes a's token file differ from the running node's, and
	// hides its socket, so that the command reaches it over TCP with a
	// token it refuses.
	wrongToken := func() func() {
		tok := filepath.Join(a, adminapi.TokenFile)
		sock := filepath.Join(a, adminapi.SocketFile)
		orig, err := os.ReadFile(tok)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(sock, sock+".away"); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(tok, []byte(strings.Repeat("0", 64)+"\n"), 0o600)
		return func() {
			os.WriteFile(tok, orig, 0o600)
			os.Rename(sock+".away", sock)
		}
	}

	for _, c := range []struct {
		name  string
		args  []string
		hint  string // the hint names this
		setup func() (undo func())
	}{
		{"no node runs", []string{"weights", "ls", "--data", empty}, "'clawmesh node --data " + empty + "'", nil},
		{"a node that stopped", []string{"login", "--data", staleNode}, "'clawmesh node --data " + staleNode + "'", nil},
		{"a trainer that stopped", []string{"trainer", "status", "--data", staleTrainer}, "'clawmesh trainer --data " + staleTrainer + "'", nil},
		{"a node's directory for a trainer", []string{"trainer", "status", "--data", a}, "'clawmesh mesh status --data " + a + "'", nil},
		{"a node's directory for tasks", []string{"tasks", "ls", "--data", a}, "'clawmesh mesh status --data " + a + "'", nil},
		{"no mesh", []string{"mesh", "status", "--data", empty}, "'clawmesh mesh init'", nil},
		{"no pool", []string{"pool", "stats", "--data", empty}, "'clawmesh node --data " + empty + "'", nil},
		{"a malformed config", []string{"pool", "stats", "--config", badConfig, "--data", empty}, "'clawmesh node --help'", nil},
		{"an unknown flag", []string{"node", "--bogus"}, "'clawmesh node --help'", nil},
		{"a port in use", []string{"node", "--data", t.TempDir(), "--upstream", "http://127.0.0.1:9/v1", "--listen", held.Addr().String()}, "another --listen", nil},
		{"no plugin directory", []string{"reward", "build", filepath.Join(empty, "polite")}, "'clawmesh reward new NAME'", nil},
		{"not a token", []string{"join", "BADTOKEN", "--data", t.TempDir()}, "'clawmesh join --help'", nil},
		{"in a mesh already", []string{"mesh", "init", "--data", a}, "'clawmesh mesh status'", nil},
		{"not a peer id", []string{"mesh", "revoke", "bad", "--data", a}, "'clawmesh mesh peers'", nil},
		// The running node's refusals: 409, 404s, 401.
		{"a peer the node does not know", []string{"mesh", "revoke", stranger, "--data", a}, "'clawmesh mesh revoke " + stranger + " --force'", nil},
		{"no such batch", []string{"mesh", "batch", "b-none", "--data", a}, "'clawmesh mesh batches --data " + a + "'", nil},
		{"no such step", []string{"pool", "show", "s-none", "--data", a}, "'clawmesh pool ls --data " + a + "'", nil},
		{"no such version", []string{"weights", "use", "v99", "--data", a}, "`clawmesh weights ls`", nil},
		{"a token the node refuses", []string{"pool", "stats", "--data", a}, "--token", wrongToken},
		// The running trainer's refusal: 400.
		{"a setting the trainer refuses", []string{"trainer", "config", "--lr", "-1", "--data", tr}, "'clawmesh trainer config --help'", nil},
		{"a trainer's directory for a node", []string{"weights", "ls", "--data", tr}, "'clawmesh mesh status --data " + tr + "'", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				defer c.setup()()
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, c.args...)
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
				t.Fatalf("%q: %v, want a non-zero exit; stderr:\n%s", c.args, err, stderr.String())
			}
			checkErrorText(t, c.args, stderr.String(), c.hint)
		})
	}
}

var (
	// leaks are what an error must not show a user: HTTP statuses and the
	// dialer's words.
	leaks = regexp.MustCompile(`Not Found|Bad Request|Conflict|Unauthorized|Forbidden|Internal Server Error|Bad Gateway|` +
		`\b[45]\d\d [A-Z]|HTTP/|dial tcp|dial unix|connect: |Get "|Post "|page not found`)
	commandRef = regexp.MustCompile("['`]clawmesh ([a-z]+)")
)

// checkErrorText checks stderr of a failed command: two lines, the error
// ("clawmesh CMD: ...") and what to do, naming a command of clawmesh's and
// the text hint; no leaks.
func checkErrorText(t *testing.T, args []string, stderr, hint string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if len(lines) != 2 || !strings.HasSuffix(stderr, "\n") {
		t.Fatalf("%q: stderr is %d lines, want 2 (the error, then what to do):\n%s", args, len(lines), stderr)
	}
	if !strings.HasPrefix(lines[0], "clawmesh "+args[0]+": ") {
		t.Errorf("%q: the error line %q does not start with %q", args, lines[0], "clawmesh "+args[0]+": ")
	}
	if m := leaks.FindString(stderr); m != "" {
		t.Errorf("%q: stderr says %q:\n%s", args, m, stderr)
	}
	refs := commandRef.FindAllStringSubmatch(lines[1], -1)
	known := false
	for _, r := range refs {
		for _, cmd := range commands {
			known = known || cmd.name == r[1]
		}
	}
	if !known {
		t.Errorf("%q: the hint %q names no clawmesh command", args, lines[1])
	}
	if !strings.Contains(lines[1], hint) {
		t.Errorf("%q: the hint %q does not say %q", args, lines[1], hint)
	}
}

// TestPrintError: an error of several lines prints as one, with the hint
// its wrapper gave or a pointer to the command's --help; a usage error
// points to the --help of the command that has the flag.
func TestPrintError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{errors.New("pool: damaged: manifest\n  unreadable\n"), "clawmesh pool: damaged: manifest; unreadable\nRun 'clawmesh pool --help' for what it needs.\n"},
		{withHint(errors.New("no node runs on D"), "start one with 'clawmesh node --data D'"), "clawmesh pool: no node runs on D\nStart one with 'clawmesh node --data D'.\n"},
		{usageErr("--limit must not be negative"), "clawmesh pool: --limit must not be negative\nRun 'clawmesh pool --help' for usage.\n"},
		{errors.New("step not found (`clawmesh pool ls` lists them)"), "clawmesh pool: step not found\n`clawmesh pool ls` lists them.\n"},
	} {
		var b strings.Builder
		printError(&b, "pool", c.err)
		if b.String() != c.want {
			t.Errorf("%q: printed\n%q, want\n%q", c.err, b.String(), c.want)
		}
	}
}
