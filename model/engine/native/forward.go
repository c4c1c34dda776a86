package native

// runner evaluates the model with a given adapter parameter vector (nil:
// base model only).
type runner struct {
	w      *weights
	ad     *adapter
	params []float32 // adapter parameters; nil disables the adapter
	par    int
}

func (r *runner) lora(l int, m module) bool {
	return r.params != nil && r.ad.slots[l][m].on
}

// layerActs are one layer's saved activations for a sequence of T tokens.
type layerActs struct {
	x, a, h1, m []float32 // [T,H]: input, normed, after attention, normed
	inv1, inv2  []float32 // [T]
	q, k, v     []float32 // raw projections
	qInv, kInv  []float32 // per head 1/rms
	qr, kr      []float32 // normed and rotated
	p           []float32 // attention probabilities [heads, T, T]
	o           []float32 // attention output [T, heads·d]
	g, u, act   []float32 // [T, I]
	xa          [numModules][]float32
}

func newLayerActs(c Config, T, rank int, train bool) *layerActs {
	H, I, qd, kd := c.Hidden, c.Intermediate, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	la := &layerActs{
		x: make([]float32, T*H), a: make([]float32, T*H), h1: make([]float32, T*H), m: make([]float32, T*H),
		inv1: make([]float32, T), inv2: make([]float32, T),
		q: make([]float32, T*qd), k: make([]float32, T*kd), v: make([]float32, T*kd),
		qInv: make([]float32, T*c.Heads), kInv: make([]float32, T*c.KVHeads),
		qr: make([]float32, T*qd), kr: make([]float32, T*kd), o: make([]float32, T*qd),
		g: make([]float32, T*I), u: make([]float32, T*I), act: make([]float32, T*I),
	}
	if train {
		la.p = make([]float32, c.Heads*T*T)
	}
	for m := range la.xa {
		la.xa[m] = make([]float32, T*rank)
	}
	return la
}

// kvCache holds every layer's rotated keys and values for generation.
type kvCache struct {
	k, v [][]float32 // per layer [cap, kvHeads·d]
	n    int         // positions filled
}

func newKVCache(c Config, capacity int) *kvCache {
	kc := &kvCache{k: make([][]float32, c.Layers), v: make([][]float32, c.Layers)}
	kd := c.KVHeads * c.HeadDim
	for l := range kc.k {
		kc.k[l] = make([]float32, capacity*kd)
		kc.v[l] = make([]float32, capacity*kd)
	}
	return kc
}

// linear computes y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ for T rows, saving s·x·Aᵀ in xa.
func (r *runner) linear(l int, m module, y, x, xa []float32, T int) {
	out, in := r.w.cfg.dims(m)
	gemmNT(y, x, r.w.layers[l].proj[m], T, out, in, r.par, false)
	if !r.lora(l, m) {
		return
	}
	rk := r.ad.rank
	gemmNT(xa, x, r.ad.A(r.params, l, m), T, rk, in, r.par, false)
	for i := range xa[:T*rk] {
		xa[i] *= r.ad.scale
	}
	gemmNT(y, xa, r.ad.B(r.params, l, m), T, out, rk, r.par, true)
}

// linearBack adds ∂L/∂x to dx and the adapter's gradients to grad, given dy.
func (r *runner) linearBack(l int, m module, dx, dy, x, xa []float32, T int, grad []float32, acc bool) {
	out, in := r.w.cfg.dims(m)
	gemmNN(dx, dy, r.w.layers[l].proj[m], T, in, out, r.par, acc)
	if !r.lora(l, m) {
		return
	}
	rk := r.ad.rank
	gemmTN(r.ad.B(grad, l, m), dy, xa, out, rk, T, r.par)
	dxa := make([]float32, T*rk)
	gemmNN(dxa, dy, r.ad.B(r.params, l, m), T, rk, out, r.par, false)
	for i := range dxa {
		dxa[i] *= r.ad.scale
	}
	gemmTN(r.ad.A(grad, l, m), dxa, x, rk, in, T, r.par)
	gemmNN(dx, dxa, r.ad.A(r.params, l, m), T, in, rk, r.par, true)
}

