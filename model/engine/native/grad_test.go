package native

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Finite-difference checks of every backward pass. The forward passes run in
// float32, so each check takes a central difference of a float64-accumulated
// scalar loss along a random direction (for the whole input, and for single
// coordinates) and compares it with the analytic directional derivative.

// weighted returns Σ c_i·y_i in float64.
func weighted(c, y []float32) float64 {
	var s float64
	for i := range y {
		s += float64(c[i]) * float64(y[i])
	}
	return s
}

// checkGrad compares grad with central differences of f at x: along
// random unit directions and along a few single coordinates.
func checkGrad(t *testing.T, name string, x []float32, grad []float32, f func() float64, r *rand.Rand) {
	t.Helper()
	const eps = 1e-2
	orig := slices.Clone(x)
	dirs := [][]float32{}
	for range 3 {
		u := randSlice(r, len(x), 1)
		n := float32(math.Sqrt(weighted(u, u)))
		for i := range u {
			u[i] /= n
		}
		dirs = append(dirs, u)
	}
	for range 4 {
		u := make([]float32, len(x))
		u[r.IntN(len(x))] = 1
		dirs = append(dirs, u)
	}
	for di, u := range dirs {
		want := weighted(u, grad)
		for i := range x {
			x[i] = orig[i] + eps*u[i]
		}
		fp := f()
		for i := range x {
			x[i] = orig[i] - eps*u[i]
		}
		fm := f()
		copy(x, orig)
		got := (fp - fm) / (2 * eps)
		if d := math.Abs(got - want); d > 2e-2*math.Max(math.Abs(got), math.Abs(want))+2e-3 {
			t.Errorf("%s dir %d: finite difference %.6g, analytic %.6g", name, di, got, want)
		}
	}
}

func TestGradRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	rows, n := 3, 16
	x, w, c := randSlice(r, rows*n, 1), randSlice(r, n, 1), randSlice(r, rows*n, 1)
	y, inv := make([]float32, rows*n), make([]float32, rows)
	f := func() float64 { rmsNorm(y, x, w, inv, rows, n, 1e-6); return weighted(c, y) }
	f()
	dx := make([]float32, rows*n)
	rmsNormBack(dx, c, x, w, inv, rows, n)
	checkGrad(t, "rmsnorm", x, dx, f, r)
}

func TestGradRoPE(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	T, heads, d := 4, 3, 8
	rt := newRope(5, T, d, 10000)
	x, c := randSlice(r, T*heads*d, 1), randSlice(r, T*heads*d, 1)
	f := func() float64 { y := slices.Clone(x); rt.apply(y, T, heads, false); return weighted(c, y) }
	dx := slices.Clone(c)
	rt.apply(dx, T, heads, true)
	checkGrad(t, "rope", x, dx, f, r)
	// The rotation preserves norms, and inverse undoes it.
	y := slices.Clone(x)
	rt.apply(y, T, heads, false)
	if a, b := weighted(x, x), weighted(y, y); math.Abs(a-b) > 1e-4*a {
		t.Errorf("rope changed the norm: %v → %v", a, b)
	}
	rt.apply(y, T, heads, true)
	for i := range y {
		if math.Abs(float64(y[i]-x[i])) > 1e-5 {
			t.Fatalf("inverse rope: %v vs %v", y[i], x[i])
		}
	}
}

func TestGradAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 3))
	T, heads, kvh, d := 5, 4, 2, 8
	q, k, v := randSlice(r, T*heads*d, 1), randSlice(r, T*kvh*d, 1), randSlice(r, T*kvh*d, 1)
	c := randSlice(r, T*heads*d, 1)
	o, p := make([]float32, T*heads*d), make([]float32, heads*T*T)
	f := func() float64 { attention(o, q, k, v, p, T, 0, heads, kvh, d, 2); return weighted(c, o) }
	f()
	dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
	attentionBack(dq, dk, dv, c, q, k, v, p, T, heads, kvh, d, 2)
	checkGrad(t, "attention dq", q, dq, f, r)
	checkGrad(t, "attention dk", k, dk, f, r)
	checkGrad(t, "attention dv", v, dv, f, r)
	// Causality: the first query attends only to the first key.
	for h := 0; h < heads; h++ {
		if p[h*T*T] != 1 || p[h*T*T+1] != 0 {
			t.Fatalf("head %d row 0 = %v", h, p[h*T*T:h*T*T+T])
		}
	}
}

func TestGradSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 4))
	n := 20
	g, u, c := randSlice(r, n, 2), randSlice(r, n, 1), randSlice(r, n, 1)
	act := make([]float32, n)
	f := func() float64 { swiglu(act, g, u); return weighted(c, act) }
	dg, du := make([]float32, n), make([]float32, n)
	swigluBack(dg, du, c, g, u)
	checkGrad(t, "swiglu dg", g, dg, f, r)
	checkGrad(t, "swiglu du", u, du, f, r)
}

