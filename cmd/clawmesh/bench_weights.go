package main

import (
	"context"
	"fmt"
	"io"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/sim/live"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// benchWeights runs `clawmesh bench weights`.
func benchWeights(ctx context.Context, stdout io.Writer, o weights.BenchOptions, versions int, asJSON bool) error {
	r, err := weights.Bench(ctx, o)
	if err != nil {
		return err
	}
	d, err := harness.BenchDelta(ctx)
	if err != nil {
		return err
	}
	if !asJSON {
		r.Print(stdout)
		fmt.Fprintf(stdout, "deltas between consecutive versions (tiny model, 3 pairs): bundle %d B, zstd %d B, zstd of the XOR delta %d B (%.2f of the bundle)\n",
			d.Bundle, d.Zstd, d.DeltaZstd, d.Ratio)
	}
	var loop *live.LoopReport
	if versions > 0 {
		var progress io.Writer
		if !asJSON {
			progress = stdout
			fmt.Fprintf(stdout, "the whole loop on loopback (clawmesh serve --tiny, a node, three trainers), %d versions:\n", versions)
		}
		l, err := live.Loop(ctx, versions, progress)
		if err != nil {
			return err
		}
		loop = &l
		if !asJSON {
			fmt.Fprintf(stdout, "  commit to first reply: p50 %.2f s, max %.2f s (goal p50 <= 5 s)\n", loop.P50, loop.Max)
		}
	}
	if asJSON {
		return printJSON(stdout, struct {
			*weights.BenchReport
			Delta harness.DeltaReport `json:"delta"`
			Loop  *live.LoopReport    `json:"loop,omitempty"`
		}{r, d, loop})
	}
	return nil
}
