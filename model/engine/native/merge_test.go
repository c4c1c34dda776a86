package native

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
)

// TestMergeAdapter checks that folding the adapter into the base weights
// keeps the policy: the merged engine's base model scores every sequence as
// the unmerged engine with its adapter does, to float32 rounding; its fresh
// adapter leaves it there; and the source engine is untouched.
func TestMergeAdapter(t *testing.T) {
	untied := TinyConfig(48)
	untied.TiedEmbeddings = false
	for _, tc := range []struct {
		name   string
		cfg    Config
		lora   LoRAConfig
		rslora bool
	}{
		{"tied, all projections", TinyConfig(48), LoRAConfig{Rank: 4}, false},
		{"untied, q and down, rsLoRA", untied, LoRAConfig{Rank: 2, Alpha: 3, Targets: []string{"q_proj", "down_proj"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewTiny(tc.cfg, 11, Options{LoRA: tc.lora, Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			perturb(e, 11)
			if tc.rslora {
				e.ad.rslora = true
				e.ad.scale = float32(e.ad.alpha / math.Sqrt(float64(e.ad.rank)))
			}
			r := rand.New(rand.NewPCG(3, 4))
			seqs := make([][]int, 4)
			for i := range seqs {
				seqs[i] = make([]int, 6+5*i)
				for j := range seqs[i] {
					seqs[i][j] = r.IntN(tc.cfg.VocabSize)
				}
			}
			policy, _ := e.Logprobs(ctx, seqs, false)
			base, _ := e.Logprobs(ctx, seqs, true)

			me, err := e.MergeAdapter()
			if err != nil {
				t.Fatal(err)
			}
			defer me.Close()
			mBase, err := me.Logprobs(ctx, seqs, true)
			if err != nil {
				t.Fatal(err)
			}
			mPolicy, _ := me.Logprobs(ctx, seqs, false)
			var maxDiff, moved float64
			for i := range seqs {
				if !slices.Equal(mBase[i], mPolicy[i]) {
					t.Fatalf("seq %d: the merged engine's fresh adapter changes its policy", i)
				}
				for j := 1; j < len(seqs[i]); j++ {
					d := math.Abs(float64(mBase[i][j] - policy[i][j]))
					maxDiff = max(maxDiff, d)
					moved = max(moved, math.Abs(float64(policy[i][j]-base[i][j])))
					if d > 1e-4*(1+math.Abs(float64(policy[i][j]))) {
						t.Errorf("seq %d pos %d: merged base %v, base with adapter %v", i, j, mBase[i][j], policy[i][j])
					}
				}
			}
			// The adapter must matter, or the comparison shows nothing.
			if moved < 1e-2 {
				t.Fatalf("the adapter moves log-probs by at most %g", moved)
			}
			t.Logf("adapter moves log-probs by up to %.3f; merged differs by up to %.2g", moved, maxDiff)

			// The source is unchanged, and training the merged engine does
			// not reach it.
			s := engine.TrainSample{Tokens: seqs[1], LossMask: make([]bool, len(seqs[1])), Advantages: make([]float32, len(seqs[1]))}
			for j := 1; j < len(s.Tokens); j++ {
				s.LossMask[j], s.Advantages[j] = true, 1
			}
			if _, err := me.TrainStep(ctx, []engine.TrainSample{s}, engine.Recipe{LR: 1e-2}); err != nil {
				t.Fatal(err)
			}
			trained, _ := me.Logprobs(ctx, seqs[1:2], false)
			if slices.Equal(trained[0], mPolicy[1]) {
				t.Fatal("training the merged engine did not change its policy")
			}
			p2, _ := e.Logprobs(ctx, seqs, false)
			b2, _ := e.Logprobs(ctx, seqs, true)
			mb2, _ := me.Logprobs(ctx, seqs, true)
			for i := range seqs {
				if !slices.Equal(p2[i], policy[i]) || !slices.Equal(b2[i], base[i]) || !slices.Equal(mb2[i], mBase[i]) {
					t.Fatalf("seq %d: merging or training the merged engine changed a frozen model", i)
				}
			}
			if got := me.Info().Name; got != e.Info().Name+"+merged" {
				t.Errorf("merged engine named %q", got)
			}
		})
	}
	e := testModel(t, 16, 1)
	e.Close()
	if _, err := e.MergeAdapter(); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("merging a closed engine: %v", err)
	}
}

// TestSaveModel checks that a merged model written by SaveModel opens as a
// model directory of its own that scores every sequence as the merged
// engine does, exactly (float32 weights written as float32).
func TestSaveModel(t *testing.T) {
	cfg := TinyConfig(48)
	e, err := NewTiny(cfg, 11, Options{LoRA: LoRAConfig{Rank: 4}, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	perturb(e, 11)
	me, err := e.MergeAdapter()
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	dir := t.TempDir()
	if err := me.(*Engine).SaveModel(dir); err != nil {
		t.Fatal(err)
	}
	back, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	seqs := [][]int{{1, 2, 3, 4, 5, 6}, {7, 30, 8, 40, 9, 47, 0, 11}}
	want, _ := me.Logprobs(ctx, seqs, true)
	orig, _ := e.Logprobs(ctx, seqs, true)
	got, err := back.Logprobs(ctx, seqs, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range seqs {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("seq %d: saved model scores %v, merged engine %v", i, got[i], want[i])
		}
		if slices.Equal(got[i], orig[i]) {
			t.Fatalf("seq %d: the saved model is the unmerged base", i)
		}
	}
	me.Close()
	if err := me.(*Engine).SaveModel(t.TempDir()); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("SaveModel on a closed engine: %v", err)
	}
}
