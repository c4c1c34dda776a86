package loss

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Errors reported by this package. Callers match them with errors.Is.
var (
	// ErrInvalidConfig is wrapped by Config.Validate.
	ErrInvalidConfig = errors.New("loss: invalid config")
	// ErrUnknownRecipe is wrapped by ParseRecipe.
	ErrUnknownRecipe = errors.New("loss: unknown recipe")
	// ErrUnknownAggregation is wrapped by ParseAggregation.
	ErrUnknownAggregation = errors.New("loss: unknown aggregation")
	// ErrBadBaseline is wrapped by Baseline.UnmarshalJSON.
	ErrBadBaseline = errors.New("loss: bad baseline state")
)

// Defaults. RATIONALE.md explains each choice.
const (
	DefaultEpsLow     = 0.2
	DefaultEpsHigh    = 0.28
	DefaultRatioBound = 5.0
	DefaultOPDBound   = 2.0
	DefaultDecay      = 0.9
)

// bigValue bounds every input and every per-token term: a magnitude above it
// is treated like ±Inf. Real log-probs, advantages and entropies are many
// orders of magnitude smaller; the bound guarantees that the weighted sums in
// Surrogate cannot overflow, so finite inputs always give finite outputs.
const bigValue = 1e100

// Aggregation says how per-token losses are reduced to one number.
type Aggregation uint8

const (
	// TokenMean sums the loss over every kept token of the batch and divides
	// by the number of kept tokens: long sequences weigh more.
	TokenMean Aggregation = iota
	// SeqMean takes each sequence's token-mean, then the mean over the
	// sequences that kept at least one token: every sequence weighs the same.
	SeqMean
)

var aggNames = [...]string{"token-mean", "seq-mean"}

func (a Aggregation) String() string {
	if int(a) < len(aggNames) {
		return aggNames[a]
	}
	return fmt.Sprintf("aggregation(%d)", uint8(a))
}

// ParseAggregation is the inverse of Aggregation.String; it also accepts
// "token_mean" and "seq_mean".
func ParseAggregation(s string) (Aggregation, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "token-mean", "token_mean":
		return TokenMean, nil
	case "seq-mean", "seq_mean":
		return SeqMean, nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownAggregation, s)
}

func (a Aggregation) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

