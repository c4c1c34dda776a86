package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/setup"
)

const userOpenClaw = `// My agent.
{
  models: {
    providers: {
      // Ollama, on this Mac.
      ollama: {
        baseUrl: 'http://127.0.0.1:11434/v1', // default port
        api: 'openai-completions',
        apiKey: 'ollama',
        models: [{ id: 'qwen3:8b', name: 'Qwen3' }],
      },
    },
  },
  agents: { defaults: { model: { primary: 'ollama/qwen3:8b' } } },
}
`

// openClawHome makes a home directory with OpenClaw's config at its
// default place, with OpenClaw's own variables cleared, and returns the
// config's path.
func openClawHome(t *testing.T, content string) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("OPENCLAW_CONFIG_PATH", "")
	t.Setenv("OPENCLAW_STATE_DIR", "")
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG", "CLAWMESH_UPSTREAM", "CLAWMESH_LISTEN", "CLAWMESH_TOKEN", "CLAWMESH_UPSTREAM_KIND"} {
		t.Setenv(v, "")
	}
	path := filepath.Join(home, ".openclaw", "openclaw.json")
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSetupOpenClawFile wires a JSON5 config with comments by editing the
// file (no openclaw command): the dry run shows the change and makes none;
// the setup changes the provider's baseUrl alone, keeps a copy, and gives
// the node its upstream; a second run changes nothing; the undo gives back
// the file byte for byte.
func TestSetupOpenClawFile(t *testing.T) {
	path := openClawHome(t, userOpenClaw)
	data := t.TempDir()

	out := cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none", "--dry-run")
	for _, want := range []string{"-        baseUrl: 'http://127.0.0.1:11434/v1', // default port", "+        baseUrl: 'http://127.0.0.1:8400/v1', // default port",
		`+upstream = "http://127.0.0.1:11434/v1"`, `+upstream_kind = "ollama"`, "Nothing was changed"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run does not show %q:\n%s", want, out)
		}
	}
	if b, _ := os.ReadFile(path); string(b) != userOpenClaw {
		t.Fatal("the dry run changed OpenClaw's config")
	}
	if _, err := os.Stat(filepath.Join(data, "config.toml")); err == nil {
		t.Fatal("the dry run wrote the node's config")
	}

	out = cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none")
	if !strings.Contains(out, `provider "ollama" now goes through the node at http://127.0.0.1:8400/v1`) {
		t.Errorf("setup said:\n%s", out)
	}
	after, _ := os.ReadFile(path)
	want := strings.Replace(userOpenClaw, "'http://127.0.0.1:11434/v1'", "'http://127.0.0.1:8400/v1'", 1)
	if string(after) != want {
		t.Errorf("OpenClaw's config after setup:\n%s\nwant only the baseUrl changed:\n%s", after, want)
	}
	backups, _ := filepath.Glob(path + ".clawmesh-*.bak")
	if len(backups) != 1 {
		t.Fatalf("backups %v, want one", backups)
	}
	if b, _ := os.ReadFile(backups[0]); string(b) != userOpenClaw {
		t.Error("the backup is not the config as it was")
	}
	var fc fileConfig
	if _, err := toml.DecodeFile(filepath.Join(data, "config.toml"), &fc); err != nil || fc.Upstream != "http://127.0.0.1:11434/v1" || fc.UpstreamKind != "ollama" {
		t.Errorf("node config: %+v (%v), want the provider's URL as upstream, kind ollama", fc, err)
	}

	out = cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none")
	if !strings.Contains(out, "nothing to change") {
		t.Errorf("second setup said:\n%s", out)
	}
	if b, _ := os.ReadFile(path); string(b) != want {
		t.Error("the second setup changed the config")
	}

	out = cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none", "--undo")
	if !strings.Contains(out, "goes to http://127.0.0.1:11434/v1 again") {
		t.Errorf("undo said:\n%s", out)
	}
	if b, _ := os.ReadFile(path); string(b) != userOpenClaw {
		t.Errorf("after undo:\n%s\nwant the original byte for byte", b)
	}
	_, errs, code := runCLI(t, "setup", "openclaw", "--data", data, "--openclaw", "none", "--undo")
	if code != 1 || !strings.Contains(errs, "nothing to undo") {
		t.Errorf("a second undo: code %d, %s", code, errs)
	}
}

