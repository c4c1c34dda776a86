package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
)

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestSettingsPrecedence(t *testing.T) {
	data := t.TempDir()
	cfg := filepath.Join(data, "config.toml")
	os.WriteFile(cfg, []byte(`
listen = "127.0.0.1:9001"
upstream = "http://file/v1"
upstream_kind = "vllm"
token = "file-token"
allowed_hosts = ["macmini.lan"]
idle_timeout = "45m"
drain_timeout = "90s"
[retention]
max_age = "48h"
[[plugins]]
path = "p.wasm"
weight = 0.5
[[plugins]]
builtin = "toolerror"
enabled = false
[[plugins]]
builtin = "judge"
judge = true
[plugins.config]
votes = 5
style = "strict"
`), 0o600)
	t.Setenv("CLAWMESH_DATA", data)
	t.Setenv("CLAWMESH_UPSTREAM", "http://env/v1")
	t.Setenv("CLAWMESH_LISTEN", "")
	t.Setenv("CLAWMESH_TOKEN", "env-token")

	var s settings
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s.bindCommon(fs)
	fs.StringVar(&s.Upstream, "upstream", "", "")
	fs.StringVar(&s.UpstreamKind, "upstream-kind", "", "")
	fs.DurationVar(&s.MaxAge, "max-age", 0, "")
	fs.DurationVar(&s.IdleTimeout, "idle-timeout", 0, "")
	fs.DurationVar(&s.DrainTimeout, "drain-timeout", 0, "")
	if err := fs.Parse([]string{"--upstream-kind", "ollama", "--token", "flag-token", "--drain-timeout", "5s"}); err != nil {
		t.Fatal(err)
	}
	if err := s.resolve(fs); err != nil {
		t.Fatal(err)
	}
	if s.Data != data || s.Config != cfg {
		t.Errorf("data %q config %q: want %q from the environment and its config.toml", s.Data, s.Config, data)
	}
	if s.Listen != "127.0.0.1:9001" {
		t.Errorf("listen %q: want the file's (the environment's is empty)", s.Listen)
	}
	if s.Upstream != "http://env/v1" {
		t.Errorf("upstream %q: the environment beats the file", s.Upstream)
	}
	if s.UpstreamKind != "ollama" {
		t.Errorf("upstream kind %q: the flag beats the file", s.UpstreamKind)
	}
	if s.Token != "flag-token" {
		t.Errorf("token %q: the flag beats the environment and the file", s.Token)
	}
	if s.MaxAge != 48*time.Hour || s.IdleTimeout != 45*time.Minute {
		t.Errorf("max age %v, idle timeout %v: want the file's", s.MaxAge, s.IdleTimeout)
	}
	if s.DrainTimeout != 5*time.Second {
		t.Errorf("drain timeout %v: the flag beats the file", s.DrainTimeout)
	}
	if len(s.AllowedHosts) != 1 || s.AllowedHosts[0] != "macmini.lan" {
		t.Errorf("allowed hosts %q", s.AllowedHosts)
	}
	if len(s.Plugins) != 3 || s.Plugins[0].Path != filepath.Join(data, "p.wasm") || s.Plugins[0].Weight != 0.5 || !s.Plugins[0].Enabled ||
		s.Plugins[1].Builtin != "toolerror" || s.Plugins[1].Enabled || s.Plugins[1].Weight != 1 ||
		!s.Plugins[2].Judge || s.Plugins[2].Config["votes"] != "5" || s.Plugins[2].Config["style"] != "strict" {
		t.Errorf("plugins %+v", s.Plugins)
	}
}

