// Package personal trains a device's personal adapter: a LoRA adapter
// learned from one device's own scored steps only, on top of the shared
// version it serves (the shared adapter merged into the base), so that the
// two stack exactly into one adapter (model/peft.Stack).
package personal

import (
	"context"
	"errors"
	"log/slog"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Options says what the personal adapters are trained on and how.
type Options struct {
	// Base is the base model's directory (a Hugging Face directory the
	// native engine opens).
	Base string
	// Recipe is binary, opd or combined (default combined).
	Recipe string
	// Rank is the personal adapter's LoRA rank (default 4).
	Rank   int
	Logger *slog.Logger
}

// Train trains j.Prev (or a fresh adapter) on j.Steps on top of the base
// with j.Shared merged in, writes the result to j.Out and scores it on
// j.HeldBack.
func Train(ctx context.Context, o Options, j core.PersonalJob) (core.PersonalResult, error) {
	return core.PersonalResult{}, errors.New("personal: training is not built yet")
}
