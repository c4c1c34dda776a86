package native

import (
	"sync"
)

// The matrix kernels below are plain Go: no assembly and no cgo, so the
// engine builds everywhere the rest of clawmesh does. The kernel is a 2×4
// register-blocked dot product: eight accumulators fit amd64's float
// registers, where a 4×4 block spills and measured at half the speed.
// Matrices are row-major float32; weights are [out, in] as HF stores them,
// so the forward pass is C = A·Bᵀ ("NT"), which reads both operands along
// contiguous rows.

// minTaskFlops is the least work worth a goroutine.
const minTaskFlops = 1 << 16

// parallel runs fn over [0, n) split into at most par contiguous chunks whose
// starts are multiples of align; it runs inline when par ≤ 1 or there is one
// chunk.
func parallel(par, n, align int, work int64, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if align < 1 {
		align = 1
	}
	chunks := int(work / minTaskFlops)
	if chunks > par {
		chunks = par
	}
	if u := (n + align - 1) / align; chunks > u {
		chunks = u
	}
	if chunks <= 1 {
		fn(0, n)
		return
	}
	per := (n + chunks - 1) / chunks
	per = (per + align - 1) / align * align
	var wg sync.WaitGroup
	for lo := per; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	fn(0, min(per, n))
	wg.Wait()
}

// gemmNT computes C[m,n] = A[m,k]·B[n,k]ᵀ, or adds it to C when acc is set.
func gemmNT(c, a, b []float32, m, n, k, par int, acc bool) {
	_ = c[m*n-1]
	_ = a[m*k-1]
	_ = b[n*k-1]
	parallel(par, n, 4, 2*int64(m)*int64(n)*int64(k), func(lo, hi int) {
		ntBlock(c, n, a, b, 0, m, lo, hi, k, acc)
	})
}

// ntBlock computes rows [i0,i1) and columns [j0,j1) of C = A·Bᵀ with C's row
// stride ldc.
func ntBlock(c []float32, ldc int, a, b []float32, i0, i1, j0, j1, k int, acc bool) {
	j := j0
	for ; j+4 <= j1; j += 4 {
		b0, b1, b2, b3 := b[j*k:(j+1)*k], b[(j+1)*k:(j+2)*k], b[(j+2)*k:(j+3)*k], b[(j+3)*k:(j+4)*k]
		i := i0
		for ; i+2 <= i1; i += 2 {
			kern24(c[i*ldc+j:], ldc, a[i*k:(i+1)*k], a[(i+1)*k:(i+2)*k], b0, b1, b2, b3, acc)
		}
		if i < i1 {
			kern14(c[i*ldc+j:i*ldc+j+4], a[i*k:(i+1)*k], b0, b1, b2, b3, acc)
		}
	}
	for ; j < j1; j++ {
		bj := b[j*k : (j+1)*k]
		for i := i0; i < i1; i++ {
			s := dot(a[i*k:(i+1)*k], bj)
			if acc {
				c[i*ldc+j] += s
			} else {
				c[i*ldc+j] = s
			}
		}
	}
}

func kern24(c []float32, ldc int, a0, a1, b0, b1, b2, b3 []float32, acc bool) {
	n := len(a0)
	a1 = a1[:n]
	b0, b1, b2, b3 = b0[:n], b1[:n], b2[:n], b3[:n]
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	for i := 0; i < n; i++ {
		x0, x1 := a0[i], a1[i]
		y0, y1, y2, y3 := b0[i], b1[i], b2[i], b3[i]
		c00 += x0 * y0
		c01 += x0 * y1
		c02 += x0 * y2
		c03 += x0 * y3
		c10 += x1 * y0
		c11 += x1 * y1
		c12 += x1 * y2
		c13 += x1 * y3
	}
	r0 := c[0:4:4]
	r1 := c[ldc : ldc+4 : ldc+4]
	if acc {
		r0[0] += c00
		r0[1] += c01
		r0[2] += c02
		r0[3] += c03
		r1[0] += c10
		r1[1] += c11
		r1[2] += c12
		r1[3] += c13
		return
	}
	r0[0], r0[1], r0[2], r0[3] = c00, c01, c02, c03
	r1[0], r1[1], r1[2], r1[3] = c10, c11, c12, c13
}

