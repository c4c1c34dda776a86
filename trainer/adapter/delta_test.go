package adapter

import (
	"bytes"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

func TestDiffApply(t *testing.T) {
	e := newEngine(t, nativeDefault)
	other := newEngine(t, nativeDefault)
	_, parent := export(t, e)
	// Two rounds: from a fresh adapter (B = 0), then from a trained one.
	for round, text := range texts[:2] {
		train(t, e, text, 1, 3)
		_, child := export(t, e)
		d, err := Diff(child, parent)
		if err != nil {
			t.Fatal(err)
		}
		if ph, _ := parent.Hash(); d.Parent != ph {
			t.Fatalf("delta parent %q, want %q", d.Parent, ph)
		}
		var sq float64
		for _, tn := range d.Tensors {
			for _, x := range tn.Data {
				sq += float64(x) * float64(x)
			}
		}
		if n := d.Norm(); !(n > 0) || math.Abs(n-math.Sqrt(sq)) > 1e-12*n {
			t.Fatalf("norm %v, want %v", n, math.Sqrt(sq))
		}
		got, err := Apply(parent, d)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Config, child.Config) || sameLayout(got.Tensors, child.Tensors) != "" {
			t.Fatalf("Apply changed the config or layout")
		}
		// Bit for bit wherever child − parent is a float32; elsewhere
		// within an ulp of max(|child|, |child − parent|).
		inexact, total := 0, 0
		for i, tn := range got.Tensors {
			for j, x := range tn.Data {
				c, p := child.Tensors[i].Data[j], parent.Tensors[i].Data[j]
				total++
				if float64(c)-float64(p) == float64(c-p) {
					if math.Float32bits(x) != math.Float32bits(c) {
						t.Fatalf("%s[%d]: %v, want %v exactly (parent %v)", tn.Name, j, x, c, p)
					}
					continue
				}
				inexact++
				m := float32(max(math.Abs(float64(c)), math.Abs(float64(c)-float64(p))))
				if ulp := math.Nextafter32(m, float32(math.Inf(1))) - m; math.Abs(float64(x-c)) > float64(ulp) {
					t.Fatalf("%s[%d]: %v, want %v (parent %v)", tn.Name, j, x, c, p)
				}
			}
		}
		// An engine that loads the result has the trained engine's policy:
		// exactly if every value came back exactly.
		dir := filepath.Join(t.TempDir(), "applied")
		if err := got.Write(dir); err != nil {
			t.Fatal(err)
		}
		if err := other.LoadAdapter(ctx, dir); err != nil {
			t.Fatal(err)
		}
		want, have := logprobs(t, e), logprobs(t, other)
		var worst float64
		for i := range want {
			worst = max(worst, math.Abs(float64(want[i]-have[i])))
		}
		t.Logf("round %d: %d of %d values not bit-exact after Apply; logprobs differ by at most %.3g", round+1, inexact, total, worst)
		if inexact == 0 && worst != 0 || worst > 1e-5 {
			t.Fatalf("logprobs after Apply %v, want %v", have, want)
		}
		parent = child
	}
}

// TestDiffApplyExact: where the update is exact in float32 (Fast2Sum: the
// parent's values are at least the update's in magnitude), Apply of Diff is
// the child bit for bit, and so is the loaded engine's policy.
func TestDiffApplyExact(t *testing.T) {
	e := newEngine(t, nativeDefault)
	pdir, parent := export(t, e)
	// A child made by a small update that leaves zeros (B) alone except
	// where a fixed pattern adds to them.
	upd := &Delta{}
	for _, tn := range parent.Tensors {
		v := make([]float32, len(tn.Data))
		for j, x := range tn.Data {
			v[j] = x * float32(j%7-3) / 64
			if x == 0 && j%5 == 0 {
				v[j] = float32(j%11) * 1e-3
			}
		}
		upd.Tensors = append(upd.Tensors, Tensor{Name: tn.Name, Shape: tn.Shape, Data: v})
	}
	child, err := Apply(parent, upd)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Diff(child, parent)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Apply(parent, d)
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(got.Tensors, child.Tensors) {
		t.Fatalf("Apply(parent, Diff(child, parent)) is not child")
	}
	cdir := filepath.Join(t.TempDir(), "child")
	gdir := filepath.Join(t.TempDir(), "got")
	if err := child.Write(cdir); err != nil {
		t.Fatal(err)
	}
	if err := got.Write(gdir); err != nil {
		t.Fatal(err)
	}
	hc, _ := Hash(cdir)
	hg, _ := Hash(gdir)
	if hc != hg {
		t.Fatalf("hashes differ")
	}
	if err := e.LoadAdapter(ctx, cdir); err != nil {
		t.Fatal(err)
	}
	want := logprobs(t, e)
	if err := e.LoadAdapter(ctx, gdir); err != nil {
		t.Fatal(err)
	}
	if have := logprobs(t, e); !slices.Equal(have, want) {
		t.Fatalf("logprobs %v, want %v", have, want)
	}
	if err := e.LoadAdapter(ctx, pdir); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(logprobs(t, e), want) {
		t.Fatalf("the update does not change the policy")
	}
}

