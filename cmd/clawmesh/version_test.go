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
	out := cli(t, "version")
	if !strings.HasPrefix(out, "clawmesh ") || !strings.Contains(out, "go1.") {
		t.Errorf("clawmesh version: %q", out)
	}
}
