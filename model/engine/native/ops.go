package native

import "math"

// The layer primitives, each with its backward pass. Rows are contiguous;
// "inv" holds each row's 1/rms saved by the forward pass.

// rmsNorm writes y = x·inv·w for rows of width n, inv = 1/√(mean(x²)+eps),
// accumulating the mean square in float64.
func rmsNorm(y, x, w, inv []float32, rows, n int, eps float64) {
	w = w[:n]
	for r := 0; r < rows; r++ {
		xr, yr := x[r*n:(r+1)*n], y[r*n:(r+1)*n]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		iv := float32(1 / math.Sqrt(ss/float64(n)+eps))
		inv[r] = iv
		for i, v := range xr {
			yr[i] = v * iv * w[i]
		}
	}
}

// rmsNormBack adds ∂L/∂x to dx given dy: dx = inv·(w⊙dy) − x·inv³/n·Σ(w⊙dy⊙x).
func rmsNormBack(dx, dy, x, w, inv []float32, rows, n int) {
	w = w[:n]
	for r := 0; r < rows; r++ {
		xr, dyr, dxr := x[r*n:(r+1)*n], dy[r*n:(r+1)*n], dx[r*n:(r+1)*n]
		var s float64
		for i, v := range xr {
			s += float64(w[i]) * float64(dyr[i]) * float64(v)
		}
		iv := float64(inv[r])
		c := float32(iv * iv * iv * s / float64(n))
		ivf := float32(iv)
		for i, v := range xr {
			dxr[i] += ivf*w[i]*dyr[i] - v*c
		}
	}
}

// ropeTable holds cos and sin of position × inverse frequency for positions
// [start, start+T), computed as HF does (float32 inverse frequencies and
// angles).
type ropeTable struct {
	half     int
	cos, sin []float32 // [T, half]
}

func newRope(start, T, headDim int, theta float64) ropeTable {
	half := headDim / 2
	rt := ropeTable{half: half, cos: make([]float32, T*half), sin: make([]float32, T*half)}
	inv := make([]float32, half)
	for i := range inv {
		inv[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(headDim)))
	}
	for t := 0; t < T; t++ {
		p := float32(start + t)
		for i, f := range inv {
			a := float64(p * f)
			rt.cos[t*half+i] = float32(math.Cos(a))
			rt.sin[t*half+i] = float32(math.Sin(a))
		}
	}
	return rt
}

// apply rotates v [T, heads·2·half] in place (rotate-half convention:
// (x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin)); inverse applies the
// transpose rotation, which is the backward pass.
func (rt ropeTable) apply(v []float32, T, heads int, inverse bool) {
	h, d := rt.half, 2*rt.half
	for t := 0; t < T; t++ {
		cs, sn := rt.cos[t*h:(t+1)*h], rt.sin[t*h:(t+1)*h]
		for hd := 0; hd < heads; hd++ {
			row := v[(t*heads+hd)*d : (t*heads+hd+1)*d]
			x1, x2 := row[:h], row[h:d]
			for i := range x1 {
				a, b, c, s := x1[i], x2[i], cs[i], sn[i]
				if inverse {
					s = -s
				}
				x1[i] = a*c - b*s
				x2[i] = b*c + a*s
			}
		}
	}
}

// silu is x·σ(x).
func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// swiglu writes act = silu(g)⊙u.
func swiglu(act, g, u []float32) {
	u = u[:len(g)]
	act = act[:len(g)]
	for i, gv := range g {
		act[i] = silu(gv) * u[i]
	}
}

// swigluBack writes ∂L/∂g and ∂L/∂u given ∂L/∂act.
func swigluBack(dg, du, dact, g, u []float32) {
	n := len(g)
	dg, du, dact, u = dg[:n], du[:n], dact[:n], u[:n]
	for i, gv := range g {
		s := float32(1 / (1 + math.Exp(float64(-gv))))
		du[i] = dact[i] * gv * s
		dg[i] = dact[i] * u[i] * s * (1 + gv*(1-s))
	}
}

