package loss

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

const tol = 1e-9

func near(a, b, eps float64) bool {
	return math.Abs(a-b) <= eps*max(1, math.Abs(a), math.Abs(b))
}

// one builds a single-token sequence whose ratio is exactly ratio.
func one(ratio, adv float64) Seq {
	return Seq{
		NewLogp: []float64{-1 + math.Log(ratio)},
		OldLogp: []float64{-1},
		Adv:     []float64{adv},
		Mask:    []bool{true},
	}
}

// TestSurrogateRegimes checks the loss, gradient and clip accounting of one
// token in every branch of the clipped objective against values worked out
// by hand from L = −min(ρA, clip(ρ, 0.8, 1.28)·A).
func TestSurrogateRegimes(t *testing.T) {
	cases := []struct {
		name           string
		ratio, adv     float64
		loss, grad     float64
		clipped        bool
		masked, tokens int
	}{
		{"A>0 on-policy", 1, 1, -1, -1, false, 0, 1},
		{"A>0 inside", 1.1, 2, -2.2, -2.2, false, 0, 1},
		{"A>0 above 1+eps_high", 1.5, 1, -1.28, 0, true, 0, 1},
		{"A>0 below 1-eps_low", 0.5, 1, -0.5, -0.5, false, 0, 1},
		{"A<0 inside", 0.9, -1, 0.9, 0.9, false, 0, 1},
		{"A<0 above 1+eps_high", 1.5, -2, 3, 3, false, 0, 1},
		{"A<0 below 1-eps_low", 0.5, -1, 0.8, 0, true, 0, 1},
		{"A=0", 2, 0, 0, 0, false, 0, 1},
		{"ratio above bound", 6, -1, 0, 0, false, 1, 0},
		{"ratio below 1/bound", 0.1, 1, 0, 0, false, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Surrogate([]Seq{one(c.ratio, c.adv)}, Config{})
			if !near(r.Loss, c.loss, tol) {
				t.Errorf("loss = %v, want %v", r.Loss, c.loss)
			}
			if !near(r.DNewLogp[0][0], c.grad, tol) {
				t.Errorf("grad = %v, want %v", r.DNewLogp[0][0], c.grad)
			}
			wantClip := 0.0
			if c.clipped {
				wantClip = 1
			}
			if r.ClipFrac != wantClip || r.Tokens != c.tokens || r.MaskedFrac != float64(c.masked) {
				t.Errorf("clipfrac %v tokens %d maskedfrac %v, want %v %d %d", r.ClipFrac, r.Tokens, r.MaskedFrac, wantClip, c.tokens, c.masked)
			}
		})
	}
}

// TestSurrogateAggregation checks both reductions on sequences of
// different lengths, where they differ.
func TestSurrogateAggregation(t *testing.T) {
	// On-policy (ratio 1) so L_i = −A_i.
	seqs := []Seq{
		{NewLogp: []float64{-1, -1, -1}, OldLogp: []float64{-1, -1, -1}, Adv: []float64{1, 1, 1}, Mask: []bool{true, true, true}},
		{NewLogp: []float64{-2}, OldLogp: []float64{-2}, Adv: []float64{-2}, Mask: []bool{true}},
		{NewLogp: []float64{-2}, OldLogp: []float64{-2}, Adv: []float64{5}, Mask: []bool{false}}, // no kept token
	}
	tok := Surrogate(seqs, Config{Agg: TokenMean})
	// (−1 −1 −1 + 2) / 4
	if !near(tok.Loss, -0.25, tol) || tok.Tokens != 4 {
		t.Errorf("token-mean loss %v tokens %d", tok.Loss, tok.Tokens)
	}
	if !near(tok.DNewLogp[0][0], -0.25, tol) || !near(tok.DNewLogp[1][0], 0.5, tol) || tok.DNewLogp[2][0] != 0 {
		t.Errorf("token-mean grads %v", tok.DNewLogp)
	}
	seq := Surrogate(seqs, Config{Agg: SeqMean})
	// mean(−1, +2) over the two sequences that keep tokens
	if !near(seq.Loss, 0.5, tol) {
		t.Errorf("seq-mean loss %v", seq.Loss)
	}
	if !near(seq.DNewLogp[0][1], -1.0/6, tol) || !near(seq.DNewLogp[1][0], 1, tol) {
		t.Errorf("seq-mean grads %v", seq.DNewLogp)
	}
}