func TestSettingsErrors(t *testing.T) {
	t.Setenv("CLAWMESH_CONFIG", filepath.Join(t.TempDir(), "missing.toml"))
	var s settings
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s.bindCommon(fs)
	if err := s.resolve(fs); err == nil {
		t.Error("an explicit config file that does not exist must be an error")
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("listen = [1,"), 0o600)
	t.Setenv("CLAWMESH_CONFIG", bad)
	if err := s.resolve(fs); err == nil || !strings.Contains(err.Error(), "bad.toml") {
		t.Errorf("a malformed config file: err = %v, want one naming the file", err)
	}
	for body, want := range map[string]string{
		"upstrem = \"http://x/v1\"":                                   `unknown key "upstrem"`,
		"[[plugins]]\nbuiltin = \"judge\"\nvotes = 3":                 `unknown key "plugins.votes"`,
		"[[plugins]]\nbuiltin = \"judge\"\n[plugins.config]\nx = [1]": "plugins[0].config.x",
	} {
		os.WriteFile(bad, []byte(body), 0o600)
		if err := s.resolve(fs); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", body, err, want)
		}
	}
}

func TestUsage(t *testing.T) {
	out, _, code := runCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "node") || !strings.Contains(out, "pool") {
		t.Errorf("--help: code %d, %q", code, out)
	}
	// An unknown command or flag: the error and where help is, not the
	// whole help.
	_, errs, code := runCLI(t, "frobnicate")
	if code != 2 || errs != "clawmesh: unknown command \"frobnicate\"\nRun 'clawmesh --help' for the commands.\n" {
		t.Errorf("unknown command: code %d, %q", code, errs)
	}
	_, errs, code = runCLI(t, "--data", "x")
	if code != 2 || errs != "clawmesh: unknown flag --data: flags come after the command\nRun 'clawmesh --help' for the commands.\n" {
		t.Errorf("a flag before the command: code %d, %q", code, errs)
	}
	old := localServers
	localServers = nil // no model server to find
	_, errs, code = runCLI(t, "node", "--data", t.TempDir())
	localServers = old
	if code != 2 || !strings.Contains(errs, "no local model server answers") || !strings.Contains(errs, "--upstream") {
		t.Errorf("node without upstream: code %d, %q", code, errs)
	}
	// A bad flag: the error and where help is, not the whole help.
	_, errs, code = runCLI(t, "node", "--bogus")
	if code != 2 || errs != "clawmesh node: flag provided but not defined: -bogus\nRun 'clawmesh node --help' for usage.\n" {
		t.Errorf("unknown flag: code %d, %q", code, errs)
	}
	// A subcommand's bad flag points to that subcommand's help, which lists
	// its flags.
	_, errs, code = runCLI(t, "pool", "ls", "--bogus")
	if code != 2 || errs != "clawmesh pool: flag provided but not defined: -bogus\nRun 'clawmesh pool ls --help' for usage.\n" {
		t.Errorf("unknown flag of pool ls: code %d, %q", code, errs)
	}
	// An unknown subcommand, or a flag where one goes: the error, what the
	// subcommands are, and where help is; not the whole help.
	for _, group := range []string{"pool", "mesh", "bench"} {
		_, errs, code = runCLI(t, group, "--bogus")
		if lines := strings.Split(strings.TrimSpace(errs), "\n"); code != 2 || len(lines) != 2 ||
			!strings.Contains(lines[0], `"--bogus": want `) || lines[1] != "Run 'clawmesh "+group+" --help' for usage." {
			t.Errorf("%s --bogus: code %d, %q", group, code, errs)
		}
	}
	// A data directory that is a file is a bad --data, not a config error.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	for _, cmd := range [][]string{{"node", "--upstream", "http://x/v1"}, {"pool", "stats"}} {
		_, errs, code = runCLI(t, append(cmd, "--data", file)...)
		if code != 2 || !strings.Contains(errs, "--data "+file+" is a file") || strings.Contains(errs, "config") {
			t.Errorf("%s with --data a file: code %d, %q", cmd[0], code, errs)
		}
		under := filepath.Join(file, "data")
		_, errs, code = runCLI(t, append(cmd, "--data", under)...)
		if code != 2 || !strings.Contains(errs, "--data "+under+" is inside a file") || strings.Contains(errs, "config") {
			t.Errorf("%s with --data under a file: code %d, %q", cmd[0], code, errs)
		}
	}
	_, errs, code = runCLI(t, "pool", "ls", "--state", "bogus", "--data", t.TempDir())
	if code != 2 || !strings.Contains(errs, "bogus") {
		t.Errorf("bad state: code %d, %q", code, errs)
	}
	_, errs, code = runCLI(t, "pool", "stats", "--data", filepath.Join(t.TempDir(), "none"))
	if code != 1 || !strings.Contains(errs, "no pool") {
		t.Errorf("stats of a missing pool: code %d, %q", code, errs)
	}
	_, errs, code = runCLI(t, "node", "--upstream", "http://x/v1", "--allow-host", "a/b", "--data", t.TempDir())
	if code != 2 || !strings.Contains(errs, "not a host name") {
		t.Errorf("bad --allow-host: code %d, %q", code, errs)
	}
	for _, cmd := range []string{"node", "serve", "pool", "bench", "reward", "version"} {
		out, errs, code := runCLI(t, cmd, "--help")
		if code != 0 || !strings.Contains(out+errs, "Usage: clawmesh "+cmd) && !strings.Contains(out+errs, "clawmesh "+cmd) {
			t.Errorf("%s --help: code %d, %q", cmd, code, out+errs)
		}
	}
}

