package adapter

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestAggregateIdentical(t *testing.T) {
	e := newEngine(t, nativeDefault)
	r := newRound(t, e, 2)
	d := r.deltas[3]
	parts := r.parts()
	for i := range parts {
		parts[i].Delta = d
	}
	for _, o := range []AggOptions{{}, {Method: TrimmedMean}, {Method: TrimmedMean, Trim: 0.45}} {
		got, rep, err := Aggregate(parts, o)
		if err != nil {
			t.Fatal(err)
		}
		if got.Parent != d.Parent || !sameBits(got.Tensors, d.Tensors) {
			t.Fatalf("%+v: aggregate of identical deltas is not the delta (distance %g)", o, distance(got, d))
		}
		var w float64
		for _, p := range rep.Parts {
			if p.Norm != d.Norm() || p.ClippedTo != p.Norm {
				t.Fatalf("%+v: report %+v", o, p)
			}
			w += p.Weight
		}
		if o.Method == ClippedMean && math.Abs(w-1) > 1e-12 {
			t.Fatalf("weights sum to %v", w)
		}
	}
	// One contribution is passed through, unless MaxNorm clips it.
	one := parts[:1]
	got, _, err := Aggregate(one, AggOptions{})
	if err != nil || !sameBits(got.Tensors, d.Tensors) {
		t.Fatalf("single contribution changed (%v)", err)
	}
	capped, rep, err := Aggregate(one, AggOptions{MaxNorm: d.Norm() / 4})
	if err != nil {
		t.Fatal(err)
	}
	if n := capped.Norm(); math.Abs(n-d.Norm()/4) > 1e-6*n || rep.Bound != d.Norm()/4 {
		t.Fatalf("capped norm %v, bound %v, want %v", n, rep.Bound, d.Norm()/4)
	}
}

// vec is a delta of one tensor "x" with the given values.
func vec(v ...float32) *Delta {
	return &Delta{Tensors: []Tensor{{Name: "x", Shape: []int{len(v)}, Data: v}}}
}

