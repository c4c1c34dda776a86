package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/setup"
)

const serviceHelp = `Usage: clawmesh service install|status|logs|uninstall [flags]

Runs the node in the background, started at login and again after a
failure, with its output in DATA/node.log:
  macOS   a launchd agent, ~/Library/LaunchAgents/dev.clawmesh.node.plist
          (RunAtLoad, KeepAlive on failure)
  Linux   a systemd user unit, ~/.config/systemd/user/dev.clawmesh.node.service
          (Restart=on-failure, WantedBy=default.target)

  install     write the service from the node's settings (--data, and
              --upstream, --upstream-kind, --serve, --model, --serve-bin,
              --serve-args, --listen, --config where given
              here or in CLAWMESH_* variables; the rest the node reads from
              DATA/config.toml at each start) and start it; again, to
              change it
  status      whether it is installed and running, and where it listens
  logs        the end of its log (-n lines; -f to follow)
  uninstall   stop it and remove it

Examples:
  clawmesh service install --upstream http://127.0.0.1:11434/v1
  clawmesh service install --serve mlx --model ~/models/Qwen3-4B-4bit
  clawmesh service status
  clawmesh service logs -f
`

// serviceOS is the system whose service manager is used; tests set it.
var serviceOS = runtime.GOOS

func runService(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stdout, serviceHelp)
			return nil
		}
		return usageErr("say what to do: install, status, logs or uninstall")
	}
	verb := args[0]
	switch verb {
	case "install", "status", "logs", "uninstall":
	default:
		return usageErr("unknown service command %q (want install, status, logs or uninstall)", verb)
	}
	var s settings
	flags := newFlags("service "+verb, serviceHelp, stderr)
	s.bindCommon(flags)
	flags.StringVar(&s.Upstream, "upstream", "", "LLM server base URL including /v1 for the node (default: config.toml's, else the node looks for a local server at each start)")
	flags.StringVar(&s.UpstreamKind, "upstream-kind", "", "upstream flavour (see clawmesh node --help)")
	flags.StringVar(&s.Serve, "serve", "", "a model server the node runs itself instead of an upstream: llama-server, mlx or clawmesh (see clawmesh node --help)")
	flags.StringVar(&s.Model, "model", "", "with --serve: what the server serves")
	flags.StringVar(&s.ServeBin, "serve-bin", "", "with --serve: the server's program")
	flags.StringVar(&s.ServeArgs, "serve-args", "", "with --serve: more arguments for the server")
	program := flags.String("program", "", "the clawmesh binary the service runs (default: this one)")
	lines := flags.Int("n", 40, "logs: how many lines of the log's end to show")
	follow := flags.Bool("f", false, "logs: go on printing what the node logs, until interrupted")
	if err := parse(flags, args[1:]); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return usageErr("unexpected arguments %q", flags.Args())
	}
	if err := s.resolve(flags); err != nil {
		return err
	}
	sm, err := newServiceManager()
	if err != nil {
		return err
	}
	if verb == "status" || verb == "logs" {
		// The node the service runs keeps its data where install was
		// told, which a later command given no --data must not guess.
		explicit := os.Getenv(envNames["data"]) != ""
		flags.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "data" })
		if b, err := os.ReadFile(sm.path); err == nil && !explicit {
			if d := setup.InstalledDir(b); d != "" {
				s.Data = d
			}
		}
	}
	switch verb {
	case "install":
		return serviceInstall(ctx, sm, s, flags, *program, stdout)
	case "status":
		return serviceStatus(ctx, sm, s, stdout)
	case "logs":
		if *lines < 0 {
			return usageErr("-n must be 0 or more")
		}
		return serviceLogs(ctx, s, *lines, *follow, stdout)
	default:
		return serviceUninstall(ctx, sm, stdout)
	}
}

// serviceManager is launchd or systemd's user manager.
type serviceManager struct {
	kind string // "launchd" or "systemd"
	path string // the plist or unit file
}

func newServiceManager() (serviceManager, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return serviceManager{}, err
	}
	switch serviceOS {
	case "darwin":
		return serviceManager{"launchd", filepath.Join(home, "Library", "LaunchAgents", setup.ServiceLabel+".plist")}, nil
	case "linux":
		dir := os.Getenv("XDG_CONFIG_HOME")
		if dir == "" {
			dir = filepath.Join(home, ".config")
		}
		return serviceManager{"systemd", filepath.Join(dir, "systemd", "user", setup.ServiceLabel+".service")}, nil
	}
	return serviceManager{}, withHint(fmt.Errorf("no service manager known on %s (launchd on macOS, systemd on Linux are supported)", serviceOS),
		"Run 'clawmesh node' under your own")
}

