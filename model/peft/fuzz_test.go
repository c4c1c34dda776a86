package peft

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// smallWeights is a one-module adapter_model.safetensors of rank r.
func smallWeights(t testing.TB, r, in, out int, dt safetensors.DType) []byte {
	t.Helper()
	a := make([]float32, r*in)
	b := make([]float32, out*r)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	for i := range b {
		b[i] = float32(i%5)/4 - 0.5
	}
	ta, err := safetensors.F32Tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", dt, []int{r, in}, a)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := safetensors.F32Tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", dt, []int{out, r}, b)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, []safetensors.Tensor{ta, tb}, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzRead feeds adapter_config.json and adapter_model.safetensors bytes to
// the reader. Whatever it accepts is a consistent adapter (every module of
// rank r with factors of its shape, finite, a finite positive scale), and
// stacking it with itself doubles every module's delta.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"peft_type":"LORA","r":2,"lora_alpha":4,"target_modules":["q_proj"]}`), smallWeights(f, 2, 3, 4, safetensors.F32))
	f.Add([]byte(`{"r":2,"lora_alpha":3,"use_rslora":true,"target_modules":".*q_proj"}`), smallWeights(f, 2, 3, 4, safetensors.BF16))
	f.Add([]byte(`{"r":1,"lora_alpha":1,"rank_pattern":{"q":2}}`), smallWeights(f, 1, 1, 1, safetensors.F16))
	f.Add([]byte(`{"r":2,"lora_alpha":4,"use_dora":true}`), []byte{})
	f.Add([]byte(`{"r":3,"lora_alpha":1e309}`), smallWeights(f, 3, 2, 2, safetensors.F32))
	f.Add([]byte(`{"r":1,"lora_alpha":1e39}`), smallWeights(f, 1, 2, 2, safetensors.F32))
	f.Fuzz(func(t *testing.T, cb, wb []byte) {
		c, err := parseConfig(cb)
		if err != nil {
			return
		}
		if c.R <= 0 || c.R > MaxRank || !(c.Scale() > 0) || math.IsInf(c.Scale(), 0) {
			t.Fatalf("accepted r %d alpha %g (scale %g)", c.R, c.LoraAlpha, c.Scale())
		}
		w, err := safetensors.Parse(wb)
		if err != nil {
			return
		}
		ad, err := fromFile(c, w)
		if err != nil {
			return
		}
		if len(ad.Modules) == 0 || len(ad.Targets) == 0 {
			t.Fatalf("accepted an adapter of %d modules, targets %v", len(ad.Modules), ad.Targets)
		}
		cells := 0
		for _, m := range ad.Modules {
			if m.Rank != c.R || m.In <= 0 || m.Out <= 0 || len(m.A) != m.Rank*m.In || len(m.B) != m.Out*m.Rank {
				t.Fatalf("module %s: rank %d in %d out %d with %d and %d values", m.Name, m.Rank, m.In, m.Out, len(m.A), len(m.B))
			}
			cells += m.In * m.Out * m.Rank
		}
		if cells > 1<<16 || 2*c.R > MaxRank {
			return
		}
		st, err := stack([]*Adapter{ad, ad}, []string{"a", "a"})
		if err != nil {
			if overflows(ad) && errors.Is(err, ErrUnsupported) {
				return
			}
			t.Fatalf("an adapter does not stack with itself: %v", err)
		}
		if st.Config.R != 2*c.R || len(st.Modules) != len(ad.Modules) {
			t.Fatalf("stacked rank %d with %d modules, want %d with %d", st.Config.R, len(st.Modules), 2*c.R, len(ad.Modules))
		}
		for i, m := range ad.Modules {
			want, got := m.Delta(), st.Modules[i].Delta()
			for o := range m.Out {
				for in := range m.In {
					// Each scaled B entry is rounded once to float32 (half
					// an ulp, or below the smallest subnormal): bound the
					// error by the terms' magnitudes.
					var terms, as float64
					for k := range m.Rank {
						a := math.Abs(float64(m.A[k*m.In+in]))
						terms += math.Abs(m.Scale*float64(m.B[o*m.Rank+k])) * a
						as += a
					}
					j := o*m.In + in
					if d := math.Abs(got[j] - 2*want[j]); !(d <= 2*(0x1p-24*terms+0x1p-149*as)) {
						t.Fatalf("module %s: stacked delta %g at [%d, %d], want %g", m.Name, got[j], o, in, 2*want[j])
					}
				}
			}
		}
	})
}

// overflows says whether some lora_B entry times its scale is beyond
// float32's range.
func overflows(ad *Adapter) bool {
	for _, m := range ad.Modules {
		for _, v := range m.B {
			if math.Abs(m.Scale*float64(v)) > math.MaxFloat32 {
				return true
			}
		}
	}
	return false
}
