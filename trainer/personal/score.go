package personal

import (
	"context"
	"fmt"
	"math"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// Agrees is one held-back step's part in the score: 1 when the policy's
// mean per-token log-probability of the recorded reply moved away from the
// shared version's the way the user's reward says (up for a liked reply,
// reward > 0; down for a disliked one, reward < 0), 0 when it moved the
// other way, ½ when it did not move.
func Agrees(reward, policy, shared float64) float64 {
	d := policy - shared
	switch {
	case d == 0:
		return 0.5
	case (d > 0) == (reward > 0):
		return 1
	}
	return 0
}

// scorer scores a policy on held-back steps: the share of them it agrees
// with (Agrees, averaged). Its reference is the frozen base of the engine
// it is made with: the base with the shared adapter merged in.
type scorer struct {
	seqs    [][]int
	masks   [][]bool
	rewards []float64
	shared  []float64 // mean log-prob of each reply under the shared version
}

// newScorer keeps the held-back steps that can be scored: a finite reward
// other than 0 and a first choice that makes a sample eng takes.
func newScorer(ctx context.Context, eng engine.Engine, b *sample.Builder, held []*core.Step) (*scorer, error) {
	sc := &scorer{}
	info := eng.Info()
	for _, st := range held {
		if st.Reward == nil || st.Reward.Value == nil {
			continue
		}
		r := *st.Reward.Value
		if r == 0 || math.IsNaN(r) || math.IsInf(r, 0) {
			continue
		}
		smps, err := b.Build(st)
		if err != nil || len(smps) == 0 {
			continue
		}
		s := smps[0]
		if s.ResponseLen() < 1 || s.PromptLen < 1 || len(s.Tokens) > info.MaxPosition ||
			engine.CheckTokens(s.Tokens, info.VocabSize) != nil {
			continue
		}
		sc.seqs = append(sc.seqs, s.Tokens)
		sc.masks = append(sc.masks, s.LossMask)
		sc.rewards = append(sc.rewards, r)
	}
	if len(sc.seqs) == 0 {
		return sc, nil
	}
	var err error
	if sc.shared, err = sc.means(ctx, eng, true); err != nil {
		return nil, err
	}
	return sc, nil
}

func (sc *scorer) n() int { return len(sc.seqs) }

// score is the share of the held-back steps on which eng's policy agrees
// with the user.
func (sc *scorer) score(ctx context.Context, eng engine.Engine) (float64, error) {
	pol, err := sc.means(ctx, eng, false)
	if err != nil {
		return 0, err
	}
	var s float64
	for i, r := range sc.rewards {
		s += Agrees(r, pol[i], sc.shared[i])
	}
	return s / float64(len(sc.rewards)), nil
}

// means returns each reply's mean per-token log-prob under eng's policy,
// or under its frozen base when base is set.
func (sc *scorer) means(ctx context.Context, eng engine.Engine, base bool) ([]float64, error) {
	lps, err := eng.Logprobs(ctx, sc.seqs, base)
	if err != nil {
		return nil, fmt.Errorf("personal: score: %w", err)
	}
	out := make([]float64, len(lps))
	for i, lp := range lps {
		out[i] = MeanLogprob(lp, sc.masks[i])
	}
	return out, nil
}

// MeanLogprob is the mean of the log-probs lp where mask is set (0 when it
// is set nowhere).
func MeanLogprob(lp []float32, mask []bool) float64 {
	var s float64
	n := 0
	for t, m := range mask {
		if m && t < len(lp) {
			s += float64(lp[t])
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return s / float64(n)
}
