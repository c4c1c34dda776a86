package torch

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/loss"
)

// TestSurrogateMatchesGo checks the worker's loss (surrogate.py) against
// model/loss token by token: one written specification (model/loss
// doc.go), two implementations. The cases cover both aggregations,
// clipping on both sides, the ratio mask (and +Inf turning it off), KL and
// entropy terms, and non-finite or absurd inputs that must drop their
// token.

type surrogateSeq struct {
	New  []any  `json:"new"`
	Old  []any  `json:"old"`
	Adv  []any  `json:"adv"`
	Mask []bool `json:"mask"`
	Ref  []any  `json:"ref"`
	Ent  []any  `json:"ent"`
}

type surrogateCase struct {
	Cfg  lossMeta       `json:"cfg"`
	Seqs []surrogateSeq `json:"seqs"`
}

type surrogateOut struct {
	Loss       float64      `json:"loss"`
	KL         float64      `json:"kl"`
	Entropy    float64      `json:"entropy"`
	ClipFrac   float64      `json:"clip_frac"`
	MaskedFrac float64      `json:"masked_frac"`
	Tokens     int          `json:"tokens"`
	Dropped    int          `json:"dropped"`
	DNew       [][]float64  `json:"dnew"`
	DEnt       [][]*float64 `json:"dent"`
}

// num encodes a float for surrogate.py's JSON (non-finite as strings).
func num(x float64) any {
	switch {
	case math.IsNaN(x):
		return "nan"
	case math.IsInf(x, 1):
		return "inf"
	case math.IsInf(x, -1):
		return "-inf"
	}
	return x
}

func nums(v []float64) []any {
	if v == nil {
		return nil
	}
	o := make([]any, len(v))
	for i, x := range v {
		o[i] = num(x)
	}
	return o
}

func randomCase(r *rand.Rand) ([]loss.Seq, loss.Config) {
	cfg := loss.Config{}
	if r.IntN(2) == 0 {
		cfg.Agg = loss.SeqMean
	}
	if r.IntN(2) == 0 {
		cfg.EpsLow, cfg.EpsHigh = 0.05+0.3*r.Float64(), 0.05+0.5*r.Float64()
	}
	switch r.IntN(4) {
	case 0:
		cfg.RatioBound = math.Inf(1)
	case 1:
		cfg.RatioBound = 1.2 + 3*r.Float64()
	}
	if r.IntN(2) == 0 {
		cfg.KLCoef = r.Float64() * 0.3
	}
	if r.IntN(2) == 0 {
		cfg.EntropyCoef = (r.Float64() - 0.5) * 0.1
	}
	odd := func() float64 {
		switch r.IntN(6) {
		case 0:
			return math.NaN()
		case 1:
			return math.Inf(1)
		case 2:
			return math.Inf(-1)
		case 3:
			return 1e120
		case 4:
			return 800 // exp overflows
		}
		return -800
	}
	seqs := make([]loss.Seq, 1+r.IntN(4))
	for i := range seqs {
		n := 1 + r.IntN(12)
		s := loss.Seq{NewLogp: make([]float64, n), OldLogp: make([]float64, n), Adv: make([]float64, n), Mask: make([]bool, n)}
		withRef, withEnt := r.IntN(2) == 0, r.IntN(2) == 0
		if withRef {
			s.RefLogp = make([]float64, n)
		}
		if withEnt {
			s.Entropy = make([]float64, n)
		}
		for t := range n {
			s.NewLogp[t] = -4 * r.Float64()
			s.OldLogp[t] = s.NewLogp[t] + r.NormFloat64()*0.6
			s.Adv[t] = r.NormFloat64()
			s.Mask[t] = r.IntN(5) != 0
			if withRef {
				s.RefLogp[t] = s.NewLogp[t] + r.NormFloat64()*0.5
			}
			if withEnt {
				s.Entropy[t] = 3 * r.Float64()
			}
			if r.IntN(12) == 0 {
				switch r.IntN(5) {
				case 0:
					s.NewLogp[t] = odd()
				case 1:
					s.OldLogp[t] = odd()
				case 2:
					s.Adv[t] = odd()
				case 3:
					if withRef {
						s.RefLogp[t] = odd()
					}
				default:
					if withEnt {
						s.Entropy[t] = odd()
					}
				}
			}
		}
		seqs[i] = s
	}
	return seqs, cfg
}

