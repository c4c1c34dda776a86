package main

import (
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/setup"
)

// fakeCtl puts on PATH a program called name that appends its arguments
// to a file and prints out, for the service tests that cannot use the real
// service manager; it returns a function that reads the calls.
func fakeCtl(t *testing.T, name, out string) func() string {
	t.Helper()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> '" + calls + "'\nprintf '%s' '" + out + "'\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() string { b, _ := os.ReadFile(calls); return string(b) }
}

func serviceHome(t *testing.T, goos string) (home, data string) {
	t.Helper()
	old := serviceOS
	serviceOS = goos
	t.Cleanup(func() { serviceOS = old })
	home = t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG", "CLAWMESH_UPSTREAM", "CLAWMESH_LISTEN", "CLAWMESH_TOKEN", "CLAWMESH_UPSTREAM_KIND"} {
		t.Setenv(v, "")
	}
	return home, filepath.Join(home, "data dir")
}

// TestServiceSystemd installs the systemd user unit (systemctl faked: this
// machine's may have no user manager), checks it with systemd-analyze
// where installed, asks its status while a node runs on its data
// directory, reads its log, and uninstalls it.
func TestServiceSystemd(t *testing.T) {
	home, data := serviceHome(t, "linux")
	calls := fakeCtl(t, "systemctl", "active\n")
	program, _ := os.Executable()

	out := cli(t, "service", "install", "--data", data, "--upstream", "http://127.0.0.1:11434/v1", "--program", program)
	unitPath := filepath.Join(home, ".config", "systemd", "user", setup.ServiceLabel+".service")
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatalf("no unit written: %v\n%s", err, out)
	}
	want := setup.SystemdUnit(setup.Service{Label: setup.ServiceLabel, Program: program,
		Args:    []string{"node", "--data", data, "--upstream", "http://127.0.0.1:11434/v1"},
		LogFile: filepath.Join(data, "node.log"), Dir: data})
	if string(b) != want {
		t.Errorf("unit\n%s\nwant\n%s", b, want)
	}
	if got := calls(); got != "--user daemon-reload\n--user enable "+setup.ServiceLabel+".service\n--user restart "+setup.ServiceLabel+".service\n" {
		t.Errorf("systemctl calls:\n%s", got)
	}
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		rt := t.TempDir()
		os.Chmod(rt, 0o700)
		cmd := exec.Command(analyze, "verify", "--user", unitPath)
		cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+rt)
		if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	out = cli(t, "service", "status", "--data", data)
	if !strings.Contains(out, "service   active") || !strings.Contains(out, "not listening") {
		t.Errorf("status with no node running:\n%s", out)
	}
	addr, stop := runTestNode(t, data, "http://127.0.0.1:9/v1")
	out = cli(t, "service", "status", "--data", data)
	if !strings.Contains(out, "listening on http://"+addr+"/v1") {
		t.Errorf("status with the node running:\n%s", out)
	}
	// Without --data: the directory the service was installed for, not
	// ~/.clawmesh.
	if out := cli(t, "service", "status"); !strings.Contains(out, "listening on http://"+addr+"/v1") || !strings.Contains(out, filepath.Join(data, "node.log")) {
		t.Errorf("status without --data:\n%s", out)
	}
	stop()

	os.WriteFile(filepath.Join(data, "node.log"), []byte("one\ntwo\nthree\npart"), 0o600)
	if out := cli(t, "service", "logs", "--data", data, "-n", "2"); out != "two\nthree\n" {
		t.Errorf("logs -n 2: %q", out)
	}
	if out := cli(t, "service", "logs", "-n", "1"); out != "three\n" {
		t.Errorf("logs without --data: %q", out)
	}

	out = cli(t, "service", "uninstall", "--data", data)
	if _, err := os.Stat(unitPath); err == nil || !strings.Contains(calls(), "--user disable --now "+setup.ServiceLabel+".service") {
		t.Errorf("uninstall left the unit, or did not stop it:\n%s\n%s", out, calls())
	}
	if out := cli(t, "service", "status", "--data", data); !strings.Contains(out, "not installed") {
		t.Errorf("status after uninstall: %s", out)
	}
}