// TestSetupOpenClawRefuses: a missing or broken config, a default model
// with no provider entry, a provider routed elsewhere since setup, and a
// node that already forwards somewhere else are refused, each saying why,
// and nothing is changed.
func TestSetupOpenClawRefuses(t *testing.T) {
	path := openClawHome(t, userOpenClaw)
	data := t.TempDir()
	setupCLI := func(args ...string) (string, int) {
		_, errs, code := runCLI(t, append([]string{"setup", "openclaw", "--data", data, "--openclaw", "none"}, args...)...)
		return errs, code
	}

	os.Remove(path)
	if errs, code := setupCLI(); code != 1 || !strings.Contains(errs, "does not exist") || !strings.Contains(errs, path) {
		t.Errorf("missing config: code %d, %s", code, errs)
	}
	os.WriteFile(path, []byte("{ models: "), 0o600)
	if errs, code := setupCLI(); code != 1 || !strings.Contains(errs, "cannot be read") || strings.Contains(errs, "setup: not") {
		t.Errorf("broken config: code %d, %s", code, errs)
	}
	os.WriteFile(path, []byte(`{agents: {defaults: {model: "openai/gpt-5"}}}`), 0o600)
	if errs, code := setupCLI(); code != 1 || !strings.Contains(errs, `provider "openai", which has no entry under models.providers`) {
		t.Errorf("no provider entry: code %d, %s", code, errs)
	}

	os.WriteFile(path, []byte(userOpenClaw), 0o600)
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("upstream = \"http://127.0.0.1:8000/v1\"\n"), 0o600)
	if errs, code := setupCLI(); code != 1 || !strings.Contains(errs, "already forwards to http://127.0.0.1:8000/v1") {
		t.Errorf("node forwarding elsewhere: code %d, %s", code, errs)
	}
	os.Remove(filepath.Join(data, "config.toml"))

	cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none")
	b, _ := os.ReadFile(path)
	moved := strings.Replace(string(b), "127.0.0.1:8400", "10.1.2.3:4000", 1)
	os.WriteFile(path, []byte(moved), 0o600)
	if errs, code := setupCLI(); code != 1 || !strings.Contains(errs, "routed elsewhere") {
		t.Errorf("routed elsewhere since: code %d, %s", code, errs)
	}
	if errs, code := setupCLI("--undo"); code != 1 || !strings.Contains(errs, "no longer") || !strings.Contains(errs, ".bak") {
		t.Errorf("undo of a provider changed since: code %d, %s", code, errs)
	}
	if b, _ := os.ReadFile(path); string(b) != moved {
		t.Error("a refused command changed the config")
	}
	// Put back by hand as it was: the record is stale, and setup goes on.
	os.WriteFile(path, []byte(userOpenClaw), 0o600)
	if out := cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none"); !strings.Contains(out, "now goes through the node") {
		t.Errorf("setup over a provider put back by hand: %s", out)
	}
}