// attention computes causal grouped-query attention for T queries at
// positions [start, start+T) over keys and values kc, vc [start+T, kvHeads·d]
// (rows are positions). q is [T, heads·d], o receives [T, heads·d]. When p is
// non-nil it receives the probabilities [heads, T, start+T] (zero above the
// diagonal).
func attention(o, q, kc, vc, p []float32, T, start, heads, kvHeads, d, par int) {
	S := start + T
	grp := heads / kvHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	qs, ks := heads*d, kvHeads*d
	parallel(par, heads*T, 1, 4*int64(heads)*int64(T)*int64(S)*int64(d), func(lo, hi int) {
		sc := make([]float32, S)
		for idx := lo; idx < hi; idx++ {
			h, t := idx/T, idx%T
			g := h / grp
			n := start + t + 1
			qv := q[t*qs+h*d : t*qs+(h+1)*d]
			mx := float32(math.Inf(-1))
			for j := 0; j < n; j++ {
				s := dot(qv, kc[j*ks+g*d:j*ks+(g+1)*d]) * scale
				sc[j] = s
				if s > mx {
					mx = s
				}
			}
			var sum float64
			for j := 0; j < n; j++ {
				e := math.Exp(float64(sc[j] - mx))
				sc[j] = float32(e)
				sum += e
			}
			inv := float32(1 / sum)
			ov := o[t*qs+h*d : t*qs+(h+1)*d]
			clear(ov)
			var prow []float32
			if p != nil {
				prow = p[(h*T+t)*S : (h*T+t+1)*S]
			}
			for j := 0; j < n; j++ {
				pj := sc[j] * inv
				if prow != nil {
					prow[j] = pj
				}
				axpy(ov, pj, vc[j*ks+g*d:j*ks+(g+1)*d])
			}
		}
	})
}

// attentionBack computes ∂L/∂q, ∂L/∂k, ∂L/∂v (written, not added) of
// attention over its own T keys (start 0), given ∂L/∂o and the saved
// probabilities.
func attentionBack(dq, dk, dv, do, q, k, v, p []float32, T, heads, kvHeads, d, par int) {
	grp := heads / kvHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	qs, ks := heads*d, kvHeads*d
	// Per-head key and value gradients, summed over each group afterwards.
	dkh := make([]float32, heads*T*d)
	dvh := make([]float32, heads*T*d)
	clear(dq[:T*qs])
	parallel(par, heads, 1, 6*int64(heads)*int64(T)*int64(T)*int64(d), func(lo, hi int) {
		dp := make([]float32, T)
		for h := lo; h < hi; h++ {
			g := h / grp
			for t := 0; t < T; t++ {
				n := t + 1
				dov := do[t*qs+h*d : t*qs+(h+1)*d]
				prow := p[(h*T+t)*T : (h*T+t)*T+n]
				var sum float64
				for j := 0; j < n; j++ {
					dp[j] = dot(dov, v[j*ks+g*d:j*ks+(g+1)*d])
					sum += float64(prow[j]) * float64(dp[j])
				}
				sm := float32(sum)
				qv := q[t*qs+h*d : t*qs+(h+1)*d]
				dqv := dq[t*qs+h*d : t*qs+(h+1)*d]
				for j := 0; j < n; j++ {
					pj := prow[j]
					ds := pj * (dp[j] - sm) * scale
					axpy(dqv, ds, k[j*ks+g*d:j*ks+(g+1)*d])
					axpy(dkh[(h*T+j)*d:(h*T+j+1)*d], ds, qv)
					axpy(dvh[(h*T+j)*d:(h*T+j+1)*d], pj, dov)
				}
			}
		}
	})
	clear(dk[:T*ks])
	clear(dv[:T*ks])
	for h := 0; h < heads; h++ {
		g := h / grp
		for j := 0; j < T; j++ {
			axpy(dk[j*ks+g*d:j*ks+(g+1)*d], 1, dkh[(h*T+j)*d:(h*T+j+1)*d])
			axpy(dv[j*ks+g*d:j*ks+(g+1)*d], 1, dvh[(h*T+j)*d:(h*T+j+1)*d])
		}
	}
}

// logSoftmaxRow returns log Σ exp(z) (max-subtracted, float64) and the
// entropy of softmax(z).
func logSoftmaxRow(z []float32) (lse, entropy float64) {
	mx := float32(math.Inf(-1))
	for _, v := range z {
		if v > mx {
			mx = v
		}
	}
	var sum, wsum float64
	for _, v := range z {
		x := float64(v - mx)
		e := math.Exp(x)
		sum += e
		wsum += e * x
	}
	ls := math.Log(sum)
	// H = −Σ p·log p with log p = x − log Σ e^x.
	return float64(mx) + ls, ls - wsum/sum
}

// logitsBack overwrites the logits z (with log-partition lse) by ∂L/∂z for
// L = gl·log p(y) + ge·H, where H is the distribution's entropy:
// ∂log p(y)/∂z_j = 1[j=y] − p_j and ∂H/∂z_j = −p_j(log p_j + H).
func logitsBack(z []float32, lse float64, y int, gl, ge, h float64) {
	for j, zv := range z {
		lp := float64(zv) - lse
		pj := math.Exp(lp)
		z[j] = float32(-gl*pj - ge*pj*(lp+h))
	}
	z[y] += float32(gl)
}