func TestSurrogateKLAndEntropy(t *testing.T) {
	s := one(1, 0)
	s.RefLogp = []float64{-1 + 0.5} // d = ref − new = 0.5
	s.Entropy = []float64{2}
	r := Surrogate([]Seq{s}, Config{KLCoef: 0.1, EntropyCoef: 0.01})
	kl := math.Exp(0.5) - 0.5 - 1
	if !near(r.KL, kl, tol) || !near(r.Entropy, 2, tol) {
		t.Errorf("KL %v entropy %v, want %v 2", r.KL, r.Entropy, kl)
	}
	if !near(r.Loss, 0.1*kl-0.01*2, tol) {
		t.Errorf("loss %v", r.Loss)
	}
	if !near(r.DNewLogp[0][0], 0.1*(1-math.Exp(0.5)), tol) || !near(r.DEntropy[0][0], -0.01, tol) {
		t.Errorf("grads %v %v", r.DNewLogp, r.DEntropy)
	}
	// Coefficients off: diagnostics still reported, loss untouched.
	r = Surrogate([]Seq{s}, Config{})
	if r.Loss != 0 || !near(r.KL, kl, tol) || r.DNewLogp[0][0] != 0 || r.DEntropy[0][0] != 0 {
		t.Errorf("coefficients off: %+v", r)
	}
}

// refLoss recomputes the loss the slow, obvious way, independently of
// Surrogate's two-pass bookkeeping.
func refLoss(seqs []Seq, cfg Config) float64 {
	cfg = cfg.WithDefaults()
	type tok struct {
		seq int
		l   float64
	}
	var kept []tok
	for i, s := range seqs {
		for t := range s.NewLogp {
			if !s.Mask[t] {
				continue
			}
			ratio := math.Exp(s.NewLogp[t] - s.OldLogp[t])
			if ratio > cfg.RatioBound || ratio < 1/cfg.RatioBound {
				continue
			}
			a := s.Adv[t]
			clipped := math.Max(1-cfg.EpsLow, math.Min(1+cfg.EpsHigh, ratio))
			l := -math.Min(ratio*a, clipped*a)
			if s.RefLogp != nil {
				d := s.RefLogp[t] - s.NewLogp[t]
				l += cfg.KLCoef * (math.Exp(d) - d - 1)
			}
			if s.Entropy != nil {
				l -= cfg.EntropyCoef * s.Entropy[t]
			}
			kept = append(kept, tok{i, l})
		}
	}
	if len(kept) == 0 {
		return 0
	}
	if cfg.Agg == TokenMean {
		var sum float64
		for _, k := range kept {
			sum += k.l
		}
		return sum / float64(len(kept))
	}
	sums := map[int]float64{}
	counts := map[int]int{}
	for _, k := range kept {
		sums[k.seq] += k.l
		counts[k.seq]++
	}
	var total float64
	for i := range sums {
		total += sums[i] / float64(counts[i])
	}
	return total / float64(len(sums))
}