// TestSetupOpenClawReal wires the real OpenClaw (npm openclaw, installed by
// scripts/setup-openclaw.sh) through its own `openclaw config set`: after
// setup an OpenClaw turn goes through a running node and is recorded; after
// --undo the next turn goes straight to the model server, and the pool
// records nothing more.
func TestSetupOpenClawReal(t *testing.T) {
	bin := os.Getenv("CLAWMESH_OPENCLAW_BIN")
	nodeDir := os.Getenv("CLAWMESH_NODE_BIN_DIR")
	if bin == "" || nodeDir == "" {
		if os.Getenv("CLAWMESH_REQUIRE_OPENCLAW") != "" {
			t.Fatal("CLAWMESH_REQUIRE_OPENCLAW is set but CLAWMESH_OPENCLAW_BIN or CLAWMESH_NODE_BIN_DIR is not")
		}
		t.Skip("set CLAWMESH_OPENCLAW_BIN and CLAWMESH_NODE_BIN_DIR (scripts/setup-openclaw.sh prints them; scripts/test.sh sets them)")
	}
	// Each openclaw command starts Node.js and loads OpenClaw: seconds
	// apiece, ten of them and two agent turns here, and far slower on a
	// loaded machine. The bound only keeps a hung command from hanging
	// the run.
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	up := fakeupstream.New(fakeupstream.Script{Model: "tiny", Turns: []fakeupstream.Turn{{Text: "Hello from the model."}}})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, upLn)
	model := "http://" + upLn.Addr().String() + "/v1"

	cfg, _ := json.Marshal(map[string]any{
		"models": map[string]any{"providers": map[string]any{"local": map[string]any{
			"baseUrl": model, "api": "openai-completions", "apiKey": "unused",
			"models": []map[string]any{{"id": "tiny", "name": "tiny"}},
		}}},
		"agents": map[string]any{"defaults": map[string]any{"model": map[string]any{"primary": "local/tiny"}}},
	})
	path := openClawHome(t, string(cfg))
	t.Setenv("PATH", nodeDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	data := t.TempDir()
	gw := freeAddr(t)

	out := cli(t, "setup", "openclaw", "--data", data, "--listen", gw, "--openclaw", bin)
	if !strings.Contains(out, "now goes through the node at http://"+gw+"/v1") {
		t.Fatalf("setup said:\n%s", out)
	}
	ocGet := func(p string) string {
		out, err := exec.CommandContext(ctx, bin, "config", "get", p).Output()
		if err != nil {
			t.Fatalf("openclaw config get %s: %v", p, err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := ocGet("models.providers.local.baseUrl"); got != "http://"+gw+"/v1" {
		t.Fatalf("OpenClaw reads baseUrl %q after setup", got)
	}
	var rec setup.Record
	if b, err := os.ReadFile(filepath.Join(data, setup.RecordFile)); err != nil || json.Unmarshal(b, &rec) != nil || rec.Via != "openclaw" || rec.Config != path {
		t.Fatalf("setup record %+v (%v): want one made through the openclaw command for %s", rec, err, path)
	}

	// The node, as a user runs it after setup: its upstream from config.toml.
	nodeCtx, stopNode := context.WithCancel(ctx)
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(nodeCtx, []string{"node", "--data", data, "--listen", gw, "--no-scoring"}, &logs, &logs)
	}()
	defer func() { stopNode(); <-done }()
	waitFor(t, "the node's address file", func() bool { _, err := node.ReadAddr(data); return err == nil })
	// The address file is written just before the line that says where
	// the gateway listens, and with what upstream.
	waitFor(t, "the node's 'gateway listening' line", func() bool { return strings.Contains(logs.String(), "gateway listening") })
	if !strings.Contains(logs.String(), "upstream="+model) {
		t.Errorf("the node did not take its upstream from config.toml:\n%s", logs.String())
	}

	turn := func(msg string) {
		f := filepath.Join(t.TempDir(), "msg.txt")
		os.WriteFile(f, []byte(msg), 0o600)
		cmd := exec.CommandContext(ctx, bin, "agent", "--local", "--session-id", "s1", "--json", "--message-file", f)
		cmd.Env = append(os.Environ(), "NO_COLOR=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openclaw agent: %v\n%s", err, tail(out, 3000))
		}
	}
	turn("hello through the node")
	steps, _ := exportSteps(t, data)
	recorded := len(steps)
	if recorded == 0 {
		t.Fatalf("no step recorded after a turn through the node (the model saw %d calls)", len(up.Requests()))
	}

	out = cli(t, "setup", "openclaw", "--data", data, "--listen", gw, "--openclaw", bin, "--undo")
	if !strings.Contains(out, "goes to "+model+" again") {
		t.Errorf("undo said:\n%s", out)
	}
	if got := ocGet("models.providers.local.baseUrl"); got != model {
		t.Fatalf("OpenClaw reads baseUrl %q after undo, want %q", got, model)
	}
	calls := len(up.Requests())
	turn("hello straight to the model")
	if len(up.Requests()) <= calls {
		t.Fatal("the turn after undo did not reach the model server")
	}
	if steps, _ := exportSteps(t, data); len(steps) != recorded {
		t.Errorf("%d steps after the undone turn, want still %d: it went through the node", len(steps), recorded)
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