func TestDiffMismatch(t *testing.T) {
	e := newEngine(t, nativeDefault)
	_, parent := export(t, e)
	train(t, e, texts[1], 1, 2)
	_, child := export(t, e)
	targets := []string{"q_proj", "v_proj", "down_proj"}
	for _, tc := range []struct {
		name string
		lc   native.LoRAConfig
	}{
		{"rank", native.LoRAConfig{Rank: 8, Targets: targets}},
		{"alpha", native.LoRAConfig{Rank: 4, Alpha: 4, Targets: targets}},
		{"targets", native.LoRAConfig{Rank: 4, Targets: []string{"q_proj", "k_proj", "down_proj"}}},
	} {
		_, other := export(t, newEngine(t, tc.lc))
		if _, err := Diff(child, other); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: Diff %v", tc.name, err)
		}
		if _, err := Diff(other, parent); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: reverse Diff %v", tc.name, err)
		}
		od, err := Diff(other, other)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Apply(parent, od); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: Apply %v", tc.name, err)
		}
		// Without its parent hash, only the layout is checked: a delta of
		// another alpha goes through (that is what Parent is for).
		od.Parent = ""
		_, err = Apply(parent, od)
		if tc.name == "alpha" && err != nil || tc.name != "alpha" && !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: Apply without parent %v", tc.name, err)
		}
	}
	// A parent exported with null patterns (as older exports wrote) and a
	// child with {} (what PEFT writes) have the same scale.
	oldParent := &Bundle{Config: bytes.Replace(bytes.Replace(parent.Config, []byte(`"rank_pattern": {}`), []byte(`"rank_pattern": null`), 1),
		[]byte(`"alpha_pattern": {}`), []byte(`"alpha_pattern": null`), 1), Tensors: parent.Tensors}
	if bytes.Equal(oldParent.Config, parent.Config) {
		t.Fatalf("no empty patterns in %s", parent.Config)
	}
	if _, err := Diff(child, oldParent); err != nil {
		t.Errorf("Diff against a parent with null patterns: %v", err)
	}
	// A delta applies to its own parent only, unless it names none.
	d, err := Diff(child, parent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(child, d); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Apply to another parent: %v", err)
	}
	d.Parent = ""
	if _, err := Apply(child, d); err != nil {
		t.Fatalf("Apply of an unchecked delta: %v", err)
	}
	d.Parent = "zz"
	if _, err := Apply(parent, d); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Apply with a bad parent hash: %v", err)
	}
	// Overflow is refused, not stored as Inf.
	big := &Bundle{Config: []byte(rankConfig(1)), Tensors: []Tensor{{Name: "x", Shape: []int{1}, Data: []float32{3e38}}}}
	neg := &Bundle{Config: []byte(rankConfig(1)), Tensors: []Tensor{{Name: "x", Shape: []int{1}, Data: []float32{-3e38}}}}
	if _, err := Diff(big, neg); !errors.Is(err, ErrInvalid) {
		t.Fatalf("overflowing Diff: %v", err)
	}
	if _, err := Apply(big, &Delta{Tensors: big.Tensors}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("overflowing Apply: %v", err)
	}
}

func TestDeltaWire(t *testing.T) {
	e := newEngine(t, nativeDefault)
	r := newRound(t, e, 2)
	d := r.deltas[0]
	b, err := d.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalDelta(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if back.Parent != d.Parent || !sameBits(back.Tensors, d.Tensors) || back.Norm() != d.Norm() {
		t.Fatalf("delta changed on the wire")
	}
	if b2, _ := back.MarshalBinary(); !bytes.Equal(b, b2) {
		t.Fatalf("encoding is not deterministic")
	}
	if _, err := UnmarshalDelta(b, Limits{MaxParams: 100}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over MaxParams: %v", err)
	}
	for i := range 64 {
		if _, err := UnmarshalDelta(b[:len(b)*i/64], Limits{}); err == nil {
			t.Fatalf("truncated to %d/64: accepted", i)
		}
	}
	// A bundle's weights are not a delta, nor is a delta with a bad parent.
	ts := []rawTensor{{"x", safetensors.F32, []int{2}, []float32{1, 2}}}
	for _, meta := range []map[string]string{
		{"format": "pt"},
		nil,
		{"format": deltaFormat, "parent": strings.Repeat("A", 64)},
		{"format": deltaFormat, "parent": "abc"},
	} {
		if _, err := UnmarshalDelta(encodeRaw(t, ts, meta), Limits{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("metadata %v: %v", meta, err)
		}
	}
	if _, err := UnmarshalDelta(encodeRaw(t, ts, map[string]string{"format": deltaFormat}), Limits{}); err != nil {
		t.Errorf("delta without parent: %v", err)
	}
	bad := &Delta{Tensors: []Tensor{{Name: "x", Shape: []int{1}, Data: []float32{float32(math.NaN())}}}}
	if _, err := bad.MarshalBinary(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("marshal NaN: %v", err)
	}
}
