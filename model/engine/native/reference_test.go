package native

import (
	"math"
	"testing"
)

// refLogprobs is a deliberately naive float64 Qwen3 forward written from the
// HF modelling code's definition (effective weights W + s·B·A, repeat_kv for
// grouped heads, q/k RMSNorm before rotate-half RoPE), used to check the
// optimised float32 path.
func refLogprobs(w *weights, ad *adapter, params []float32, toks []int) []float64 {
	c := w.cfg
	T, H, D := len(toks), c.Hidden, c.HeadDim
	eff := func(l int, m module) [][]float64 {
		out, in := c.dims(m)
		W := make([][]float64, out)
		for o := range W {
			W[o] = make([]float64, in)
			for i := range W[o] {
				W[o][i] = float64(w.layers[l].proj[m][o*in+i])
				if params != nil && ad.slots[l][m].on {
					A, B := ad.A(params, l, m), ad.B(params, l, m)
					for j := 0; j < ad.rank; j++ {
						W[o][i] += float64(ad.scale) * float64(B[o*ad.rank+j]) * float64(A[j*in+i])
					}
				}
			}
		}
		return W
	}
	mat := func(W [][]float64, x []float64) []float64 {
		y := make([]float64, len(W))
		for o := range W {
			for i, v := range x {
				y[o] += W[o][i] * v
			}
		}
		return y
	}
	norm := func(x []float64, wt []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+c.RMSNormEps)
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv * float64(wt[i])
		}
		return y
	}
	rope := func(x []float64, pos int) {
		half := D / 2
		for i := 0; i < half; i++ {
			ang := float64(pos) / math.Pow(c.RopeTheta, float64(2*i)/float64(D))
			a, b := x[i], x[i+half]
			x[i] = a*math.Cos(ang) - b*math.Sin(ang)
			x[i+half] = b*math.Cos(ang) + a*math.Sin(ang)
		}
	}
	h := make([][]float64, T)
	for t, id := range toks {
		h[t] = make([]float64, H)
		for i := range h[t] {
			h[t][i] = float64(w.embed[id*H+i])
		}
	}
	for l := 0; l < c.Layers; l++ {
		lw := w.layers[l]
		Wq, Wk, Wv, Wo := eff(l, modQ), eff(l, modK), eff(l, modV), eff(l, modO)
		Wg, Wu, Wd := eff(l, modGate), eff(l, modUp), eff(l, modDown)
		q := make([][][]float64, T) // [t][head][d]
		k := make([][][]float64, T)
		v := make([][][]float64, T)
		for t := 0; t < T; t++ {
			a := norm(h[t], lw.attnNorm)
			qa, ka, va := mat(Wq, a), mat(Wk, a), mat(Wv, a)
			for hd := 0; hd < c.Heads; hd++ {
				qh := norm(qa[hd*D:(hd+1)*D], lw.qNorm)
				rope(qh, t)
				q[t] = append(q[t], qh)
			}
			for g := 0; g < c.KVHeads; g++ {
				kh := norm(ka[g*D:(g+1)*D], lw.kNorm)
				rope(kh, t)
				k[t] = append(k[t], kh)
				v[t] = append(v[t], va[g*D:(g+1)*D])
			}
		}
		grp := c.Heads / c.KVHeads
		for t := 0; t < T; t++ {
			o := make([]float64, c.Heads*D)
			for hd := 0; hd < c.Heads; hd++ {
				g := hd / grp
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					for i := 0; i < D; i++ {
						s[j] += q[t][hd][i] * k[j][g][i]
					}
					s[j] /= math.Sqrt(float64(D))
					mx = math.Max(mx, s[j])
				}
				var z float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					z += s[j]
				}
				for j := range s {
					for i := 0; i < D; i++ {
						o[hd*D+i] += s[j] / z * v[j][g][i]
					}
				}
			}
			ao := mat(Wo, o)
			for i := range h[t] {
				h[t][i] += ao[i]
			}
			m := norm(h[t], lw.mlpNorm)
			gt, up := mat(Wg, m), mat(Wu, m)
			for i := range gt {
				gt[i] = gt[i] / (1 + math.Exp(-gt[i])) * up[i]
			}
			d := mat(Wd, gt)
			for i := range h[t] {
				h[t][i] += d[i]
			}
		}
	}
	lp := make([]float64, T)
	for t := 0; t+1 < T; t++ {
		f := norm(h[t], w.norm)
		z := make([]float64, c.VocabSize)
		mx := math.Inf(-1)
		for j := range z {
			for i, fv := range f {
				z[j] += fv * float64(w.lmHead[j*H+i])
			}
			mx = math.Max(mx, z[j])
		}
		var s float64
		for _, zv := range z {
			s += math.Exp(zv - mx)
		}
		lp[t+1] = z[toks[t+1]] - mx - math.Log(s)
	}
	return lp
}

func TestForwardMatchesReference(t *testing.T) {
	for _, tied := range []bool{true, false} {
		cfg := TinyConfig(80)
		cfg.TiedEmbeddings = tied
		e, err := NewTiny(cfg, 13, Options{LoRA: LoRAConfig{Rank: 4}})
		if err != nil {
			t.Fatal(err)
		}
		perturb(e, 13)
		toks := []int{7, 3, 79, 0, 12, 12, 45, 8, 61, 2}
		for _, base := range []bool{false, true} {
			got, err := e.Logprobs(ctx, [][]int{toks}, base)
			if err != nil {
				t.Fatal(err)
			}
			var params []float32
			if !base {
				params = e.ad.params
			}
			want := refLogprobs(e.w, e.ad, params, toks)
			for i := range want {
				if d := math.Abs(float64(got[0][i]) - want[i]); d > 2e-4*(1+math.Abs(want[i])) {
					t.Fatalf("tied %v base %v: logprob[%d] = %v, reference %v", tied, base, i, got[0][i], want[i])
				}
			}
		}
	}
}