// runTestNode starts a node (no scoring) on data in front of upstream,
// serving on a loopback port, and waits until it has written its address
// file, through which the CLI finds it. stop stops and closes it and returns
// what Serve returned; the test's cleanup calls it if the test did not.
func runTestNode(t *testing.T, data, upstream string) (addr string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.New(ctx, node.Config{DataDir: data, Upstream: upstream, NoScoring: true})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		n.Close(context.Background())
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			serveErr = <-done
			n.Close(context.Background())
		})
		return serveErr
	}
	t.Cleanup(func() { stop() })
	for i := 0; i < 100; i++ {
		if _, err := node.ReadAddr(data); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ln.Addr().String(), stop
}

// TestPoolWhileRunningAndStopped records calls through a running node, then
// uses the pool commands both while the node holds the pool (through its
// admin API) and after it stopped (opening the directory), and imports the
// export into a fresh pool.
func TestPoolWhileRunningAndStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up := fakeupstream.New(fakeupstream.Script{})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, upLn)

	data := t.TempDir()
	addr, stop := runTestNode(t, data, "http://"+upLn.Addr().String()+"/v1")
	for i := 0; i < 3; i++ {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i)
		req, _ := http.NewRequest("POST", "http://"+addr+"/s/cli/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}

	live, errs, code := runCLI(t, "pool", "export", "--data", data)
	if code != 0 {
		t.Fatalf("export while running: %d %s", code, errs)
	}
	if got := strings.Count(live, "\n"); got != 3 {
		t.Fatalf("export while running gave %d lines, want 3", got)
	}
	ls, _, code := runCLI(t, "pool", "ls", "--data", data, "--session", "cli")
	if code != 0 || strings.Count(ls, "\n") != 4 {
		t.Errorf("ls while running: %q", ls)
	}
	stats, _, code := runCLI(t, "pool", "stats", "--data", data)
	if code != 0 || !strings.Contains(stats, "steps     3") {
		t.Errorf("stats while running: %q", stats)
	}
	id := strings.Fields(strings.Split(ls, "\n")[1])[0]
	show, _, code := runCLI(t, "pool", "show", "--data", data, id)
	if code != 0 || !strings.Contains(show, "step     "+id) || !strings.Contains(show, "question") {
		t.Errorf("show while running: %q", show)
	}
	// Flags may follow the arguments.
	if show2, errs, code := runCLI(t, "pool", "show", id, "--data", data); code != 0 || show2 != show {
		t.Errorf("show ID --data: %d %s %q", code, errs, show2)
	}
	// Import through the running node: what it holds is already present.
	liveFile := filepath.Join(t.TempDir(), "live.jsonl")
	os.WriteFile(liveFile, []byte(live), 0o600)
	if out, errs, code := runCLI(t, "pool", "import", liveFile, "--data", data); code != 0 || !strings.Contains(out, "imported 0, already present 3") {
		t.Errorf("import while running: %d %s %q", code, errs, out)
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}

	stopped, errs, code := runCLI(t, "pool", "export", "--data", data)
	if code != 0 {
		t.Fatalf("export while stopped: %d %s", code, errs)
	}
	// The same steps either way; the last one was closed (no next state)
	// when the node stopped, so only its state may differ.
	if a, b := exportIDs(live), exportIDs(stopped); a != b {
		t.Errorf("export differs between a running and a stopped node: %s vs %s", a, b)
	}
	file := filepath.Join(t.TempDir(), "steps.jsonl")
	os.WriteFile(file, []byte(stopped+"{not json}\n"), 0o600)
	other := t.TempDir()
	out, _, code := runCLI(t, "pool", "import", "--data", other, file)
	if code != 1 || !strings.Contains(out, "imported 3") || !strings.Contains(out, "line 4") {
		t.Errorf("import with one bad line: code %d, %q", code, out)
	}
	out, _, _ = runCLI(t, "pool", "import", "--data", other, file)
	if !strings.Contains(out, "imported 0, already present 3") {
		t.Errorf("second import: %q", out)
	}
	again, _, _ := runCLI(t, "pool", "export", "--data", other)
	if strings.Count(again, "\n") != 3 {
		t.Errorf("re-export of the import: %q", again)
	}
	// The command as the README gives it, flags last.
	third := t.TempDir()
	if out, errs, code := runCLI(t, "pool", "import", file, "--data", third); code != 1 || !strings.Contains(out, "imported 3") {
		t.Errorf("import FILE --data: %d %s %q", code, errs, out)
	}
	// A usage error creates no pool.
	none := filepath.Join(t.TempDir(), "none")
	if _, _, code := runCLI(t, "pool", "import", "--data", none); code != 2 {
		t.Errorf("import without a file: code %d", code)
	}
	if _, err := os.Stat(none); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("import without a file touched %s: %v", none, err)
	}
}

