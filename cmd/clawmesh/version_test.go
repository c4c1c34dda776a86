package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionLine(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-25T19:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	if got, want := versionLine(bi, true), "clawmesh dev (0123456789ab+dirty, 2026-11-25T19:00:00Z) go1.26.8"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	bi = &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}}
	if got := versionLine(bi, true); got != "clawmesh v0.3.0 go1.26.8" {
		t.Errorf("a module version: %q", got)
	}
	if got := versionLine(nil, false); !strings.HasPrefix(got, "clawmesh ") {
		t.Errorf("no build info: %q", got)
	}
	// A release build's stamp wins over the VCS one.
	version, revision = "v0.2.0", "fedcba9876543210fedc+dirty"
	got := versionLine(bi, true)
	version, revision = "dev", ""
	if got != "clawmesh v0.2.0 (fedcba987654+dirty) go1.26.8" {
		t.Errorf("a release build: %q", got)
	}
	out := cli(t, "version")
	if !strings.HasPrefix(out, "clawmesh ") || !strings.Contains(out, "go1.") {
		t.Errorf("clawmesh version: %q", out)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"32MiB": 32 << 20, "1024": 1024, "2 GiB": 2 << 30, "512K": 512 << 10, "64KB": 64 << 10, "10B": 10} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "9999999999GiB", "12 parsecs"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
	if _, errs, code := runCLI(t, "node", "--max-body", "12", "--upstream", "http://127.0.0.1:9/v1", "--data", t.TempDir()); code == 0 || !strings.Contains(errs, "--max-body") {
		t.Errorf("a tiny --max-body: %d %s", code, errs)
	}
}