func TestGradLogits(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 5))
	V, y := 30, 7
	z := randSlice(r, V, 2)
	const gl, ge = 0.7, -0.4
	f := func() float64 {
		lse, h := logSoftmaxRow(z)
		return gl*(float64(z[y])-lse) + ge*h
	}
	lse, h := logSoftmaxRow(z)
	// Entropy against the definition.
	var want float64
	for _, v := range z {
		lp := float64(v) - lse
		want -= math.Exp(lp) * lp
	}
	if math.Abs(h-want) > 1e-9 {
		t.Fatalf("entropy %v, want %v", h, want)
	}
	dz := slices.Clone(z)
	logitsBack(dz, lse, y, gl, ge, h)
	checkGrad(t, "logits", z, dz, f, r)
	// Large logits stay finite (max subtraction).
	big := []float32{1e4, 1e4 - 1, -1e4}
	if l, e := logSoftmaxRow(big); math.IsInf(l, 0) || math.IsNaN(e) || math.Abs(l-1e4-math.Log1p(math.Exp(-1))) > 1e-6 {
		t.Fatalf("lse of large logits = %v, %v", l, e)
	}
}

// testModel is a 2-layer tiny model with a non-trivial adapter (B ≠ 0).
func testModel(t testing.TB, vocab int, seed uint64) *Engine {
	t.Helper()
	return testModelCfg(t, TinyConfig(vocab), seed)
}

func testModelCfg(t testing.TB, cfg Config, seed uint64) *Engine {
	t.Helper()
	e, err := NewTiny(cfg, seed, Options{LoRA: LoRAConfig{Rank: 4}, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	perturb(e, seed)
	return e
}

// perturb moves every adapter parameter (B included) off its initial value.
func perturb(e *Engine, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 99))
	for i := range e.ad.params {
		e.ad.params[i] += 0.05 * float32(r.NormFloat64())
	}
}

func TestGradLoRALinear(t *testing.T) {
	e := testModel(t, 64, 7)
	r := rand.New(rand.NewPCG(1, 6))
	run := e.runner(false)
	T := 3
	for _, m := range []module{modQ, modO, modDown} {
		out, in := e.w.cfg.dims(m)
		x, c := randSlice(r, T*in, 1), randSlice(r, T*out, 1)
		y, xa := make([]float32, T*out), make([]float32, T*e.ad.rank)
		f := func() float64 { run.linear(1, m, y, x, xa, T); return weighted(c, y) }
		f()
		grad := make([]float32, len(e.ad.params))
		dx := make([]float32, T*in)
		run.linearBack(1, m, dx, c, x, xa, T, grad, false)
		checkGrad(t, moduleNames[m]+" dx", x, dx, f, r)
		checkGrad(t, moduleNames[m]+" dA", e.ad.A(e.ad.params, 1, m), e.ad.A(grad, 1, m), f, r)
		checkGrad(t, moduleNames[m]+" dB", e.ad.B(e.ad.params, 1, m), e.ad.B(grad, 1, m), f, r)
	}
}

// TestGradEndToEnd checks the adapter gradient of Σ c_t·logp_t + Σ e_t·H_t
// through the whole 2-layer model: every module's A and B in every layer.
func TestGradEndToEnd(t *testing.T) {
	untied := TinyConfig(50)
	untied.TiedEmbeddings = false
	for name, cfg := range map[string]Config{"tied": TinyConfig(50), "untied": untied} {
		t.Run(name, func(t *testing.T) { gradEndToEnd(t, testModelCfg(t, cfg, 11)) })
	}
}

func gradEndToEnd(t *testing.T, e *Engine) {
	r := rand.New(rand.NewPCG(1, 7))
	toks := []int{3, 17, 42, 8, 8, 25, 1}
	T := len(toks)
	c, ce := make([]float64, T), make([]float64, T)
	for i := 1; i < T; i++ {
		if i != 3 { // position 3 has no gradient: backward skips its LM-head row
			c[i], ce[i] = r.NormFloat64(), 0.3*r.NormFloat64()
		}
	}
	run := e.runner(false)
	f := func() float64 {
		lp, ent := make([]float64, T), make([]float64, T)
		run.logprobs(run.forward(toks, false), lp, ent, nil)
		var s float64
		for i := range lp {
			s += c[i]*lp[i] + ce[i]*ent[i]
		}
		return s
	}
	sa := run.forward(toks, true)
	lp, ent := make([]float64, T), make([]float64, T)
	run.logprobs(sa, lp, ent, nil)
	grad := make([]float32, len(e.ad.params))
	run.backward(sa, c, ce, ent, grad)
	// The training forward agrees with the inference forward.
	lp2 := make([]float64, T)
	run.logprobs(run.forward(toks, false), lp2, nil, nil)
	for i := range lp {
		if lp[i] != lp2[i] {
			t.Fatalf("train and eval forward differ at %d: %v vs %v", i, lp[i], lp2[i])
		}
	}
	checkGrad(t, "all adapter params", e.ad.params, grad, f, r)
	for l := 0; l < e.w.cfg.Layers; l++ {
		for m := module(0); m < numModules; m++ {
			checkGrad(t, moduleNames[m]+" A", e.ad.A(e.ad.params, l, m), e.ad.A(grad, l, m), f, r)
			checkGrad(t, moduleNames[m]+" B", e.ad.B(e.ad.params, l, m), e.ad.B(grad, l, m), f, r)
		}
	}
}