func TestAggregateByHand(t *testing.T) {
	part := func(from string, w float64, d *Delta) Contribution {
		return Contribution{From: from, Weight: w, Delta: d}
	}
	for _, tc := range []struct {
		name    string
		parts   []Contribution
		o       AggOptions
		want    []float64
		bound   float64
		clipped []float64
	}{
		{
			name:  "equal norms, no clipping",
			parts: []Contribution{part("a", 1, vec(1, 0)), part("b", 2, vec(0, 1)), part("c", 3, vec(-1, 0))},
			want:  []float64{-2.0 / 6, 2.0 / 6}, bound: 1, clipped: []float64{1, 1, 1},
		},
		{
			name: "two: the larger is clipped to the smaller",
			// bound 5: (0, 10) → (0, 5); (1·(3, 4) + 3·(0, 5)) / 4
			parts: []Contribution{part("a", 1, vec(3, 4)), part("b", 3, vec(0, 10))},
			want:  []float64{0.75, 4.75}, bound: 5, clipped: []float64{5, 5},
		},
		{
			name: "a zero delta does not set the bound",
			// norms 0 and 5: bound 5, not 0; the zero share still weighs.
			parts: []Contribution{part("a", 1, vec(0, 0)), part("b", 3, vec(3, 4))},
			want:  []float64{9.0 / 4, 12.0 / 4}, bound: 5, clipped: []float64{0, 5},
		},
		{
			name:  "MaxNorm caps the bound",
			parts: []Contribution{part("a", 1, vec(3, 4)), part("b", 3, vec(0, 10))},
			o:     AggOptions{MaxNorm: 2.5},
			want:  []float64{(1*1.5 + 3*0) / 4, (1*2 + 3*2.5) / 4}, bound: 2.5, clipped: []float64{2.5, 2.5},
		},
		{
			name: "lower median of four",
			// norms 1, 2, 4, 8: bound 2
			parts: []Contribution{part("a", 1, vec(1, 0)), part("b", 1, vec(0, 2)), part("c", 1, vec(0, 4)), part("d", 1, vec(-8, 0))},
			want:  []float64{(1 - 2) / 4.0, (2 + 2) / 4.0}, bound: 2, clipped: []float64{1, 2, 2, 2},
		},
		{
			name: "trimmed mean of five drops one at each end, ignoring weights",
			parts: []Contribution{part("a", 1, vec(1, -50)), part("b", 9, vec(2, 0)), part("c", 1, vec(3, 1)),
				part("d", 1, vec(4, 2)), part("e", 1, vec(100, 3))},
			o:    AggOptions{Method: TrimmedMean},
			want: []float64{3, 1}, clipped: []float64{math.Hypot(1, 50), 2, math.Hypot(3, 1), math.Hypot(4, 2), math.Hypot(100, 3)},
		},
		{
			name: "trimmed 0.4 of five is the median",
			parts: []Contribution{part("a", 1, vec(1, 10)), part("b", 1, vec(2, 0)), part("c", 1, vec(3, 1)),
				part("d", 1, vec(4, 2)), part("e", 1, vec(100, 3))},
			o:    AggOptions{Method: TrimmedMean, Trim: 0.4},
			want: []float64{3, 2}, clipped: []float64{math.Hypot(1, 10), 2, math.Hypot(3, 1), math.Hypot(4, 2), math.Hypot(100, 3)},
		},
		{
			name:  "trimmed mean of three is the median",
			parts: []Contribution{part("a", 1, vec(1, 7)), part("b", 5, vec(2, -7)), part("c", 1, vec(30, 0))},
			o:     AggOptions{Method: TrimmedMean},
			want:  []float64{2, 0}, clipped: []float64{math.Hypot(1, 7), math.Hypot(2, 7), 30},
		},
		{
			name:  "trimmed mean of two is the plain mean",
			parts: []Contribution{part("a", 1, vec(1, 7)), part("b", 5, vec(3, -7))},
			o:     AggOptions{Method: TrimmedMean},
			want:  []float64{2, 0}, clipped: []float64{math.Hypot(1, 7), math.Hypot(3, 7)},
		},
		{
			name:  "trimmed mean with MaxNorm clips first",
			parts: []Contribution{part("a", 1, vec(3, 4)), part("b", 1, vec(0, 10)), part("c", 1, vec(0, 1))},
			o:     AggOptions{Method: TrimmedMean, MaxNorm: 2.5},
			// clipped: (1.5, 2), (0, 2.5), (0, 1): medians 0 and 2
			want: []float64{0, 2}, bound: 2.5, clipped: []float64{2.5, 2.5, 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rep, err := Aggregate(tc.parts, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tc.want {
				if math.Abs(float64(got.Tensors[0].Data[i])-w) > 1e-6 {
					t.Fatalf("got %v, want %v", got.Tensors[0].Data, tc.want)
				}
			}
			if math.Abs(rep.Bound-tc.bound) > 1e-12 {
				t.Fatalf("bound %v, want %v", rep.Bound, tc.bound)
			}
			for i, c := range tc.clipped {
				if p := rep.Parts[i]; p.From != tc.parts[i].From || math.Abs(p.ClippedTo-c) > 1e-6 {
					t.Fatalf("part %d: %+v, want clipped to %v", i, p, c)
				}
			}
		})
	}
}

// TestAggregateByzantine replaces one of five real contributions by an
// attack and measures how far the aggregate moves.
func TestAggregateByzantine(t *testing.T) {
	e := newEngine(t, nativeDefault)
	r := newRound(t, e, 3)
	honest := r.parts()
	var norms []float64
	for _, p := range honest {
		norms = append(norms, p.Delta.Norm())
	}
	slices.Sort(norms)
	const bad = 2
	attacks := map[string]*Delta{
		"×1000":          scaled(honest[bad].Delta, 1000),
		"−1000×":         scaled(honest[bad].Delta, -1000),
		"random ±1e30":   randomLike(honest[bad].Delta, 1e30, 1),
		"random ±10":     randomLike(honest[bad].Delta, 10, 2),
		"another's ×1e6": scaled(honest[0].Delta, 1e6),
	}
	for _, method := range []Method{ClippedMean, TrimmedMean} {
		o := AggOptions{Method: method}
		ref, _, err := Aggregate(honest, o)
		if err != nil {
			t.Fatal(err)
		}
		for name, attack := range attacks {
			parts := slices.Clone(honest)
			parts[bad].Delta = attack
			got, rep, err := Aggregate(parts, o)
			if err != nil {
				t.Fatal(err)
			}
			moved := distance(got, ref)
			t.Logf("%v, %s: moved %.4g (honest norms %.4g to %.4g, aggregate norm %.4g, bound %.4g)",
				method, name, moved, norms[0], norms[len(norms)-1], ref.Norm(), rep.Bound)
			switch method {
			case ClippedMean:
				// The bound is an honest norm, the attack is clipped to
				// it, and the result moves by less than the bound.
				if rep.Bound < norms[0] || rep.Bound > norms[len(norms)-1] {
					t.Errorf("%s: bound %v outside the honest norms %v", name, rep.Bound, norms)
				}
				if rep.Parts[bad].ClippedTo != rep.Bound {
					t.Errorf("%s: attack clipped to %v, bound %v", name, rep.Parts[bad].ClippedTo, rep.Bound)
				}
				if moved > rep.Bound {
					t.Errorf("%s: moved %v, more than the bound %v", name, moved, rep.Bound)
				}
			case TrimmedMean:
				// With one value trimmed at each end, every coordinate stays
				// between the smallest and largest honest values there, so
				// the move is of the order of the honest spread, whatever
				// the attack's size.
				for ti, tn := range got.Tensors {
					for j, x := range tn.Data {
						lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
						for i, p := range honest {
							if i != bad {
								lo, hi = min(lo, p.Delta.Tensors[ti].Data[j]), max(hi, p.Delta.Tensors[ti].Data[j])
							}
						}
						if x < lo || x > hi {
							t.Fatalf("%s: %s[%d] = %v outside the honest [%v, %v]", name, tn.Name, j, x, lo, hi)
						}
					}
				}
				if moved > norms[len(norms)/2] {
					t.Errorf("%s: moved %v, more than the median honest norm %v", name, moved, norms[len(norms)/2])
				}
			}
		}
	}
}

func TestAggregateErrors(t *testing.T) {
	good := func() []Contribution {
		return []Contribution{
			{From: "alice", Weight: 1, Delta: vec(1, 2)},
			{From: "bob", Weight: 2, Delta: vec(3, 4)},
			{From: "carol", Weight: 3, Delta: vec(5, 6)},
		}
	}
	other := &Delta{Parent: strings.Repeat("ab", 32), Tensors: vec(1, 2).Tensors}
	for _, tc := range []struct {
		name string
		edit func([]Contribution) []Contribution
		o    AggOptions
		want error
		who  string
	}{
		{"no contributions", func([]Contribution) []Contribution { return nil }, AggOptions{}, ErrInvalid, ""},
		{"zero weight", func(p []Contribution) []Contribution { p[1].Weight = 0; return p }, AggOptions{}, ErrInvalid, "bob"},
		{"negative weight", func(p []Contribution) []Contribution { p[2].Weight = -1; return p }, AggOptions{}, ErrInvalid, "carol"},
		{"NaN weight", func(p []Contribution) []Contribution { p[0].Weight = math.NaN(); return p }, AggOptions{}, ErrInvalid, "alice"},
		{"infinite weight", func(p []Contribution) []Contribution { p[1].Weight = math.Inf(1); return p }, AggOptions{}, ErrInvalid, "bob"},
		{"no delta", func(p []Contribution) []Contribution { p[2].Delta = nil; return p }, AggOptions{}, ErrInvalid, "carol"},
		{"NaN value", func(p []Contribution) []Contribution { p[1].Delta = vec(1, float32(math.NaN())); return p }, AggOptions{}, ErrInvalid, "bob"},
		{"NaN value, trimmed", func(p []Contribution) []Contribution { p[1].Delta = vec(1, float32(math.NaN())); return p }, AggOptions{Method: TrimmedMean}, ErrInvalid, "bob"},
		{"infinite value", func(p []Contribution) []Contribution { p[2].Delta = vec(float32(math.Inf(-1)), 1); return p }, AggOptions{}, ErrInvalid, "carol"},
		{"shape", func(p []Contribution) []Contribution { p[1].Delta = vec(1, 2, 3); return p }, AggOptions{}, ErrMismatch, "bob"},
		{"shape, same size", func(p []Contribution) []Contribution {
			p[2].Delta = &Delta{Tensors: []Tensor{{Name: "x", Shape: []int{1, 2}, Data: []float32{1, 2}}}}
			return p
		}, AggOptions{}, ErrMismatch, "carol"},
		{"name", func(p []Contribution) []Contribution {
			p[1].Delta = &Delta{Tensors: []Tensor{{Name: "y", Shape: []int{2}, Data: []float32{1, 2}}}}
			return p
		}, AggOptions{}, ErrMismatch, "bob"},
		{"data shorter than shape", func(p []Contribution) []Contribution {
			p[1].Delta = &Delta{Tensors: []Tensor{{Name: "x", Shape: []int{2}, Data: []float32{1}}}}
			return p
		}, AggOptions{}, ErrInvalid, "bob"},
		{"parent", func(p []Contribution) []Contribution { p[2].Delta = other; return p }, AggOptions{}, ErrMismatch, "carol"},
		{"twice from one", func(p []Contribution) []Contribution { p[2].From = "alice"; return p }, AggOptions{}, ErrInvalid, "alice"},
		{"method", func(p []Contribution) []Contribution { return p }, AggOptions{Method: 7}, ErrInvalid, ""},
		{"MaxNorm", func(p []Contribution) []Contribution { return p }, AggOptions{MaxNorm: -1}, ErrInvalid, ""},
		{"Trim", func(p []Contribution) []Contribution { return p }, AggOptions{Trim: 0.5}, ErrInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Aggregate(tc.edit(good()), tc.o)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), `"`+tc.who+`"`) && tc.who != "" {
				t.Fatalf("got %v, want %v naming %q", err, tc.want, tc.who)
			}
		})
	}
	if _, _, err := Aggregate(good(), AggOptions{}); err != nil {
		t.Fatalf("good contributions: %v", err)
	}
}

func TestAggReportLogValue(t *testing.T) {
	_, rep, err := Aggregate([]Contribution{{From: "a", Weight: 1, Delta: vec(3, 4)}, {From: "b", Weight: 1, Delta: vec(0, 10)}}, AggOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("round", "agg", rep)
	if s := buf.String(); !strings.Contains(s, "agg.method=clipped-mean") || !strings.Contains(s, "agg.b.clipped_to=5") {
		t.Fatalf("log line %s", s)
	}
}
