package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/trainer/engine/torch"
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