// layer runs decoder layer l on h [T,H] in place for positions [start,
// start+T), saving activations in la. With a cache, keys and values are
// appended to it and attention covers every cached position; without one,
// attention covers these T tokens only.
func (r *runner) layer(l int, h []float32, T, start int, la *layerActs, kc *kvCache, rope ropeTable) {
	c := r.w.cfg
	lw := &r.w.layers[l]
	H, I, D := c.Hidden, c.Intermediate, c.HeadDim
	kd := c.KVHeads * D
	copy(la.x, h[:T*H])
	rmsNorm(la.a, la.x, lw.attnNorm, la.inv1, T, H, c.RMSNormEps)
	r.linear(l, modQ, la.q, la.a, la.xa[modQ], T)
	r.linear(l, modK, la.k, la.a, la.xa[modK], T)
	r.linear(l, modV, la.v, la.a, la.xa[modV], T)
	rmsNorm(la.qr, la.q, lw.qNorm, la.qInv, T*c.Heads, D, c.RMSNormEps)
	rmsNorm(la.kr, la.k, lw.kNorm, la.kInv, T*c.KVHeads, D, c.RMSNormEps)
	rope.apply(la.qr, T, c.Heads, false)
	rope.apply(la.kr, T, c.KVHeads, false)
	keys, vals := la.kr, la.v
	if kc != nil {
		copy(kc.k[l][start*kd:], la.kr[:T*kd])
		copy(kc.v[l][start*kd:], la.v[:T*kd])
		keys, vals = kc.k[l][:(start+T)*kd], kc.v[l][:(start+T)*kd]
	}
	attention(la.o, la.qr, keys, vals, la.p, T, start, c.Heads, c.KVHeads, D, r.par)
	r.linear(l, modO, h, la.o, la.xa[modO], T) // h = o·Woᵀ ...
	for i, v := range la.x[:T*H] {             // ... + x
		h[i] += v
	}
	copy(la.h1, h[:T*H])
	rmsNorm(la.m, la.h1, lw.mlpNorm, la.inv2, T, H, c.RMSNormEps)
	r.linear(l, modGate, la.g, la.m, la.xa[modGate], T)
	r.linear(l, modUp, la.u, la.m, la.xa[modUp], T)
	swiglu(la.act[:T*I], la.g[:T*I], la.u)
	r.linear(l, modDown, h, la.act, la.xa[modDown], T)
	for i, v := range la.h1[:T*H] {
		h[i] += v
	}
}

// layerBack turns dh (∂L/∂ layer output, [T,H]) into ∂L/∂ layer input in
// place, adding the adapter's gradients to grad.
func (r *runner) layerBack(l int, dh []float32, T int, la *layerActs, rope ropeTable, grad []float32) {
	c := r.w.cfg
	lw := &r.w.layers[l]
	H, I, D := c.Hidden, c.Intermediate, c.HeadDim
	qd, kd := c.Heads*D, c.KVHeads*D
	// MLP: dh flows to h1 directly and through down, SwiGLU, gate/up, norm.
	dact := make([]float32, T*I)
	r.linearBack(l, modDown, dact, dh, la.act, la.xa[modDown], T, grad, false)
	dg, du := make([]float32, T*I), make([]float32, T*I)
	swigluBack(dg, du, dact, la.g[:T*I], la.u)
	dm := make([]float32, T*H)
	r.linearBack(l, modGate, dm, dg, la.m, la.xa[modGate], T, grad, false)
	r.linearBack(l, modUp, dm, du, la.m, la.xa[modUp], T, grad, true)
	rmsNormBack(dh, dm, la.h1, lw.mlpNorm, la.inv2, T, H) // dh is now ∂L/∂h1
	// Attention.
	do := make([]float32, T*qd)
	r.linearBack(l, modO, do, dh, la.o, la.xa[modO], T, grad, false)
	dqr, dkr, dv := make([]float32, T*qd), make([]float32, T*kd), make([]float32, T*kd)
	attentionBack(dqr, dkr, dv, do, la.qr, la.kr, la.v, la.p, T, c.Heads, c.KVHeads, D, r.par)
	rope.apply(dqr, T, c.Heads, true)
	rope.apply(dkr, T, c.KVHeads, true)
	dq, dk := make([]float32, T*qd), make([]float32, T*kd)
	rmsNormBack(dq, dqr, la.q, lw.qNorm, la.qInv, T*c.Heads, D)
	rmsNormBack(dk, dkr, la.k, lw.kNorm, la.kInv, T*c.KVHeads, D)
	da := make([]float32, T*H)
	r.linearBack(l, modQ, da, dq, la.a, la.xa[modQ], T, grad, false)
	r.linearBack(l, modK, da, dk, la.a, la.xa[modK], T, grad, true)
	r.linearBack(l, modV, da, dv, la.a, la.xa[modV], T, grad, true)
	rmsNormBack(dh, da, la.x, lw.attnNorm, la.inv1, T, H) // dh is now ∂L/∂x
}