// TestServiceLaunchd installs the launchd agent (launchctl faked) and
// uninstalls it; the plist itself is checked as a property list in
// node/setup.
func TestServiceLaunchd(t *testing.T) {
	home, data := serviceHome(t, "darwin")
	calls := fakeCtl(t, "launchctl", "")
	program, _ := os.Executable()
	cli(t, "service", "install", "--data", data, "--program", program)
	path := filepath.Join(home, "Library", "LaunchAgents", setup.ServiceLabel+".plist")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := setup.LaunchdPlist(setup.Service{Label: setup.ServiceLabel, Program: program, Args: []string{"node", "--data", data},
		LogFile: filepath.Join(data, "node.log"), Dir: data})
	if string(b) != string(want) {
		t.Errorf("plist\n%s\nwant\n%s", b, want)
	}
	domain := "gui/" + strconv.Itoa(os.Getuid())
	if got := calls(); !strings.Contains(got, "bootstrap "+domain+" "+path+"\n") {
		t.Errorf("launchctl calls:\n%s", got)
	}
	cli(t, "service", "uninstall", "--data", data)
	if _, err := os.Stat(path); err == nil || !strings.Contains(calls(), "bootout "+domain+"/"+setup.ServiceLabel) {
		t.Errorf("uninstall left the agent, or did not stop it:\n%s", calls())
	}
	if _, errs, code := runCLI(t, "service", "install", "--data", data, "--token", "x", "--program", program); code != 2 || !strings.Contains(errs, "config.toml") {
		t.Errorf("a token on the command line: code %d, %s", code, errs)
	}
}