// randomBatch draws a batch whose ratios stay away from the clip and mask
// boundaries, so that the loss is smooth around every point and finite
// differences are exact up to O(h²).
func randomBatch(rng *rand.Rand, nseq int, kl, ent bool) []Seq {
	cfg := Config{}.WithDefaults()
	safeLogRatio := func() float64 {
		for {
			lr := rng.Float64()*4 - 2 // ratio in [e^-2, e^2], across every regime
			r := math.Exp(lr)
			far := func(b float64) bool { return math.Abs(r-b) > 0.02 }
			if far(1-cfg.EpsLow) && far(1+cfg.EpsHigh) && far(cfg.RatioBound) && far(1/cfg.RatioBound) {
				return lr
			}
		}
	}
	seqs := make([]Seq, nseq)
	for i := range seqs {
		n := 1 + rng.IntN(6)
		s := Seq{NewLogp: make([]float64, n), OldLogp: make([]float64, n), Adv: make([]float64, n), Mask: make([]bool, n)}
		if kl {
			s.RefLogp = make([]float64, n)
		}
		if ent {
			s.Entropy = make([]float64, n)
		}
		for t := range n {
			s.OldLogp[t] = -rng.Float64() * 5
			s.NewLogp[t] = s.OldLogp[t] + safeLogRatio()
			s.Adv[t] = rng.Float64()*4 - 2
			s.Mask[t] = rng.IntN(5) != 0
			if kl {
				s.RefLogp[t] = s.NewLogp[t] + rng.Float64()*2 - 1
			}
			if ent {
				s.Entropy[t] = rng.Float64() * 3
			}
		}
		seqs[i] = s
	}
	return seqs
}

