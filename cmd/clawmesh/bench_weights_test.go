package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchWeights runs `clawmesh bench weights` small, with one version
// of the whole loop, and checks that --json reports every part.
func TestBenchWeights(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole loop once")
	}
	out := cli(t, "bench", "weights", "--size", "2MiB", "--fetchers", "2", "--versions", "1", "--json")
	var r struct {
		Bytes int64 `json:"bytes"`
		Ours  struct {
			MBps float64 `json:"mb_per_s"`
		} `json:"ours"`
		Ratio  float64 `json:"ours_vs_bare"`
		FanOut []struct {
			Fetchers int `json:"fetchers"`
		} `json:"fan_out"`
		Delta struct {
			Bundle int `json:"bundle_bytes"`
		} `json:"delta"`
		Loop struct {
			Seconds []float64 `json:"commit_to_first_reply_s"`
		} `json:"loop"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Bytes != 2<<20 || r.Ours.MBps <= 0 || r.Ratio <= 0 || len(r.FanOut) != 2 || r.Delta.Bundle == 0 || len(r.Loop.Seconds) != 1 || r.Loop.Seconds[0] <= 0 {
		t.Fatalf("report %+v", r)
	}
	if _, _, code := runCLI(t, "bench", "weights", "--size", "5GiB"); code == 0 {
		t.Error("a bundle over 4 GiB was accepted")
	}
}

// TestBenchWeightsServes runs the whole loop once with the node running
// llama-server itself (the stand-in on real llama.cpp): the version is
// exported to GGUF and swapped in blue/green, and the report says which
// server the figure is for. Bad --serve settings are refused.
func TestBenchWeightsServes(t *testing.T) {
	for _, args := range [][]string{
		{"--serve", "vllm"},
		{"--serve-bin", "/bin/true"},
		{"--serve", "mlx"},
	} {
		if _, stderr, code := runCLI(t, append([]string{"bench", "weights", "--versions", "1"}, args...)...); code == 0 {
			t.Errorf("bench weights %v was accepted", args)
		} else if !strings.Contains(stderr, "--serve") {
			t.Errorf("bench weights %v: %s", args, stderr)
		}
	}
	if testing.Short() {
		t.Skip("runs the whole loop once")
	}
	bin := standInBin(t)
	out := cli(t, "bench", "weights", "--size", "1MiB", "--fetchers", "1", "--versions", "1", "--serve", "llama-server", "--serve-bin", bin, "--json")
	var r struct {
		Loop struct {
			Serve   string    `json:"serve"`
			Seconds []float64 `json:"commit_to_first_reply_s"`
		} `json:"loop"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Loop.Serve != "llama-server" || len(r.Loop.Seconds) != 1 || r.Loop.Seconds[0] <= 0 {
		t.Fatalf("loop %+v", r.Loop)
	}
}