// TestServiceUnderSystemd installs the unit into a running systemd user
// manager and sees the node it starts record a call, come back after it is
// killed (Restart=on-failure), log into DATA/node.log, and stop when the
// unit is uninstalled. The manager is one of the test's own (see
// privateUserManager) where the machine allows it; else, with
// CLAWMESH_TEST_SYSTEMD_USER=1, the user's own.
func TestServiceUnderSystemd(t *testing.T) {
	if why := privateUserManager(t); why != "" {
		if _, err := os.Stat("/run/systemd/system"); err != nil {
			t.Skipf("%s; and this machine was not booted with systemd (no /run/systemd/system): no user manager to start the unit under", why)
		}
		if os.Getenv("CLAWMESH_TEST_SYSTEMD_USER") == "" {
			t.Skipf("%s; set CLAWMESH_TEST_SYSTEMD_USER=1 to let the test install and remove a unit in your own systemd user manager", why)
		}
	}
	bin := buildBinary(t)
	data := t.TempDir()
	up := scriptedUpstream(t, "hi")
	listen := freeAddr(t)
	cli(t, "service", "install", "--data", data, "--upstream", up, "--listen", listen, "--program", bin)
	t.Cleanup(func() { runCLI(t, "service", "uninstall", "--data", data) })
	waitFor(t, "the service's node to listen", func() bool { a, err := node.ReadAddr(data); return err == nil && a == listen })
	if out := cli(t, "service", "status", "--data", data); !strings.Contains(out, "service   active") || !strings.Contains(out, "listening on http://"+listen) {
		t.Errorf("status:\n%s", out)
	}
	endedCall(t, data, "hello")
	steps, _ := exportSteps(t, data)
	if len(steps) != 1 {
		t.Errorf("%d steps recorded by the service's node, want 1", len(steps))
	}

	// Killed, it is started again.
	unit := setup.ServiceLabel + ".service"
	mainPID := func() int {
		out, _ := exec.Command("systemctl", "--user", "show", "-p", "MainPID", "--value", unit).Output()
		n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		return n
	}
	first := mainPID()
	if first <= 0 {
		t.Fatalf("the unit has no main process (MainPID %d)", first)
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "systemd to start the killed node again", func() bool {
		p := mainPID()
		if p <= 0 || p == first {
			return false
		}
		c, err := net.Dial("tcp", listen)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	endedCall(t, data, "hello again")
	if steps, _ := exportSteps(t, data); len(steps) != 2 {
		t.Errorf("%d steps after the restarted node's call, want 2", len(steps))
	}
	if out := cli(t, "service", "logs", "--data", data, "-n", "1000"); strings.Count(out, "gateway listening") < 2 {
		t.Errorf("service logs shows %d starts of the node, want 2:\n%s", strings.Count(out, "gateway listening"), out)
	}

	second := mainPID()
	cli(t, "service", "uninstall", "--data", data)
	if err := syscall.Kill(second, 0); err == nil {
		waitFor(t, "the uninstalled service's node to exit", func() bool { return syscall.Kill(second, 0) != nil })
	}
	if out := cli(t, "service", "status", "--data", data); !strings.Contains(out, "not installed") {
		t.Errorf("status after uninstall:\n%s", out)
	}
}

// TestStableProgram: a binary in Homebrew's Cellar, which its next upgrade
// removes, is run as the opt link that follows upgrades, where that link
// leads to it; other paths stay as they are.
func TestStableProgram(t *testing.T) {
	prefix := t.TempDir()
	cellar := filepath.Join(prefix, "Cellar", "clawmesh", "0.1.0", "bin")
	os.MkdirAll(cellar, 0o755)
	bin := filepath.Join(cellar, "clawmesh")
	os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755)
	if got := stableProgram(bin); got != bin {
		t.Errorf("no opt link yet: %s, want the Cellar path", got)
	}
	os.MkdirAll(filepath.Join(prefix, "opt"), 0o755)
	if err := os.Symlink(filepath.Join("..", "Cellar", "clawmesh", "0.1.0"), filepath.Join(prefix, "opt", "clawmesh")); err != nil {
		t.Fatal(err)
	}
	if got, want := stableProgram(bin), filepath.Join(prefix, "opt", "clawmesh", "bin", "clawmesh"); got != want {
		t.Errorf("%s, want %s", got, want)
	}
	other := filepath.Join(prefix, "bin", "clawmesh")
	if got := stableProgram(other); got != other {
		t.Errorf("a path outside the Cellar became %s", got)
	}
}

// TestServiceServes: service install carries --serve and its companions
// into the unit, the model made absolute (the service runs in DATA), and
// an upstream setup openclaw recorded in config.toml does not stand in the
// way of the server the node is told to run.
func TestServiceServes(t *testing.T) {
	home, data := serviceHome(t, "linux")
	fakeCtl(t, "systemctl", "active\n")
	program, _ := os.Executable()
	os.MkdirAll(data, 0o700)
	if err := os.WriteFile(filepath.Join(data, "config.toml"), []byte("upstream = \"http://127.0.0.1:8080/v1\"\nupstream_kind = \"llamacpp\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(t.TempDir(), "Qwen3-4B-Q4_K_M.gguf")
	os.WriteFile(model, []byte("GGUF"), 0o600)
	t.Chdir(filepath.Dir(model))
	cli(t, "service", "install", "--data", data, "--serve", "llama-server", "--model", filepath.Base(model), "--serve-args", "-c 8192", "--program", program)
	b, err := os.ReadFile(filepath.Join(home, ".config", "systemd", "user", setup.ServiceLabel+".service"))
	if err != nil {
		t.Fatal(err)
	}
	want := setup.SystemdUnit(setup.Service{Label: setup.ServiceLabel, Program: program,
		Args:    []string{"node", "--data", data, "--serve", "llama-server", "--model", model, "--serve-args", "-c 8192"},
		LogFile: filepath.Join(data, "node.log"), Dir: data})
	if string(b) != want {
		t.Errorf("unit\n%s\nwant\n%s", b, want)
	}

	// What the unit runs: the flag's server, not the file's upstream.
	var s settings
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s.bindCommon(fs)
	fs.StringVar(&s.Upstream, "upstream", "", "")
	fs.StringVar(&s.UpstreamKind, "upstream-kind", "", "")
	fs.StringVar(&s.Serve, "serve", "", "")
	fs.StringVar(&s.Model, "model", "", "")
	if err := fs.Parse([]string{"--data", data, "--serve", "llama-server", "--model", model}); err != nil {
		t.Fatal(err)
	}
	if err := s.resolve(fs); err != nil {
		t.Fatal(err)
	}
	if s.Upstream != "" || s.UpstreamKind != "" || s.Serve != "llama-server" {
		t.Errorf("settings with --serve over a file's upstream: %+v", s)
	}
	if _, err := serveConfig(s); err != nil {
		t.Errorf("the node would refuse them: %v", err)
	}
	// And the other way: --upstream over a file's serve.
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("serve = \"llama-server\"\nmodel = \""+model+"\"\n"), 0o600)
	s = settings{}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	s.bindCommon(fs)
	fs.StringVar(&s.Upstream, "upstream", "", "")
	fs.StringVar(&s.Serve, "serve", "", "")
	if err := fs.Parse([]string{"--data", data, "--upstream", "http://127.0.0.1:11434/v1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.resolve(fs); err != nil {
		t.Fatal(err)
	}
	if s.Serve != "" || s.Model != "" || s.Upstream != "http://127.0.0.1:11434/v1" {
		t.Errorf("settings with --upstream over a file's serve: %+v", s)
	}
}