// TestSurrogateGradientFiniteDifference checks DNewLogp and DEntropy
// against central finite differences of an independently computed loss, over
// random batches that cover every regime, with both aggregations, KL and
// entropy terms on and off.
func TestSurrogateGradientFiniteDifference(t *testing.T) {
	const h = 1e-6
	cfgs := []Config{
		{},
		{Agg: SeqMean},
		{KLCoef: 0.3},
		{EntropyCoef: 0.05, Agg: SeqMean},
		{KLCoef: 0.1, EntropyCoef: 0.02, EpsLow: 0.1, EpsHigh: 0.5, RatioBound: 3},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for ci, cfg := range cfgs {
		for trial := range 20 {
			seqs := randomBatch(rng, 1+rng.IntN(4), cfg.KLCoef != 0, cfg.EntropyCoef != 0)
			res := Surrogate(seqs, cfg)
			if ref := refLoss(seqs, cfg); !near(res.Loss, ref, 1e-12) {
				t.Fatalf("cfg %d trial %d: loss %v, reference %v", ci, trial, res.Loss, ref)
			}
			for i := range seqs {
				for tk := range seqs[i].NewLogp {
					x := &seqs[i].NewLogp[tk]
					orig := *x
					*x = orig + h
					up := refLoss(seqs, cfg)
					*x = orig - h
					down := refLoss(seqs, cfg)
					*x = orig
					fd := (up - down) / (2 * h)
					if math.Abs(fd-res.DNewLogp[i][tk]) > 1e-7 {
						t.Fatalf("cfg %d trial %d seq %d tok %d: dL/dnew %v, finite difference %v", ci, trial, i, tk, res.DNewLogp[i][tk], fd)
					}
					if seqs[i].Entropy == nil {
						continue
					}
					e := &seqs[i].Entropy[tk]
					orig = *e
					*e = orig + h
					up = refLoss(seqs, cfg)
					*e = orig - h
					down = refLoss(seqs, cfg)
					*e = orig
					fd = (up - down) / (2 * h)
					if math.Abs(fd-res.DEntropy[i][tk]) > 1e-7 {
						t.Fatalf("cfg %d trial %d seq %d tok %d: dL/dentropy %v, finite difference %v", ci, trial, i, tk, res.DEntropy[i][tk], fd)
					}
				}
			}
		}
	}
}

// TestSurrogateZeroGradientWhereExcluded: clipped-out, masked and
// ratio-masked tokens carry no gradient.
func TestSurrogateZeroGradientWhereExcluded(t *testing.T) {
	s := Seq{
		NewLogp: []float64{-1 + math.Log(1.5), -1, -1 + math.Log(0.5), -1 + math.Log(10)},
		OldLogp: []float64{-1, -1, -1, -1},
		Adv:     []float64{1, 1, -1, -1},
		Mask:    []bool{true, false, true, true},
	}
	r := Surrogate([]Seq{s}, Config{})
	for tk, g := range r.DNewLogp[0] {
		if g != 0 {
			t.Errorf("token %d: gradient %v, want 0", tk, g)
		}
	}
	if r.Tokens != 2 || r.ClipFrac != 1 || !near(r.MaskedFrac, 1.0/3, tol) {
		t.Errorf("tokens %d clipfrac %v maskedfrac %v", r.Tokens, r.ClipFrac, r.MaskedFrac)
	}
}

func TestSurrogateEmpty(t *testing.T) {
	cases := map[string][]Seq{
		"nil batch":   nil,
		"zero length": {{}},
		"all masked":  {{NewLogp: []float64{-1, -2}, OldLogp: []float64{-1, -2}, Adv: []float64{1, 1}, Mask: []bool{false, false}}},
		"all out of bound": {{NewLogp: []float64{0, -9}, OldLogp: []float64{-9, 0}, Adv: []float64{1, 1}, Mask: []bool{true, true},
			Entropy: []float64{1, 1}}},
	}
	for name, seqs := range cases {
		t.Run(name, func(t *testing.T) {
			r := Surrogate(seqs, Config{EntropyCoef: 0.1})
			if r.Loss != 0 || r.Tokens != 0 || r.ClipFrac != 0 || r.KL != 0 || r.Entropy != 0 {
				t.Errorf("%+v", r)
			}
			if len(r.DNewLogp) != len(seqs) {
				t.Fatalf("DNewLogp has %d rows", len(r.DNewLogp))
			}
			for i := range seqs {
				if len(r.DNewLogp[i]) != len(seqs[i].NewLogp) {
					t.Errorf("row %d length %d", i, len(r.DNewLogp[i]))
				}
				for _, g := range append(r.DNewLogp[i], r.DEntropy[i]...) {
					if g != 0 {
						t.Errorf("non-zero gradient %v", g)
					}
				}
			}
		})
	}
}

// TestSurrogateNonFinite: a NaN, ±Inf or absurd value drops its token and
// leaves the rest of the batch exactly as if that token had been masked.
func TestSurrogateNonFinite(t *testing.T) {
	base := func() Seq {
		return Seq{
			NewLogp: []float64{-1, -1.1, -0.9},
			OldLogp: []float64{-1, -1, -1},
			Adv:     []float64{1, -0.5, 0.3},
			Mask:    []bool{true, true, true},
			RefLogp: []float64{-1.2, -1, -0.8},
			Entropy: []float64{1, 2, 3},
		}
	}
	cfg := Config{KLCoef: 0.2, EntropyCoef: 0.01}
	want := base()
	want.Mask[1] = false
	ref := Surrogate([]Seq{want}, cfg)

	bad := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 1e300}
	fields := map[string]func(*Seq) *float64{
		"new":     func(s *Seq) *float64 { return &s.NewLogp[1] },
		"old":     func(s *Seq) *float64 { return &s.OldLogp[1] },
		"adv":     func(s *Seq) *float64 { return &s.Adv[1] },
		"ref":     func(s *Seq) *float64 { return &s.RefLogp[1] },
		"entropy": func(s *Seq) *float64 { return &s.Entropy[1] },
	}
	for name, field := range fields {
		for _, v := range bad {
			s := base()
			*field(&s) = v
			r := Surrogate([]Seq{s}, cfg)
			if r.Dropped != 1 || r.Tokens != 2 {
				t.Errorf("%s=%v: dropped %d tokens %d", name, v, r.Dropped, r.Tokens)
			}
			if r.Loss != ref.Loss || r.KL != ref.KL || r.Entropy != ref.Entropy {
				t.Errorf("%s=%v: loss %v kl %v ent %v, want %v %v %v", name, v, r.Loss, r.KL, r.Entropy, ref.Loss, ref.KL, ref.Entropy)
			}
			for tk := range 3 {
				if r.DNewLogp[0][tk] != ref.DNewLogp[0][tk] || r.DEntropy[0][tk] != ref.DEntropy[0][tk] {
					t.Errorf("%s=%v: grads %v %v, want %v %v", name, v, r.DNewLogp, r.DEntropy, ref.DNewLogp, ref.DEntropy)
				}
			}
		}
	}
	// With the KL and entropy terms off, bad reference or entropy values do
	// not cost the token; they only leave the diagnostics.
	s := base()
	s.RefLogp[1], s.Entropy[1] = math.NaN(), math.Inf(1)
	r := Surrogate([]Seq{s}, Config{})
	if r.Dropped != 0 || r.Tokens != 3 || math.IsNaN(r.KL) || math.IsInf(r.Entropy, 0) {
		t.Errorf("terms off: %+v", r)
	}
	// An overflowing ratio with the mask turned off is ratio-masked, not NaN.
	s = base()
	s.NewLogp[1], s.OldLogp[1] = 0, -1000
	r = Surrogate([]Seq{s}, Config{RatioBound: math.Inf(1)})
	if r.Tokens != 2 || math.IsNaN(r.Loss) || r.MaskedFrac == 0 {
		t.Errorf("overflowing ratio: %+v", r)
	}
}

