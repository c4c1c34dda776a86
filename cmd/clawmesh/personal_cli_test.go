package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPersonalCLIBadInput: the personal commands and the [personal]
// policy say what is wrong with what they are given, before anything
// starts.
func TestPersonalCLIBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"personal"}, "status, reset, off or on"},
		{[]string{"personal", "forget"}, "unknown personal subcommand"},
		{[]string{"personal", "status", "extra"}, "takes no arguments"},
		{[]string{"personal", "train", "--job", "j.json", "--base", "b", "--engine", "jax"}, `--engine "jax"`},
		{[]string{"personal", "train", "--job", "j.json", "--base", "b", "--device", "cuda"}, "add --engine torch"},
	} {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: code %d, %q (want %q)", c.args, code, errs, c.want)
		}
	}
	out, _, code := runCLI(t, "personal", "--help")
	for _, w := range []string{"local", "mesh", "off", "held-back", "reset"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("personal --help lacks %q (code %d)", w, code)
		}
	}

	data := t.TempDir()
	for _, c := range []struct {
		name, config string
		flags        []string
		want         string
	}{
		{"bad mode", "[personal]\nmode = \"sometimes\"\n", nil, `[personal] mode "sometimes"`},
		{"mesh without trainers", "[personal]\nmode = \"mesh\"\n", nil, "needs trainers"},
		{"a trainer that is no peer id", "[personal]\nmode = \"mesh\"\ntrainers = [\"bob\"]\n", nil, `"bob" is not a peer id`},
		{"bad engine", "[personal]\nmode = \"local\"\nengine = \"jax\"\n", nil, `engine "jax"`},
		{"cuda on the native engine", "[personal]\nmode = \"local\"\ndevice = \"cuda\"\n", nil, `device "cuda"`},
		{"bad idle", "[personal]\nmode = \"local\"\nidle = \"soon\"\n", nil, "idle \"soon\""},
		{"local with no base", "[personal]\nmode = \"local\"\n", nil, "needs the base model's directory"},
		{"base that is no directory", "[personal]\nmode = \"local\"\nbase = \"nowhere\"\n", nil, "is not a directory"},
		{"bad flag", "", []string{"--personal", "always"}, `--personal "always"`},
		{"flag mesh without trainers", "", []string{"--personal", "mesh"}, "needs [personal] trainers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := filepath.Join(data, strings.ReplaceAll(c.name, " ", "-")+".toml")
			if err := os.WriteFile(cfg, []byte(c.config), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"node", "--config", cfg, "--data", filepath.Join(data, "d"), "--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0"}, c.flags...)
			_, errs, code := runCLI(t, args...)
			if code == 0 || !strings.Contains(errs, c.want) {
				t.Errorf("code %d, %q; want an error saying %q", code, errs, c.want)
			}
		})
	}
}
