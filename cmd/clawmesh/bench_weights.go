package main

import (
	"context"
	"fmt"
	"io"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/sim/live"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// benchWeights runs `clawmesh bench weights`.
func benchWeights(ctx context.Context, stdout io.Writer, o weights.BenchOptions, ls live.LoopServe, versions int, asJSON bool) error {
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
			server := "clawmesh serve --tiny"
			switch ls.Kind {
			case modelserver.KindClawmesh:
				server = "clawmesh serve on the tiny model, run by the node"
			case modelserver.KindLlamaServer:
				server = "llama-server on the tiny model as GGUF, run by the node, versions swapped blue/green"
			}
			fmt.Fprintf(stdout, "the whole loop on loopback (%s, a node, three trainers), %d versions:\n", server, versions)
		}
		l, err := live.LoopServing(ctx, ls, versions, progress)
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