// TestSurrogateShortSlices: a position some slice does not reach is masked.
func TestSurrogateShortSlices(t *testing.T) {
	s := Seq{NewLogp: []float64{-1, -1, -1}, OldLogp: []float64{-1, -1}, Adv: []float64{1, 1, 1}, Mask: []bool{true, true, true}}
	r := Surrogate([]Seq{s}, Config{})
	if r.Tokens != 2 || len(r.DNewLogp[0]) != 3 || r.DNewLogp[0][2] != 0 {
		t.Errorf("%+v", r)
	}
	// A reference too short while KL is on drops the token.
	s.OldLogp = append(s.OldLogp, -1)
	s.RefLogp = []float64{-1}
	r = Surrogate([]Seq{s}, Config{KLCoef: 1})
	if r.Tokens != 1 || r.Dropped != 2 {
		t.Errorf("short ref: %+v", r)
	}
}

func TestConfig(t *testing.T) {
	d := Config{}.WithDefaults()
	if d.EpsLow != 0.2 || d.EpsHigh != 0.28 || d.RatioBound != 5 || d.Agg != TokenMean || d.KLCoef != 0 || d.EntropyCoef != 0 {
		t.Errorf("defaults %+v", d)
	}
	if c := (Config{EpsLow: 0.1, EpsHigh: 0.3, RatioBound: 2}).WithDefaults(); c.EpsLow != 0.1 || c.EpsHigh != 0.3 || c.RatioBound != 2 {
		t.Errorf("explicit values replaced: %+v", c)
	}
	valid := []Config{{}, {EpsLow: 1}, {RatioBound: math.Inf(1)}, {KLCoef: 1, EntropyCoef: -0.1, Agg: SeqMean}}
	for _, c := range valid {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	invalid := []Config{
		{EpsLow: -0.1}, {EpsLow: 1.5}, {EpsLow: math.NaN()},
		{EpsHigh: -1}, {EpsHigh: math.Inf(1)},
		{RatioBound: 1}, {RatioBound: 0.5}, {RatioBound: -2}, {RatioBound: math.NaN()},
		{KLCoef: -1}, {KLCoef: math.NaN()}, {EntropyCoef: math.Inf(-1)},
		{Agg: 7},
	}
	seqs := randomBatch(rand.New(rand.NewPCG(3, 4)), 3, true, true)
	def := Surrogate(seqs, Config{})
	for _, c := range invalid {
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
		// Surrogate uses the default in place of the invalid field.
		if r := Surrogate(seqs, c); r.Loss != def.Loss {
			t.Errorf("%+v: loss %v, want the default config's %v", c, r.Loss, def.Loss)
		}
	}
}

func TestAggregationText(t *testing.T) {
	for _, a := range []Aggregation{TokenMean, SeqMean} {
		b, _ := a.MarshalText()
		var got Aggregation
		if err := got.UnmarshalText(b); err != nil || got != a {
			t.Errorf("%v: round trip %v %v", a, got, err)
		}
	}
	if a, err := ParseAggregation(" Seq_Mean "); err != nil || a != SeqMean {
		t.Errorf("seq_mean: %v %v", a, err)
	}
	if _, err := ParseAggregation("sum"); !errors.Is(err, ErrUnknownAggregation) {
		t.Errorf("sum: %v", err)
	}
	if s := Aggregation(9).String(); s != "aggregation(9)" {
		t.Errorf("String %q", s)
	}
}
