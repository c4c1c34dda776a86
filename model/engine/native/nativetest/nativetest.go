// Package nativetest builds the tiny native model for tests: the tiny
// tokenizer, a random model of native.TinyConfig's shape that ends its turn
// with <|im_end|>, at a fixed thread count so that every run of a test is
// the same run.
package nativetest

import (
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/tokenizer"
)

// Tiny returns the tiny model of seed (sampling seeded with seed+100) on
// threads threads, closed when the test ends, and its tokenizer. A native
// engine's sums depend on its thread count: fix it for runs to repeat.
func Tiny(t testing.TB, seed uint64, threads int) (*native.Engine, *tokenizer.Tokenizer) {
	t.Helper()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := native.NewTiny(cfg, seed, native.Options{Seed: seed + 100, Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, txt.Tokenizer
}