// seqActs are a whole sequence's saved activations.
type seqActs struct {
	tokens []int
	layers []*layerActs
	hf     []float32 // input of the final norm [T,H]
	invF   []float32
	f      []float32 // final hidden states [T,H]
	lse    []float64 // log-partition of the logits at each position t (predicting t+1)
	rope   ropeTable
}

// embed writes the token embeddings into h.
func (r *runner) embed(h []float32, toks []int) {
	H := r.w.cfg.Hidden
	for t, id := range toks {
		copy(h[t*H:(t+1)*H], r.w.embed[id*H:(id+1)*H])
	}
}

// forward runs a whole sequence (no cache) and returns its final hidden
// states. With train set every layer's activations are kept for backward.
func (r *runner) forward(toks []int, train bool) *seqActs {
	c := r.w.cfg
	T, H := len(toks), c.Hidden
	rank := 0
	if r.params != nil {
		rank = r.ad.rank
	}
	sa := &seqActs{tokens: toks, rope: newRope(0, T, c.HeadDim, c.RopeTheta)}
	h := make([]float32, T*H)
	r.embed(h, toks)
	var shared *layerActs
	for l := 0; l < c.Layers; l++ {
		la := shared
		if train || la == nil {
			la = newLayerActs(c, T, rank, train)
		}
		if !train {
			shared = la
		}
		r.layer(l, h, T, 0, la, nil, sa.rope)
		sa.layers = append(sa.layers, la)
	}
	sa.hf = h
	sa.invF = make([]float32, T)
	sa.f = make([]float32, T*H)
	rmsNorm(sa.f, h, r.w.norm, sa.invF, T, H, c.RMSNormEps)
	return sa
}

// headRows is how many positions' logits are materialised at once.
func (r *runner) headRows() int {
	return max(1, min(64, (16<<20)/r.w.cfg.VocabSize))
}

// headRowsFor lists the positions t whose next-token distribution is
// needed: every t in [0, T−1), or only those with need[t+1] when need is set.
func headRowsFor(T int, need []bool) []int {
	rows := make([]int, 0, T)
	for t := 0; t+1 < T; t++ {
		if need == nil || need[t+1] {
			rows = append(rows, t)
		}
	}
	return rows
}

// gatherRows copies rows idx of src (row width n) into dst.
func gatherRows(dst, src []float32, idx []int, n int) {
	for i, t := range idx {
		copy(dst[i*n:(i+1)*n], src[t*n:(t+1)*n])
	}
}

