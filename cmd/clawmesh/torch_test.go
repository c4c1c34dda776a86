package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/torch"
	"github.com/clawmesh/clawmesh/node/share"
)

// TestBenchEngineTorch measures the torch engine against the native one on
// the tiny model, and refuses what cannot run.
func TestBenchEngineTorch(t *testing.T) {
	for _, args := range [][]string{
		{"--engine", "native", "--device", "cuda"},
		{"--engine", "jax"},
		{"--device", "tpu"},
	} {
		if _, errs, code := runCLI(t, append([]string{"bench", "engine"}, args...)...); code != 2 {
			t.Errorf("%v: code %d, %s", args, code, errs)
		}
	}
	if _, err := torch.Probe(context.Background(), ""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the torch engine may not be skipped: %v", err)
		}
		t.Skipf("python3 with torch not found (Debian: apt-get install python3-torch libopenblas0-pthread): %v", err)
	}
	out, errs, code := runCLI(t, "bench", "engine", "--engine", "torch", "--base", "tiny", "--seqs", "2", "--seq-len", "16",
		"--steps", "1", "--gen-tokens", "4")
	if code != 0 {
		t.Fatalf("bench engine --engine torch: %d %s", code, errs)
	}
	for _, want := range []string{"torch  cpu   train", "native cpu   train", "torch / native: train"} {
		if !strings.Contains(out, want) {
			t.Fatalf("bench engine printed no %q:\n%s", want, out)
		}
	}
}

// TestTrainerEngineTorch: `clawmesh trainer` refuses an engine or device it
// cannot run as a usage error, before anything else; and a joined trainer
// asked for --engine torch where Python lacks PyTorch says how to get it
// and that --engine native needs none.
func TestTrainerEngineTorch(t *testing.T) {
	empty := t.TempDir()
	for _, args := range [][]string{
		{"--engine", "jax"},
		{"--device", "tpu"},
		{"--engine", "native", "--device", "cuda"},
		{"--engine", "torch", "--gpus", "2"},
		{"--engine", "torch", "--device", "cuda", "--gpus", "0"},
		{"--grad-checkpoint"},
	} {
		_, errs, code := runCLI(t, append([]string{"trainer", "--data", empty}, args...)...)
		if code != 2 || strings.Contains(errs, "not in a mesh") {
			t.Errorf("%v: code %d, %s", args, code, errs)
		}
	}

	a, d := t.TempDir(), t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	runMeshNode(t, a, scriptedUpstream(t, "ok"), share.Policy{})
	cli(t, "join", strings.TrimSpace(cli(t, "invite", "--role", "trainer", "--data", a)), "--data", d, "--p2p-listen", loopbackP2P[1])
	// A Python that is not there, and one that runs but cannot import
	// torch (its site-packages turned off).
	noSite := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(noSite, []byte("#!/bin/sh\nexec python3 -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, py := range []string{filepath.Join(t.TempDir(), "python3"), noSite} {
		t.Setenv("CLAWMESH_PYTHON", py)
		_, errs, code := runCLI(t, "trainer", "--data", d, "--engine", "torch", "--no-mdns", "--p2p-listen", loopbackP2P[1])
		if code != 1 {
			t.Fatalf("CLAWMESH_PYTHON=%s: code %d, %s", py, code, errs)
		}
		for _, want := range []string{py + " cannot import", "apt-get install python3-torch", "pip install torch",
			"CLAWMESH_PYTHON", "--engine native needs no PyTorch"} {
			if !strings.Contains(errs, want) {
				t.Errorf("CLAWMESH_PYTHON=%s: no %q in %s", py, want, errs)
			}
		}
	}
}
