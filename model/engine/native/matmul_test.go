package native

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

func randSlice(r *rand.Rand, n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64()) * scale
	}
	return s
}

func TestGemm(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, sz := range [][3]int{{1, 1, 1}, {1, 7, 5}, {3, 5, 9}, {2, 4, 8}, {17, 130, 33}, {64, 96, 200}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, par := range []int{1, 3} {
			a := randSlice(r, m*k, 1)
			bt := randSlice(r, n*k, 1) // [n,k]
			b := make([]float32, k*n)  // bt transposed: [k,n]
			for j := 0; j < n; j++ {
				for kk := 0; kk < k; kk++ {
					b[kk*n+j] = bt[j*k+kk]
				}
			}
			at := make([]float32, k*m) // [k,m]
			for i := 0; i < m; i++ {
				for kk := 0; kk < k; kk++ {
					at[kk*m+i] = a[i*k+kk]
				}
			}
			want := make([]float64, m*n)
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					var s float64
					for kk := 0; kk < k; kk++ {
						s += float64(a[i*k+kk]) * float64(bt[j*k+kk])
					}
					want[i*n+j] = s
				}
			}
			check := func(name string, c []float32, mult float64) {
				t.Helper()
				for i := range c {
					if d := math.Abs(float64(c[i]) - mult*want[i]); d > 1e-4*float64(k)*mult {
						t.Fatalf("%s %v par %d: c[%d] = %v, want %v", name, sz, par, i, c[i], mult*want[i])
					}
				}
			}
			c := make([]float32, m*n)
			gemmNT(c, a, bt, m, n, k, par, false)
			check("NT", c, 1)
			gemmNT(c, a, bt, m, n, k, par, true)
			check("NT acc", c, 2)
			c2 := make([]float32, m*n)
			gemmNN(c2, a, b, m, n, k, par, false)
			check("NN", c2, 1)
			gemmNN(c2, a, b, m, n, k, par, true)
			check("NN acc", c2, 2)
			c3 := make([]float32, m*n)
			gemmTN(c3, at, b, m, n, k, par)
			check("TN", c3, 1)
		}
	}
}

// BenchmarkMatmul measures the forward kernel (C = A·Bᵀ) at shapes the
// engine meets: a training batch through a projection, the MLP, a single
// generated token (matrix × vector), and a square reference.
func BenchmarkMatmul(b *testing.B) {
	for _, sz := range [][3]int{{256, 256, 256}, {128, 896, 896}, {128, 4864, 896}, {1, 4864, 896}, {512, 512, 512}} {
		m, n, k := sz[0], sz[1], sz[2]
		b.Run(fmt.Sprintf("NT_%dx%dx%d", m, n, k), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, w, c := randSlice(r, m*k, 1), randSlice(r, n*k, 1), make([]float32, m*n)
			par := runtime.GOMAXPROCS(0)
			for b.Loop() {
				gemmNT(c, x, w, m, n, k, par, false)
			}
			b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		// The baseline: gonum's Sgemm (assembly kernels) on the same product.
		b.Run(fmt.Sprintf("gonum_NT_%dx%dx%d", m, n, k), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, w, c := randSlice(r, m*k, 1), randSlice(r, n*k, 1), make([]float32, m*n)
			var impl gonum.Implementation
			for b.Loop() {
				impl.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, x, k, w, k, 0, c, n)
			}
			b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
	b.Run("NN_128x896x4864", func(b *testing.B) {
		m, n, k := 128, 896, 4864
		r := rand.New(rand.NewPCG(1, 2))
		x, w, c := randSlice(r, m*k, 1), randSlice(r, k*n, 1), make([]float32, m*n)
		par := runtime.GOMAXPROCS(0)
		for b.Loop() {
			gemmNN(c, x, w, m, n, k, par, false)
		}
		b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
}
