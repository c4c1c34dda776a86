package main

import (
	"strings"
	"testing"
)

// TestBenchPool: `bench pool` prints the pool's figures beside bare
// Pebble's from the same run and the goal; bad counts are refused.
func TestBenchPool(t *testing.T) {
	out := cli(t, "bench", "pool", "--writers", "4", "--steps", "48")
	for _, want := range []string{"pool, 1 writer", "pool, 4 writers", "bare Pebble, 4 writers", "same bytes as the pool",
		"goal >= 20000", "bare Pebble storing the steps whole (goal >= 0.6x"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	for _, args := range [][]string{{"--writers", "0"}, {"--steps", "-1"}} {
		if _, _, code := runCLI(t, append([]string{"bench", "pool"}, args...)...); code != 2 {
			t.Errorf("bench pool %v: code %d, want 2", args, code)
		}
	}
}