func (sm serviceManager) ctl(ctx context.Context, args ...string) (string, error) {
	name := "systemctl"
	if sm.kind == "launchd" {
		name = "launchctl"
	} else {
		args = append([]string{"--user"}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (sm serviceManager) domain() string { return "gui/" + strconv.Itoa(os.Getuid()) }

func serviceInstall(ctx context.Context, sm serviceManager, s settings, flags *flag.FlagSet, program string, stdout io.Writer) error {
	if program == "" {
		p, err := os.Executable()
		if err != nil {
			return fmt.Errorf("cannot tell where this clawmesh binary is (--program PATH says it): %v", err)
		}
		if strings.Contains(p, string(filepath.Separator)+"go-build") {
			return withHint(fmt.Errorf("%s is a temporary binary (go run)", p),
				"Install clawmesh first, or give its path with 'clawmesh service install --program PATH'")
		}
		program = p
	}
	program, err := filepath.Abs(program)
	if err != nil {
		return err
	}
	program = stableProgram(program)
	// The service runs in DATA: a model or program named by a path
	// relative to here is made absolute (an mlx model may also be a
	// repository's name, which is left as it is).
	for _, p := range []*string{&s.Model, &s.ServeBin} {
		if *p == "" {
			continue
		}
		if _, err := os.Stat(*p); err == nil {
			if abs, err := filepath.Abs(*p); err == nil {
				*p = abs
			}
		}
	}
	args := []string{"node", "--data", s.Data}
	explicit := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	for _, e := range []struct{ name, val string }{
		{"config", s.Config}, {"listen", s.Listen}, {"upstream", s.Upstream}, {"upstream-kind", s.UpstreamKind},
		{"serve", s.Serve}, {"model", s.Model}, {"serve-bin", s.ServeBin}, {"serve-args", s.ServeArgs},
	} {
		// Given here or in the environment, which the service will not
		// have; what the config file says, the node reads itself.
		if e.val != "" && (explicit[e.name] || os.Getenv(envNames[e.name]) != "") {
			args = append(args, "--"+e.name, e.val)
		}
	}
	if s.Token != "" && (explicit["token"] || os.Getenv(envNames["token"]) != "") {
		return usageErr("--token would be written into the service file: put token in %s instead", nodeConfigPath(s))
	}
	if err := os.MkdirAll(s.Data, 0o700); err != nil {
		return fmt.Errorf("bad --data %s: %v", s.Data, err)
	}
	svc := setup.Service{Label: setup.ServiceLabel, Program: program, Args: args, LogFile: filepath.Join(s.Data, "node.log"), Dir: s.Data}
	var content []byte
	if sm.kind == "launchd" {
		content = setup.LaunchdPlist(svc)
	} else {
		content = []byte(setup.SystemdUnit(svc))
	}
	if err := os.MkdirAll(filepath.Dir(sm.path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(sm.path, content, 0o644); err != nil {
		return fmt.Errorf("cannot write the service: %v", err)
	}
	fmt.Fprintf(stdout, "wrote %s: %s %s\n", sm.path, program, strings.Join(args, " "))
	var startErr error
	if sm.kind == "launchd" {
		sm.ctl(ctx, "bootout", sm.domain()+"/"+setup.ServiceLabel) // a previous one, if loaded
		_, startErr = sm.ctl(ctx, "bootstrap", sm.domain(), sm.path)
	} else {
		if _, startErr = sm.ctl(ctx, "daemon-reload"); startErr == nil {
			_, startErr = sm.ctl(ctx, "enable", setup.ServiceLabel+".service")
		}
		if startErr == nil {
			_, startErr = sm.ctl(ctx, "restart", setup.ServiceLabel+".service")
		}
	}
	if startErr != nil {
		return fmt.Errorf("the service is written but did not start: %v", startErr)
	}
	if s.Upstream == "" {
		fmt.Fprintln(stdout, "No upstream is set: the node looks for a local model server (Ollama, LM Studio, vLLM, llama.cpp, SGLang) at each start.")
	}
	fmt.Fprintf(stdout, "The node runs now, and at every login. Its log: %s\n", svc.LogFile)
	fmt.Fprintln(stdout, "clawmesh service status says where it listens; clawmesh service uninstall removes it.")
	return nil
}

// stableProgram is the path of a Homebrew install that outlives upgrades:
// PREFIX/opt/clawmesh/bin/clawmesh for PREFIX/Cellar/clawmesh/VERSION/bin/clawmesh
// (which the next upgrade removes), where it leads to the same binary; any
// other path as it is.
func stableProgram(program string) string {
	dir, file := filepath.Split(program)
	parts := strings.Split(filepath.ToSlash(filepath.Clean(dir)), "/")
	i := len(parts) - 4 // PREFIX/Cellar/NAME/VERSION/bin
	if i < 0 || parts[i] != "Cellar" || parts[len(parts)-1] != "bin" {
		return program
	}
	prefix := filepath.FromSlash(strings.Join(parts[:i], "/"))
	opt := filepath.Join(prefix, "opt", parts[i+1], "bin", file)
	a, err1 := os.Stat(opt)
	b, err2 := os.Stat(program)
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		return program
	}
	return opt
}

func serviceStatus(ctx context.Context, sm serviceManager, s settings, stdout io.Writer) error {
	if _, err := os.Stat(sm.path); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stdout, "not installed (no %s): clawmesh service install\n", sm.path)
		return nil
	}
	state := "unknown"
	if sm.kind == "launchd" {
		out, err := sm.ctl(ctx, "print", sm.domain()+"/"+setup.ServiceLabel)
		switch {
		case err != nil:
			state = "not loaded"
		default:
			state = "loaded, not running"
			for _, l := range strings.Split(out, "\n") {
				if k, v, ok := strings.Cut(strings.TrimSpace(l), " = "); ok && k == "state" {
					state = v
				}
			}
		}
	} else {
		out, _ := sm.ctl(ctx, "is-active", setup.ServiceLabel+".service")
		if out = strings.TrimSpace(out); out != "" {
			state = out
		}
	}
	fmt.Fprintf(stdout, "service   %s (%s)\n", state, sm.path)
	addr, err := node.ReadAddr(s.Data)
	if err != nil {
		fmt.Fprintf(stdout, "gateway   not listening (no address in %s)\n", s.Data)
		return nil
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		fmt.Fprintf(stdout, "gateway   %s does not answer (%v)\n", addr, err)
		return nil
	}
	c.Close()
	fmt.Fprintf(stdout, "gateway   listening on http://%s/v1\n", addr)
	fmt.Fprintf(stdout, "log       %s\n", filepath.Join(s.Data, "node.log"))
	return nil
}

func serviceUninstall(ctx context.Context, sm serviceManager, stdout io.Writer) error {
	if _, err := os.Stat(sm.path); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stdout, "not installed (no %s): nothing to remove\n", sm.path)
		return nil
	}
	var err error
	if sm.kind == "launchd" {
		_, err = sm.ctl(ctx, "bootout", sm.domain()+"/"+setup.ServiceLabel)
	} else {
		_, err = sm.ctl(ctx, "disable", "--now", setup.ServiceLabel+".service")
	}
	if err != nil {
		fmt.Fprintf(stdout, "(stopping it: %v)\n", err)
	}
	if err := os.Remove(sm.path); err != nil {
		return err
	}
	if sm.kind == "systemd" {
		sm.ctl(ctx, "daemon-reload")
	}
	fmt.Fprintf(stdout, "stopped and removed %s; the data directory stays\n", sm.path)
	return nil
}

// serviceLogs prints the log's last n lines, then (follow) each line
// added, until ctx is done.
func serviceLogs(ctx context.Context, s settings, n int, follow bool, stdout io.Writer) error {
	path := filepath.Join(s.Data, "node.log")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return withHint(fmt.Errorf("no log at %s", path),
			"Is the service installed with this --data? 'clawmesh service status --data %s' says", s.Data)
	}
	if err != nil {
		return err
	}
	// Whole lines only: a line being written is printed once it ends.
	done := strings.LastIndexByte(string(b), '\n') + 1
	lines := strings.SplitAfter(string(b[:done]), "\n")
	lines = lines[:len(lines)-1] // the "" after the last newline
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	io.WriteString(stdout, strings.Join(lines, ""))
	if !follow {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(int64(done), io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReader(f)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	var partial string
	for {
		for {
			line, err := r.ReadString('\n')
			partial += line
			if err != nil {
				break
			}
			io.WriteString(stdout, partial)
			partial = ""
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