func (a *Aggregation) UnmarshalText(b []byte) error {
	v, err := ParseAggregation(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Config parameterises Surrogate. The zero value means the defaults.
type Config struct {
	// EpsLow and EpsHigh bound the clipped ratio to [1−EpsLow, 1+EpsHigh]
	// (asymmetric, "clip-higher"). Zero means DefaultEpsLow (0.2) and
	// DefaultEpsHigh (0.28). EpsLow must lie in (0, 1], EpsHigh be positive.
	EpsLow, EpsHigh float64
	// Agg is the reduction over tokens; the zero value is TokenMean.
	Agg Aggregation
	// RatioBound masks tokens whose importance ratio exp(new−old) lies
	// outside [1/RatioBound, RatioBound]: they are dropped from the loss, the
	// gradient and the denominators. Zero means DefaultRatioBound (5);
	// +Inf turns the mask off (non-finite ratios are still masked). Must be
	// greater than 1.
	RatioBound float64
	// KLCoef weighs a KL penalty towards the reference (base) policy, with
	// the k3 estimator exp(ref−new) − (ref−new) − 1 per token. 0 is off.
	// Must be finite and not negative.
	KLCoef float64
	// EntropyCoef weighs an entropy bonus (subtracted from the loss). 0 is
	// off; a negative value penalises entropy. Must be finite.
	EntropyCoef float64
}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	if c.EpsLow == 0 {
		c.EpsLow = DefaultEpsLow
	}
	if c.EpsHigh == 0 {
		c.EpsHigh = DefaultEpsHigh
	}
	if c.RatioBound == 0 {
		c.RatioBound = DefaultRatioBound
	}
	return c
}

// Validate reports, wrapping ErrInvalidConfig, the first field of
// c.WithDefaults() that is out of range.
func (c Config) Validate() error {
	d := c.WithDefaults()
	switch {
	case !(d.EpsLow > 0 && d.EpsLow <= 1):
		return fmt.Errorf("%w: EpsLow %v not in (0, 1]", ErrInvalidConfig, c.EpsLow)
	case !(d.EpsHigh > 0 && d.EpsHigh <= bigValue):
		return fmt.Errorf("%w: EpsHigh %v not positive and finite", ErrInvalidConfig, c.EpsHigh)
	case !(d.RatioBound > 1):
		return fmt.Errorf("%w: RatioBound %v not greater than 1", ErrInvalidConfig, c.RatioBound)
	case !(d.KLCoef >= 0 && d.KLCoef <= bigValue):
		return fmt.Errorf("%w: KLCoef %v not finite and non-negative", ErrInvalidConfig, c.KLCoef)
	case !(math.Abs(d.EntropyCoef) <= bigValue):
		return fmt.Errorf("%w: EntropyCoef %v not finite", ErrInvalidConfig, c.EntropyCoef)
	case d.Agg > SeqMean:
		return fmt.Errorf("%w: %v", ErrInvalidConfig, c.Agg)
	}
	return nil
}

// sanitize is WithDefaults followed by replacing every field that would fail
// Validate with its default (coefficients with 0, Agg with TokenMean).
func (c Config) sanitize() Config {
	c = c.WithDefaults()
	zero := Config{}.WithDefaults()
	if !(c.EpsLow > 0 && c.EpsLow <= 1) {
		c.EpsLow = zero.EpsLow
	}
	if !(c.EpsHigh > 0 && c.EpsHigh <= bigValue) {
		c.EpsHigh = zero.EpsHigh
	}
	if !(c.RatioBound > 1) {
		c.RatioBound = zero.RatioBound
	}
	if !(c.KLCoef >= 0 && c.KLCoef <= bigValue) {
		c.KLCoef = 0
	}
	if !(math.Abs(c.EntropyCoef) <= bigValue) {
		c.EntropyCoef = 0
	}
	if c.Agg > SeqMean {
		c.Agg = TokenMean
	}
	return c
}

// Seq is one sampled response, token by token. Slices are indexed by
// response token; NewLogp sets the length, and a position that any other
// slice in use does not reach is treated as masked.
type Seq struct {
	// NewLogp is log π_θ(a_t) under the policy being trained; the loss is
	// differentiated with respect to it.
	NewLogp []float64
	// OldLogp is the log-prob recorded when the token was sampled (π_old).
	OldLogp []float64
	// Adv is the per-token advantage.
	Adv []float64
	// Mask selects the tokens that are trained on (false: prompt, tool
	// output, padding).
	Mask []bool
	// RefLogp is log π_ref(a_t) under the reference (base) policy; nil means
	// no KL term for this sequence.
	RefLogp []float64
	// Entropy is the policy's entropy at each position; nil means no entropy
	// bonus for this sequence.
	Entropy []float64
}

// Result is the loss of a batch, its gradient and diagnostics.
type Result struct {
	// Loss is the aggregated surrogate plus KLCoef·KL − EntropyCoef·Entropy.
	Loss float64
	// DNewLogp[i][t] is ∂Loss/∂seqs[i].NewLogp[t]; zero where the token was
	// masked, ratio-masked, dropped or clipped out. Same shape as the input.
	DNewLogp [][]float64
	// DEntropy[i][t] is ∂Loss/∂seqs[i].Entropy[t] (nil where Entropy is nil).
	DEntropy [][]float64
	// ClipFrac is the fraction of kept tokens whose clipped branch was active
	// (gradient zeroed by the clip).
	ClipFrac float64
	// MaskedFrac is the fraction of finite, Mask-selected tokens removed by
	// RatioBound.
	MaskedFrac float64
	// KL and Entropy are the aggregated k3 KL and entropy over kept tokens
	// (before their coefficients); tokens without RefLogp or Entropy count as 0.
	KL, Entropy float64
	// Tokens is the number of kept tokens (selected, finite, within bound).
	Tokens int
	// Dropped is the number of Mask-selected tokens dropped because an input
	// in use was missing, NaN, ±Inf or beyond 1e100 in magnitude, or a
	// per-token term overflowed.
	Dropped int
}

func finite(x float64) bool { return math.Abs(x) <= bigValue }

// Surrogate computes the PPO-clipped policy-gradient loss of a batch and its
// exact gradient with respect to every NewLogp (see the package doc for the
// formulas). It never fails: a Config that does not pass Validate is used
// with each invalid field replaced by its default, and NaN/Inf inputs drop
// their token (counted in Result.Dropped) instead of poisoning the batch.
// With no kept token the loss and every gradient are zero.
func Surrogate(seqs []Seq, cfg Config) Result {
	cfg = cfg.sanitize()
	lo, hi := 1-cfg.EpsLow, 1+cfg.EpsHigh
	logBound := math.Log(cfg.RatioBound) // +Inf when the bound is off
	klc, ec := cfg.KLCoef, cfg.EntropyCoef

	res := Result{
		DNewLogp: make([][]float64, len(seqs)),
		DEntropy: make([][]float64, len(seqs)),
	}
	// Per-sequence sums; the weights are uniform within a sequence under
	// both aggregations, so the weighting is applied in a second pass.
	type acc struct {
		n             int
		loss, kl, ent float64
	}
	accs := make([]acc, len(seqs))
	var selected, ratioMasked, clipped int

	for i := range seqs {
		s := &seqs[i]
		g := make([]float64, len(s.NewLogp))
		res.DNewLogp[i] = g
		if s.Entropy != nil {
			res.DEntropy[i] = make([]float64, len(s.Entropy))
		}
		a := &accs[i]
		n := min(len(s.NewLogp), len(s.OldLogp), len(s.Adv), len(s.Mask))
		for t := 0; t < n; t++ {
			if !s.Mask[t] {
				continue
			}
			selected++
			nw, od, adv := s.NewLogp[t], s.OldLogp[t], s.Adv[t]
			if !finite(nw) || !finite(od) || !finite(adv) {
				res.Dropped++
				continue
			}
			// KL and entropy inputs: required (and finite) when their term
			// is on; otherwise only read for the diagnostics.
			var kl, dkl float64
			haveRef := s.RefLogp != nil && t < len(s.RefLogp) && finite(s.RefLogp[t])
			if s.RefLogp != nil && klc != 0 && !haveRef {
				res.Dropped++
				continue
			}
			if haveRef {
				d := s.RefLogp[t] - nw
				ed := math.Exp(d)
				kl = math.Expm1(d) - d // exp(d) − d − 1 without cancellation
				dkl = 1 - ed           // ∂kl/∂new
				if !finite(kl) || !finite(dkl) {
					if klc != 0 {
						res.Dropped++
						continue
					}
					kl, dkl, haveRef = 0, 0, false
				}
			}
			var ent float64
			haveEnt := s.Entropy != nil && t < len(s.Entropy) && finite(s.Entropy[t])
			if s.Entropy != nil && ec != 0 && !haveEnt {
				res.Dropped++
				continue
			}
			if haveEnt {
				ent = s.Entropy[t]
			}

			logr := nw - od
			if logr > logBound || logr < -logBound {
				ratioMasked++
				continue
			}
			r := math.Exp(logr)
			if !finite(r) {
				ratioMasked++
				continue
			}
			unc := r * adv
			cl := min(max(r, lo), hi) * adv
			var l, dl float64
			var isClipped bool
			if cl < unc {
				// min picks the clipped branch, constant in new: no gradient.
				l, dl, isClipped = -cl, 0, true
			} else {
				l, dl = -unc, -adv*r
			}
			if haveRef {
				l += klc * kl
				dl += klc * dkl
			}
			l -= ec * ent
			if !finite(l) || !finite(dl) {
				res.Dropped++
				continue
			}
			if isClipped {
				clipped++
			}
			g[t] = dl // unweighted for now
			a.n++
			a.loss += l
			a.kl += kl
			a.ent += ent
			if haveEnt && ec != 0 {
				res.DEntropy[i][t] = -ec // unweighted for now
			}
		}
	}

	// Weights.
	var tokens, nseq int
	for i := range accs {
		tokens += accs[i].n
		if accs[i].n > 0 {
			nseq++
		}
	}
	res.Tokens = tokens
	if finiteSel := selected - res.Dropped; finiteSel > 0 {
		res.MaskedFrac = float64(ratioMasked) / float64(finiteSel)
	}
	if tokens == 0 {
		zeroAll(res.DNewLogp)
		zeroAll(res.DEntropy)
		return res
	}
	res.ClipFrac = float64(clipped) / float64(tokens)
	for i := range accs {
		a := &accs[i]
		var w float64
		if a.n > 0 {
			switch cfg.Agg {
			case SeqMean:
				w = 1 / (float64(nseq) * float64(a.n))
			default:
				w = 1 / float64(tokens)
			}
		}
		res.Loss += w * a.loss
		res.KL += w * a.kl
		res.Entropy += w * a.ent
		scale(res.DNewLogp[i], w)
		scale(res.DEntropy[i], w)
	}
	return res
}

func scale(xs []float64, w float64) {
	for t := range xs {
		xs[t] *= w
	}
}

func zeroAll(xss [][]float64) {
	for _, xs := range xss {
		clear(xs)
	}
}
