package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRewardsConfig checks the [rewards] table of the config file (the
// limits of every plugin call) and the node flags that override it.
func TestRewardsConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	t.Setenv("CLAWMESH_CONFIG", cfg)
	resolve := func(body string, args ...string) (settings, error) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		var s settings
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		s.bindCommon(fs)
		fs.DurationVar(&s.PluginDeadline, "reward-deadline", 0, "")
		fs.Int64Var(&s.PluginMemoryMiB, "reward-memory-mib", 0, "")
		fs.DurationVar(&s.JudgeTimeout, "judge-timeout", 0, "")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return s, s.resolve(fs)
	}

	s, err := resolve("[rewards]\ndeadline = \"250ms\"\nmemory_mib = 32\njudge_timeout = \"5s\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if s.PluginDeadline != 250*time.Millisecond || s.PluginMemoryMiB != 32 || s.JudgeTimeout != 5*time.Second {
		t.Errorf("from the file: deadline %v, memory %d MiB, judge timeout %v; want 250ms, 32, 5s", s.PluginDeadline, s.PluginMemoryMiB, s.JudgeTimeout)
	}
	s, err = resolve("[rewards]\ndeadline = \"250ms\"\nmemory_mib = 32\njudge_timeout = \"5s\"\n",
		"--reward-deadline", "1s", "--reward-memory-mib", "128", "--judge-timeout", "1m")
	if err != nil {
		t.Fatal(err)
	}
	if s.PluginDeadline != time.Second || s.PluginMemoryMiB != 128 || s.JudgeTimeout != time.Minute {
		t.Errorf("flags beat the file: deadline %v, memory %d MiB, judge timeout %v; want 1s, 128, 1m", s.PluginDeadline, s.PluginMemoryMiB, s.JudgeTimeout)
	}
	s, err = resolve("")
	if err != nil || s.PluginDeadline != 0 || s.PluginMemoryMiB != 0 || s.JudgeTimeout != 0 {
		t.Errorf("no [rewards]: %v, %d, %v (%v); want zeros (reward's defaults)", s.PluginDeadline, s.PluginMemoryMiB, s.JudgeTimeout, err)
	}
	for body, want := range map[string]string{
		"[rewards]\ndeadline = \"-1s\"":       "rewards.deadline",
		"[rewards]\ndeadline = \"fast\"":      "rewards.deadline",
		"[rewards]\nmemory_mib = 5000":        "rewards.memory_mib",
		"[rewards]\nmemory_mib = -1":          "rewards.memory_mib",
		"[rewards]\njudge_timeout = \"0s\"":   "rewards.judge_timeout",
		"[rewards]\ndeadline_ms = 100":        `unknown key "rewards.deadline_ms"`,
		"[rewards]\nmemory_mib = \"64\"":      "memory_mib",
		"[[plugins]]\nenabled = true\n":       "needs path or builtin",
		"[rewards]\njudge_timeout = \"30s\"x": "config",
	} {
		if _, err := resolve(body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", body, err, want)
		}
	}

	// The node's flags, as `clawmesh node` parses them.
	data := t.TempDir()
	os.WriteFile(cfg, nil, 0o600)
	for _, args := range [][]string{
		{"--reward-deadline", "-1s"},
		{"--reward-memory-mib", "5000"},
		{"--judge-timeout", "-5s"},
	} {
		_, errs, code := runCLI(t, append([]string{"node", "--data", data, "--upstream", "http://127.0.0.1:9/v1"}, args...)...)
		if code != 2 || !strings.Contains(errs, args[0]) {
			t.Errorf("node %s: code %d, %q; want a usage error naming the flag", strings.Join(args, " "), code, errs)
		}
	}
}
