package adapter

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchParts are k contributions of an adapter shaped like a rank-8 LoRA on
// the seven projections of a 21-layer model of hidden size 512, 4:1 grouped
// KV and MLP 1408: 72,704 parameters a layer, 1,526,784 in all.
func benchParts(k int) ([]Contribution, int) {
	const layers, hidden, mlp, rank = 21, 512, 1408, 8
	dims := [][2]int{{hidden, hidden}, {hidden, hidden / 4}, {hidden, hidden / 4}, {hidden, hidden},
		{hidden, mlp}, {hidden, mlp}, {mlp, hidden}} // in, out
	r := rand.New(rand.NewPCG(1, 2))
	var layout []Tensor
	params := 0
	for l := range layers {
		for m, d := range dims {
			for _, ab := range []struct {
				name  string
				shape []int
			}{{"A", []int{rank, d[0]}}, {"B", []int{d[1], rank}}} {
				n := ab.shape[0] * ab.shape[1]
				layout = append(layout, Tensor{Name: fmt.Sprintf("layers.%02d.m%d.lora_%s.weight", l, m, ab.name), Shape: ab.shape, Data: make([]float32, n)})
				params += n
			}
		}
	}
	parts := make([]Contribution, k)
	for i := range parts {
		d := &Delta{}
		for _, t := range layout {
			v := make([]float32, len(t.Data))
			for j := range v {
				v[j] = float32(r.NormFloat64() * 1e-3)
			}
			d.Tensors = append(d.Tensors, Tensor{Name: t.Name, Shape: t.Shape, Data: v})
		}
		parts[i] = Contribution{From: fmt.Sprint("t", i), Weight: float64(1 + i), Delta: d}
	}
	return parts, params
}

// BenchmarkAggregate aggregates 5 contributions of a 1.5M-parameter
// adapter; memsum, the baseline, only adds them up in float32, which is as
// fast as reading them can be. MB/s counts the contributions' bytes.
func BenchmarkAggregate(b *testing.B) {
	parts, params := benchParts(5)
	bytes := int64(len(parts) * params * 4)
	b.Run("memsum", func(b *testing.B) {
		out := make([][]float32, len(parts[0].Delta.Tensors))
		for i, t := range parts[0].Delta.Tensors {
			out[i] = make([]float32, len(t.Data))
		}
		b.SetBytes(bytes)
		for b.Loop() {
			for ti, dst := range out {
				copy(dst, parts[0].Delta.Tensors[ti].Data)
				for _, p := range parts[1:] {
					for j, x := range p.Delta.Tensors[ti].Data {
						dst[j] += x
					}
				}
			}
		}
	})
	for _, o := range []AggOptions{{}, {Method: TrimmedMean}, {Method: TrimmedMean, MaxNorm: 0.5}} {
		name := o.Method.String()
		if o.MaxNorm > 0 {
			name += "-maxnorm"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(bytes)
			for b.Loop() {
				if _, _, err := Aggregate(parts, o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("norm", func(b *testing.B) {
		b.SetBytes(int64(params * 4))
		for b.Loop() {
			parts[0].Delta.Norm()
		}
	})
}
