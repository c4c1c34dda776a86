package loss

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
)

// fuzzReader decodes a batch from arbitrary bytes. Values are 16-bit
// fixed point in [−32, 32) with three codes for NaN, +Inf and −Inf, so the
// fuzzer reaches every regime (and the poisoned ones) quickly.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) float() float64 {
	if len(r.b) < 2 {
		r.b = nil
		return 0
	}
	v := int16(binary.LittleEndian.Uint16(r.b))
	r.b = r.b[2:]
	switch v {
	case math.MinInt16:
		return math.NaN()
	case math.MaxInt16:
		return math.Inf(1)
	case math.MinInt16 + 1:
		return math.Inf(-1)
	}
	return float64(v) / 1024
}

func decodeBatch(data []byte) ([]Seq, Config) {
	r := &fuzzReader{data}
	flags := r.byte()
	cfg := Config{Agg: Aggregation(flags & 3)}
	if flags&4 != 0 {
		cfg.EpsLow, cfg.EpsHigh, cfg.RatioBound = r.float(), r.float(), r.float()
	}
	if flags&8 != 0 {
		cfg.KLCoef = r.float()
	}
	if flags&16 != 0 {
		cfg.EntropyCoef = r.float()
	}
	var seqs []Seq
	for len(r.b) > 0 && len(seqs) < 64 {
		n := int(r.byte() % 16)
		shape := r.byte()
		s := Seq{NewLogp: make([]float64, n), OldLogp: make([]float64, n), Adv: make([]float64, n), Mask: make([]bool, n)}
		if shape&1 != 0 {
			s.RefLogp = make([]float64, n)
		}
		if shape&2 != 0 {
			s.Entropy = make([]float64, n)
		}
		if shape&4 != 0 && n > 0 { // a short slice
			s.OldLogp = s.OldLogp[:n-1]
		}
		for t := range n {
			s.Mask[t] = r.byte()&1 == 1
			s.NewLogp[t] = r.float()
			if t < len(s.OldLogp) {
				s.OldLogp[t] = r.float()
			}
			s.Adv[t] = r.float()
			if s.RefLogp != nil {
				s.RefLogp[t] = r.float()
			}
			if s.Entropy != nil {
				s.Entropy[t] = r.float()
			}
		}
		seqs = append(seqs, s)
	}
	return seqs, cfg
}

// FuzzSurrogate: whatever the batch and the config, every output is finite,
// shaped like the input, and unselected tokens carry no gradient.
func FuzzSurrogate(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		seed := make([]byte, 64+rng.IntN(256))
		for i := range seed {
			seed[i] = byte(rng.Uint32())
		}
		f.Add(seed)
	}
	f.Add([]byte{0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 1, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		seqs, cfg := decodeBatch(data)
		r := Surrogate(seqs, cfg)
		for name, v := range map[string]float64{"loss": r.Loss, "kl": r.KL, "entropy": r.Entropy} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%s = %v", name, v)
			}
		}
		if !(r.ClipFrac >= 0 && r.ClipFrac <= 1) || !(r.MaskedFrac >= 0 && r.MaskedFrac <= 1) {
			t.Fatalf("fractions %v %v", r.ClipFrac, r.MaskedFrac)
		}
		selected := 0
		for i, s := range seqs {
			if len(r.DNewLogp[i]) != len(s.NewLogp) || len(r.DEntropy[i]) != len(s.Entropy) {
				t.Fatalf("seq %d: gradient shapes %d %d", i, len(r.DNewLogp[i]), len(r.DEntropy[i]))
			}
			for tk, g := range r.DNewLogp[i] {
				if math.IsNaN(g) || math.IsInf(g, 0) {
					t.Fatalf("seq %d tok %d: gradient %v", i, tk, g)
				}
				if !s.Mask[tk] && g != 0 {
					t.Fatalf("seq %d tok %d: unselected token has gradient %v", i, tk, g)
				}
			}
			for tk, g := range r.DEntropy[i] {
				if math.IsNaN(g) || math.IsInf(g, 0) {
					t.Fatalf("seq %d tok %d: entropy gradient %v", i, tk, g)
				}
			}
			for _, m := range s.Mask {
				if m {
					selected++
				}
			}
		}
		if r.Tokens+r.Dropped > selected {
			t.Fatalf("tokens %d + dropped %d > selected %d", r.Tokens, r.Dropped, selected)
		}
	})
}

// FuzzBaselineJSON: the baseline is part of replicated trainer state, so
// its decoder sees bytes from peers. Whatever decodes must behave: finite
// value, and encoding it again gives a fixed point.
func FuzzBaselineJSON(f *testing.F) {
	for _, b := range []Baseline{{}, {Decay: 0.5}, {Window: 4}} {
		for _, r := range []float64{1, -1, 0.25} {
			b.Observe(r)
		}
		data, _ := json.Marshal(b)
		f.Add(data)
	}
	f.Add([]byte(`{"window":2,"n":9,"recent":[1,-1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var b Baseline
		if err := b.UnmarshalJSON(data); err != nil {
			return
		}
		if v := b.Value(); math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("value %v", v)
		}
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		var c Baseline
		if err := json.Unmarshal(enc, &c); err != nil {
			t.Fatalf("re-decode %s: %v", enc, err)
		}
		b.Observe(0.5)
		c.Observe(0.5)
		if b.Value() != c.Value() || math.IsNaN(b.Value()) {
			t.Fatalf("%s: decoded copies diverge: %v %v", enc, b.Value(), c.Value())
		}
	})
}

func BenchmarkSurrogate(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  Config
		kl   bool
	}{
		{"plain", Config{}, false},
		{"kl+entropy/seq-mean", Config{KLCoef: 0.05, EntropyCoef: 0.01, Agg: SeqMean}, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const nseq, ntok = 16, 1024
			rng := rand.New(rand.NewPCG(7, 8))
			seqs := make([]Seq, nseq)
			for i := range seqs {
				s := Seq{NewLogp: make([]float64, ntok), OldLogp: make([]float64, ntok), Adv: make([]float64, ntok), Mask: make([]bool, ntok)}
				if bc.kl {
					s.RefLogp, s.Entropy = make([]float64, ntok), make([]float64, ntok)
				}
				adv := rng.Float64()*2 - 1
				for t := range ntok {
					s.OldLogp[t] = -rng.ExpFloat64()
					s.NewLogp[t] = s.OldLogp[t] + rng.NormFloat64()*0.2
					s.Adv[t] = adv
					s.Mask[t] = t >= 64 // a prompt-sized prefix is not trained on
					if bc.kl {
						s.RefLogp[t] = s.OldLogp[t] + rng.NormFloat64()*0.1
						s.Entropy[t] = rng.Float64() * 2
					}
				}
				seqs[i] = s
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				Surrogate(seqs, bc.cfg)
			}
			b.ReportMetric(float64(nseq*ntok)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