// logprobs fills logp[t] = log p(tok[t] | tok[:t]) for t ≥ 1 and ent[t] =
// the entropy of that distribution, saving the log-partitions in sa.lse.
// With need set, only positions t with need[t] are computed (the others
// read 0): the LM head dominates small models' cost, and the loss reads only
// the trained tokens.
func (r *runner) logprobs(sa *seqActs, logp, ent []float64, need []bool) {
	c := r.w.cfg
	T, H, V := len(sa.tokens), c.Hidden, c.VocabSize
	sa.lse = make([]float64, T)
	rows := headRowsFor(T, need)
	chunk := r.headRows()
	z := make([]float32, min(chunk, len(rows))*V)
	fr := make([]float32, min(chunk, len(rows))*H)
	clear(logp)
	clear(ent)
	for i0 := 0; i0 < len(rows); i0 += chunk {
		idx := rows[i0:min(i0+chunk, len(rows))]
		n := len(idx)
		gatherRows(fr, sa.f, idx, H)
		gemmNT(z, fr[:n*H], r.w.lmHead, n, V, H, r.par, false)
		for i, t := range idx {
			zr := z[i*V : (i+1)*V]
			lse, h := logSoftmaxRow(zr)
			sa.lse[t] = lse
			logp[t+1] = float64(zr[sa.tokens[t+1]]) - lse
			if ent != nil {
				ent[t+1] = h
			}
		}
	}
}

// backward propagates ∂L/∂logp and ∂L/∂entropy (per position, as in
// logprobs) to the adapter, adding into grad. Positions with no gradient
// skip the LM head.
func (r *runner) backward(sa *seqActs, dlogp, dent []float64, ent []float64, grad []float32) {
	c := r.w.cfg
	T, H, V := len(sa.tokens), c.Hidden, c.VocabSize
	need := make([]bool, T)
	for t := 1; t < T; t++ {
		need[t] = dlogp[t] != 0 || (dent != nil && dent[t] != 0)
	}
	rows := headRowsFor(T, need)
	chunk := r.headRows()
	z := make([]float32, min(chunk, len(rows))*V)
	fr := make([]float32, min(chunk, len(rows))*H)
	dfr := make([]float32, min(chunk, len(rows))*H)
	df := make([]float32, T*H)
	for i0 := 0; i0 < len(rows); i0 += chunk {
		idx := rows[i0:min(i0+chunk, len(rows))]
		n := len(idx)
		gatherRows(fr, sa.f, idx, H)
		gemmNT(z, fr[:n*H], r.w.lmHead, n, V, H, r.par, false)
		for i, t := range idx {
			var ge, ht float64
			if dent != nil {
				ge, ht = dent[t+1], ent[t+1]
			}
			logitsBack(z[i*V:(i+1)*V], sa.lse[t], sa.tokens[t+1], dlogp[t+1], ge, ht)
		}
		gemmNN(dfr[:n*H], z[:n*V], r.w.lmHead, n, H, V, r.par, false)
		for i, t := range idx {
			copy(df[t*H:(t+1)*H], dfr[i*H:(i+1)*H])
		}
	}
	dh := make([]float32, T*H)
	rmsNormBack(dh, df, sa.hf, r.w.norm, sa.invF, T, H)
	for l := c.Layers - 1; l >= 0; l-- {
		r.layerBack(l, dh, T, sa.layers[l], sa.rope, grad)
	}
}

// step runs T new tokens at positions [kc.n, kc.n+T) through the model with
// the cache and returns the logits of the last one.
func (r *runner) step(toks []int, kc *kvCache, logits []float32) {
	c := r.w.cfg
	T, H := len(toks), c.Hidden
	start := kc.n
	rank := 0
	if r.params != nil {
		rank = r.ad.rank
	}
	rope := newRope(start, T, c.HeadDim, c.RopeTheta)
	h := make([]float32, T*H)
	r.embed(h, toks)
	la := newLayerActs(c, T, rank, false)
	for l := 0; l < c.Layers; l++ {
		r.layer(l, h, T, start, la, kc, rope)
	}
	kc.n += T
	f := make([]float32, H)
	var inv [1]float32
	rmsNorm(f, h[(T-1)*H:T*H], r.w.norm, inv[:], 1, H, c.RMSNormEps)
	gemmNT(logits, f, r.w.lmHead, 1, c.VocabSize, H, r.par, false)
}