func kern14(c []float32, a0, b0, b1, b2, b3 []float32, acc bool) {
	n := len(a0)
	b0, b1, b2, b3 = b0[:n], b1[:n], b2[:n], b3[:n]
	var c0, c1, c2, c3 float32
	for i := 0; i < n; i++ {
		x := a0[i]
		c0 += x * b0[i]
		c1 += x * b1[i]
		c2 += x * b2[i]
		c3 += x * b3[i]
	}
	c = c[:4]
	if acc {
		c[0] += c0
		c[1] += c1
		c[2] += c2
		c[3] += c3
		return
	}
	c[0], c[1], c[2], c[3] = c0, c1, c2, c3
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy adds alpha·x to y.
func axpy(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	i := 0
	for ; i+4 <= len(y); i += 4 {
		y[i] += alpha * x[i]
		y[i+1] += alpha * x[i+1]
		y[i+2] += alpha * x[i+2]
		y[i+3] += alpha * x[i+3]
	}
	for ; i < len(y); i++ {
		y[i] += alpha * x[i]
	}
}

// gemmNN packs B in blocks of nnKBlock rows × nnPanel columns (64 KB, so
// the packed block stays in cache and packing writes stay local).
const (
	nnPanel  = 64
	nnKBlock = 256
)

// gemmNN computes C[m,n] = A[m,k]·B[k,n] (or adds it when acc): each worker
// takes a panel of C's columns, packs B's matching block transposed, k-block
// by k-block, and runs the NT kernel on it.
func gemmNN(c, a, b []float32, m, n, k, par int, acc bool) {
	_ = c[m*n-1]
	_ = a[m*k-1]
	_ = b[k*n-1]
	parallel(par, n, nnPanel, 2*int64(m)*int64(n)*int64(k), func(lo, hi int) {
		pack := make([]float32, nnPanel*nnKBlock)
		for j0 := lo; j0 < hi; j0 += nnPanel {
			w := min(nnPanel, hi-j0)
			for k0 := 0; k0 < k; k0 += nnKBlock {
				kc := min(nnKBlock, k-k0)
				// Column by column: contiguous writes; the block's rows
				// (kc × 64 floats) stay cached across columns.
				for jj := 0; jj < w; jj++ {
					dst := pack[jj*kc : (jj+1)*kc]
					src := b[k0*n+j0+jj:]
					for kk := range dst {
						dst[kk] = src[kk*n]
					}
				}
				ntPacked(c, n, a, k, k0, pack, kc, m, j0, w, acc || k0 > 0)
			}
		}
	})
}

// ntPacked computes C[:, j0:j0+w] (+)= A[:, k0:k0+kc]·packᵀ, where pack
// holds w rows of length kc and A has row stride lda.
func ntPacked(c []float32, ldc int, a []float32, lda, k0 int, pack []float32, kc, m, j0, w int, acc bool) {
	arow := func(i int) []float32 { return a[i*lda+k0 : i*lda+k0+kc] }
	j := 0
	for ; j+4 <= w; j += 4 {
		b0, b1, b2, b3 := pack[j*kc:(j+1)*kc], pack[(j+1)*kc:(j+2)*kc], pack[(j+2)*kc:(j+3)*kc], pack[(j+3)*kc:(j+4)*kc]
		i := 0
		for ; i+2 <= m; i += 2 {
			kern24(c[i*ldc+j0+j:], ldc, arow(i), arow(i+1), b0, b1, b2, b3, acc)
		}
		if i < m {
			kern14(c[i*ldc+j0+j:i*ldc+j0+j+4], arow(i), b0, b1, b2, b3, acc)
		}
	}
	for ; j < w; j++ {
		bj := pack[j*kc : (j+1)*kc]
		for i := 0; i < m; i++ {
			s := dot(arow(i), bj)
			if acc {
				c[i*ldc+j0+j] += s
			} else {
				c[i*ldc+j0+j] = s
			}
		}
	}
}

// gemmTN adds A[k,m]ᵀ·B[k,n] to C[m,n] (weight gradients: a sum over
// tokens of outer products), parallel over C's columns.
func gemmTN(c, a, b []float32, m, n, k, par int) {
	_ = c[m*n-1]
	_ = a[k*m-1]
	_ = b[k*n-1]
	parallel(par, n, 16, 2*int64(m)*int64(n)*int64(k), func(lo, hi int) {
		for kk := 0; kk < k; kk++ {
			brow := b[kk*n+lo : kk*n+hi]
			arow := a[kk*m : (kk+1)*m]
			for i, av := range arow {
				if av != 0 {
					axpy(c[i*n+lo:i*n+hi], av, brow)
				}
			}
		}
	})
}