func TestSurrogateMatchesGo(t *testing.T) {
	py := needTorch(t)
	r := rand.New(rand.NewPCG(13, 13))
	var cases []surrogateCase
	var want []loss.Result
	add := func(seqs []loss.Seq, cfg loss.Config) {
		lc := cfg.WithDefaults()
		m := lossMeta{EpsLow: lc.EpsLow, EpsHigh: lc.EpsHigh, Agg: lc.Agg.String(), RatioBound: lc.RatioBound,
			KLCoef: lc.KLCoef, EntropyCoef: lc.EntropyCoef}
		if math.IsInf(lc.RatioBound, 1) {
			m.RatioBound, m.RatioBoundOff = 0, true
		}
		c := surrogateCase{Cfg: m}
		for _, s := range seqs {
			c.Seqs = append(c.Seqs, surrogateSeq{New: nums(s.NewLogp), Old: nums(s.OldLogp), Adv: nums(s.Adv),
				Mask: s.Mask, Ref: nums(s.RefLogp), Ent: nums(s.Entropy)})
		}
		cases = append(cases, c)
		want = append(want, loss.Surrogate(seqs, cfg))
	}
	for range 300 {
		add(randomCase(r))
	}
	// Edge cases: nothing kept; everything clipped.
	add([]loss.Seq{{NewLogp: []float64{-1}, OldLogp: []float64{-1}, Adv: []float64{1}, Mask: []bool{false}}}, loss.Config{})
	add([]loss.Seq{{NewLogp: []float64{-1, -1}, OldLogp: []float64{-2, 0}, Adv: []float64{1, -1}, Mask: []bool{true, true}}}, loss.Config{})

	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	pyDir, err := writeWorker(filepath.Join(t.TempDir(), "py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "clawmesh_torch.surrogate")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("surrogate.py: %v\n%s", err, stderr.Bytes())
	}
	var got []surrogateOut
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d results for %d cases", len(got), len(want))
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-12*max(1, math.Abs(b)) }
	var dropped, clipped, masked, kept int
	for i, w := range want {
		g := got[i]
		if g.Tokens != w.Tokens || g.Dropped != w.Dropped || !near(g.Loss, w.Loss) || !near(g.KL, w.KL) ||
			!near(g.Entropy, w.Entropy) || !near(g.ClipFrac, w.ClipFrac) || !near(g.MaskedFrac, w.MaskedFrac) {
			t.Errorf("case %d: python %+v\ngo %+v", i, g, w)
			continue
		}
		for s := range w.DNewLogp {
			for k := range w.DNewLogp[s] {
				if !near(g.DNew[s][k], w.DNewLogp[s][k]) {
					t.Errorf("case %d seq %d token %d: dnew python %v, go %v", i, s, k, g.DNew[s][k], w.DNewLogp[s][k])
				}
			}
			if (w.DEntropy[s] == nil) != (g.DEnt[s] == nil) {
				t.Errorf("case %d seq %d: dent presence differs", i, s)
				continue
			}
			for k := range w.DEntropy[s] {
				if g.DEnt[s][k] == nil || !near(*g.DEnt[s][k], w.DEntropy[s][k]) {
					t.Errorf("case %d seq %d token %d: dent python %v, go %v", i, s, k, g.DEnt[s][k], w.DEntropy[s][k])
				}
			}
		}
		dropped += w.Dropped
		kept += w.Tokens
		if w.ClipFrac > 0 {
			clipped++
		}
		if w.MaskedFrac > 0 {
			masked++
		}
	}
	// The cases must reach every branch for the comparison to mean anything.
	if dropped == 0 || clipped == 0 || masked == 0 || kept == 0 {
		t.Fatalf("cases too tame: %d dropped, %d with clipping, %d with ratio masking, %d kept", dropped, clipped, masked, kept)
	}
	t.Logf("%d cases agree: %d tokens kept, %d dropped, %d cases clip, %d mask ratios", len(want), kept, dropped, clipped, masked)
}
