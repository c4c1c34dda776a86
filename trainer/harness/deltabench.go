package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/klauspost/compress/zstd"
)

// DeltaReport says whether sending a compressed delta between consecutive
// versions instead of the bundle would pay.
type DeltaReport struct {
	Bundle    int     `json:"bundle_bytes"`
	Zstd      int     `json:"zstd_bytes"`       // the bundle compressed
	DeltaZstd int     `json:"delta_zstd_bytes"` // XOR with the previous version, compressed
	Ratio     float64 `json:"delta_ratio"`      // DeltaZstd / Bundle
}

// BenchDelta trains the tiny model's adapter one step at a time and
// measures consecutive versions' compressed differences.
func BenchDelta(ctx context.Context) (DeltaReport, error) {
	var r DeltaReport
	tok, err := tokenizer.Tiny(tokenizer.TinyOptions{})
	if err != nil {
		return r, err
	}
	eng, err := native.NewTiny(native.TinyConfig(tok.VocabSize()), 1, native.Options{Name: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		return r, err
	}
	defer eng.Close()
	dir, err := os.MkdirTemp("", "clawmesh-bench-delta-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	toks := []int{1, 2, 3, 4, 5, 6, 7, 8}
	ts := engine.TrainSample{Tokens: toks, LossMask: make([]bool, len(toks)), Advantages: make([]float32, len(toks))}
	for i := 1; i < len(toks); i++ {
		ts.LossMask[i], ts.Advantages[i] = true, 1
	}
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBetterCompression))
	defer enc.Close()
	var prev []byte
	for v := range 4 {
		if _, err := eng.TrainStep(ctx, []engine.TrainSample{ts}, engine.Recipe{LR: 0.01, MaxGradNorm: -1}); err != nil {
			return r, err
		}
		d := filepath.Join(dir, fmt.Sprint(v))
		if err := eng.ExportAdapter(ctx, d); err != nil {
			return r, err
		}
		b, err := weights.Pack(d)
		if err != nil {
			return r, err
		}
		if prev != nil && len(prev) == len(b) {
			x := make([]byte, len(b))
			for i := range b {
				x[i] = b[i] ^ prev[i]
			}
			r.Bundle += len(b)
			r.Zstd += len(enc.EncodeAll(b, nil))
			r.DeltaZstd += len(enc.EncodeAll(x, nil))
		}
		prev = b
	}
	if r.Bundle > 0 {
		r.Ratio = float64(r.DeltaZstd) / float64(r.Bundle)
	}
	return r, nil
}