func exportIDs(jsonl string) string {
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(jsonl), "\n") {
		var s struct{ ID string }
		json.Unmarshal([]byte(l), &s)
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ",")
}

// TestBenchLearn runs the recipe comparison for one round: three recipes,
// each from the same starting policy.
func TestBenchLearn(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a tiny model")
	}
	out, errs, code := runCLI(t, "bench", "learn", "--rounds", "1")
	if code != 0 {
		t.Fatalf("bench learn: %d %s", code, errs)
	}
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && (f[0] == "rl" || f[0] == "opd" || f[0] == "combined") {
			rows++
		}
	}
	if rows != 3 || !strings.Contains(out, "OPD teacher") {
		t.Fatalf("bench learn printed:\n%s", out)
	}
	if _, _, code := runCLI(t, "bench", "learn", "--rounds", "0"); code != 2 {
		t.Errorf("--rounds 0: code %d", code)
	}
}

func TestUserMessage(t *testing.T) {
	for in, want := range map[string]string{
		"pool: step not found: pool: step not found: X":                                                  "step not found: X",
		"reward: already exists: polite is not empty":                                                    "already exists: polite is not empty",
		"wire: bad request: messages is required":                                                        "bad request: messages is required",
		"config /a/config.toml: unknown key \"x\"":                                                       "config /a/config.toml: unknown key \"x\"",
		"node: reward plugins: reward: plugin cannot be loaded: \"p\": read: open /x/pool: no such file": "reward plugins: plugin cannot be loaded: \"p\": read: open /x/pool: no such file",
		"--state: core: unknown state \"bogus\"":                                                         "--state: unknown state \"bogus\"",
		"reward: plugin cannot be loaded: \"x.go\": compile: meter: cannot instrument module: not WASM":  "plugin cannot be loaded: \"x.go\": compile: cannot instrument module: not WASM",
		"tasks: bad task: line 3":                                                                        "bad task: line 3",
		"unknown store: pool":                                                                            "unknown store: pool",
		"group: bad configuration: loss: unknown recipe \"x\"":                                           "bad configuration: unknown recipe \"x\"",
	} {
		if got := userMessage(in); got != want {
			t.Errorf("userMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

// buildBinary builds the clawmesh command, with the build tags given, into
// a temporary directory and returns its path.
func buildBinary(t *testing.T, tags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "clawmesh")
	args := []string{"build"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	if out, err := exec.Command("go", append(args, "-o", bin, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
