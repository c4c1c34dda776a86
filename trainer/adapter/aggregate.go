package adapter

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
)

// Method is an aggregation rule.
type Method int

const (
	// ClippedMean (the default) is the sample-weighted mean of the deltas
	// after clipping each one's global norm to the round's bound: the
	// lower median of the contributions' norms, capped by MaxNorm.
	ClippedMean Method = iota
	// TrimmedMean is the unweighted coordinate-wise mean after dropping,
	// at every coordinate, the Trim fraction of largest and of smallest
	// values (at least one each when there are three contributions or
	// more; with fewer, the plain mean).
	TrimmedMean
)

func (m Method) String() string {
	switch m {
	case ClippedMean:
		return "clipped-mean"
	case TrimmedMean:
		return "trimmed-mean"
	}
	return fmt.Sprintf("Method(%d)", int(m))
}

// AggOptions configure Aggregate. The zero value is the clipped mean with
// no cap.
type AggOptions struct {
	// Method is the rule (default ClippedMean).
	Method Method
	// MaxNorm > 0 caps every contribution's global norm: in ClippedMean it
	// caps the round's bound; in TrimmedMean contributions are clipped to
	// it before trimming. 0: no cap.
	MaxNorm float64
	// Trim is the fraction of contributions TrimmedMean drops at each end
	// of every coordinate, rounded down, in [0, 0.5) (default 0.2).
	Trim float64
}

// DefaultTrim is AggOptions.Trim's default.
const DefaultTrim = 0.2

func (o AggOptions) withDefaults() AggOptions {
	if o.Trim == 0 {
		o.Trim = DefaultTrim
	}
	return o
}

// Validate checks o (after defaults).
func (o AggOptions) Validate() error {
	d := o.withDefaults()
	switch {
	case d.Method != ClippedMean && d.Method != TrimmedMean:
		return fmt.Errorf("%w: aggregation method %v", ErrInvalid, d.Method)
	case !(d.MaxNorm >= 0) || math.IsInf(d.MaxNorm, 0):
		return fmt.Errorf("%w: MaxNorm %v", ErrInvalid, o.MaxNorm)
	case !(d.Trim >= 0 && d.Trim < 0.5):
		return fmt.Errorf("%w: Trim %v outside [0, 0.5)", ErrInvalid, o.Trim)
	}
	return nil
}

// Contribution is one trainer's delta for a round.
type Contribution struct {
	// From names the contributor in errors and in the report; names are
	// unique within a round.
	From string
	// Weight is the number of samples the contributor trained on. It
	// should be what the leader assigned, not what the contributor says.
	Weight float64
	Delta  *Delta
}

// AggReport says what Aggregate did.
type AggReport struct {
	Method Method
	// Bound is the norm every contribution was clipped to (0: none, which
	// is TrimmedMean without MaxNorm).
	Bound float64
	// Trimmed is how many values TrimmedMean dropped at each end of every
	// coordinate.
	Trimmed int
	// Parts are in the order of the contributions.
	Parts []PartReport
}

// PartReport is one contribution's part in an aggregate.
type PartReport struct {
	From string
	// Norm is the delta's global norm as sent, ClippedTo its norm after
	// clipping (equal when it was not clipped).
	Norm, ClippedTo float64
	// Weight is the factor its clipped delta was multiplied by: its share
	// of the total weight in ClippedMean; in TrimmedMean 1/(values kept
	// per coordinate), applied where its value was not trimmed.
	Weight float64
}

// LogValue logs the report compactly.
func (r AggReport) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("method", r.Method.String()), slog.Float64("bound", r.Bound)}
	if r.Method == TrimmedMean {
		attrs = append(attrs, slog.Int("trimmed", r.Trimmed))
	}
	for _, p := range r.Parts {
		attrs = append(attrs, slog.Group(p.From, "norm", p.Norm, "clipped_to", p.ClippedTo, "weight", p.Weight))
	}
	return slog.GroupValue(attrs...)
}

// Aggregate combines the deltas of one round (see Method) into one delta
// with their common Parent. Every contribution must have a unique From, a
// finite positive Weight, and a valid delta with the same Parent, tensor
// names and shapes as the others; otherwise the error names the first
// contributor at fault.
//
// With ClippedMean a contributor's term in the mean has a norm of at most
// its weight share times the bound, whatever it sent, and the bound, being
// a lower median (of the non-zero norms: a zero delta carries no signal and
// does not set the bound), stays between the norms of honest contributions
// while more than half are honest. With one contribution the result is its
// delta. With TrimmedMean and at most Trimmed bad contributions, every
// coordinate of the result lies between the honest values there.
func Aggregate(parts []Contribution, o AggOptions) (*Delta, AggReport, error) {
	if err := o.Validate(); err != nil {
		return nil, AggReport{}, err
	}
	o = o.withDefaults()
	if len(parts) == 0 {
		return nil, AggReport{}, fmt.Errorf("%w: no contributions", ErrInvalid)
	}
	norms, err := checkParts(parts)
	if err != nil {
		return nil, AggReport{}, err
	}
	rep := AggReport{Method: o.Method, Parts: make([]PartReport, len(parts))}
	// Clip bound.
	bound := math.Inf(1)
	if o.Method == ClippedMean {
		// A zero delta (a share with no learning signal in it) says
		// nothing about the scale of the others: counted, it would make
		// the lower median 0 and cancel the round.
		var sorted []float64
		for _, n := range norms {
			if n > 0 {
				sorted = append(sorted, n)
			}
		}
		slices.Sort(sorted)
		if len(sorted) > 0 {
			bound = sorted[(len(sorted)-1)/2]
		}
	}
	if o.MaxNorm > 0 && o.MaxNorm < bound {
		bound = o.MaxNorm
	}
	if !math.IsInf(bound, 1) {
		rep.Bound = bound
	}
	scale := make([]float64, len(parts))
	for i, n := range norms {
		scale[i] = 1
		rep.Parts[i] = PartReport{From: parts[i].From, Norm: n, ClippedTo: n}
		if n > bound {
			scale[i] = bound / n
			rep.Parts[i].ClippedTo = bound
		}
	}
	ref := parts[0].Delta
	out := &Delta{Parent: ref.Parent, Tensors: make([]Tensor, len(ref.Tensors))}
	for i, t := range ref.Tensors {
		out.Tensors[i] = Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Data: make([]float32, len(t.Data))}
	}
	switch o.Method {
	case ClippedMean:
		var total float64
		for _, p := range parts {
			total += p.Weight
		}
		coef := make([]float64, len(parts))
		for i, p := range parts {
			rep.Parts[i].Weight = p.Weight / total
			coef[i] = rep.Parts[i].Weight * scale[i]
		}
		weightedSum(out, parts, coef)
	case TrimmedMean:
		k := len(parts)
		t := 0
		if k >= 3 {
			t = max(1, min(int(o.Trim*float64(k)), (k-1)/2))
		}
		rep.Trimmed = t
		for i := range parts {
			rep.Parts[i].Weight = 1 / float64(k-2*t)
		}
		trimmedMean(out, parts, scale, t)
	}
	return out, rep, nil
}

// checkParts checks the contributions and returns their norms.
func checkParts(parts []Contribution) ([]float64, error) {
	ref := parts[0].Delta
	seen := make(map[string]bool, len(parts))
	norms := make([]float64, len(parts))
	for i, p := range parts {
		fail := func(err error, format string, args ...any) error {
			return fmt.Errorf("%w: contribution %d from %q: %s", err, i, p.From, fmt.Sprintf(format, args...))
		}
		switch {
		case seen[p.From]:
			return nil, fail(ErrInvalid, "a second contribution from the same contributor")
		case !(p.Weight > 0) || math.IsInf(p.Weight, 0):
			return nil, fail(ErrInvalid, "weight %v", p.Weight)
		case p.Delta == nil || ref == nil:
			return nil, fail(ErrInvalid, "no delta")
		case p.Delta.Parent != ref.Parent:
			return nil, fail(ErrMismatch, "delta from parent %q, the first from %q", p.Delta.Parent, ref.Parent)
		}
		seen[p.From] = true
		if !validHash(p.Delta.Parent) {
			return nil, fail(ErrInvalid, "parent %q is not a hex SHA-256", p.Delta.Parent)
		}
		// Values are checked below, through the norm.
		if err := checkTensors(p.Delta.Tensors, false); err != nil {
			return nil, fail(ErrInvalid, "%v", err)
		}
		if why := sameLayout(p.Delta.Tensors, ref.Tensors); why != "" {
			return nil, fail(ErrMismatch, "%s", why)
		}
		// A sum of squares of float32 values is finite in float64 unless
		// one of them is NaN or infinite.
		norms[i] = p.Delta.Norm()
		if math.IsNaN(norms[i]) || math.IsInf(norms[i], 0) {
			for _, t := range p.Delta.Tensors {
				if j := nonFinite(t.Data); j >= 0 {
					return nil, fail(ErrInvalid, "%s[%d] is %v", t.Name, j, t.Data[j])
				}
			}
		}
	}
	return norms, nil
}

// block is how many coordinates the aggregation loops hold at once, so
// that their float64 accumulators stay in the L1 cache.
const block = 2048

// weightedSum sets out to Σ coef[i]·parts[i], accumulating in float64.
func weightedSum(out *Delta, parts []Contribution, coef []float64) {
	var acc [block]float64
	for ti := range out.Tensors {
		dst := out.Tensors[ti].Data
		for lo := 0; lo < len(dst); lo += block {
			hi := min(lo+block, len(dst))
			a := acc[:hi-lo]
			clear(a)
			for i, p := range parts {
				c := coef[i]
				src := p.Delta.Tensors[ti].Data[lo:hi]
				for j, x := range src {
					a[j] += c * float64(x)
				}
			}
			for j, v := range a {
				dst[lo+j] = float32(v)
			}
		}
	}
}

// trimmedMean sets out to the coordinate-wise mean of scale[i]·parts[i]
// without the t smallest and t largest values at each coordinate.
//
// It works a block of coordinates at a time, one row per contribution, and
// trims with compare-exchanges between whole rows (min to one, max to the
// other): t passes carry the largest values to the last rows, t passes the
// smallest to the first, and the rows between hold the values kept. That
// costs about 2·t·k min/max pairs a coordinate, with no data-dependent
// branches. Only the kept values are summed: subtracting the extremes from
// a total would lose the honest values to rounding next to a huge one.
func trimmedMean(out *Delta, parts []Contribution, scale []float64, t int) {
	k := len(parts)
	buf := make([]float64, k*block)
	rows := make([][]float64, k)
	n := float64(k - 2*t)
	for ti := range out.Tensors {
		dst := out.Tensors[ti].Data
		for lo := 0; lo < len(dst); lo += block {
			hi := min(lo+block, len(dst))
			for i, p := range parts {
				r := buf[i*block : i*block+hi-lo]
				c := scale[i]
				for j, x := range p.Delta.Tensors[ti].Data[lo:hi] {
					r[j] = c * float64(x)
				}
				rows[i] = r
			}
			for p := range t {
				for i := 0; i < k-1-p; i++ {
					compareExchange(rows[i], rows[i+1])
				}
			}
			for p := range t {
				for i := k - t - 2; i >= p; i-- {
					compareExchange(rows[i], rows[i+1])
				}
			}
			acc := rows[t]
			for _, r := range rows[t+1 : k-t] {
				r = r[:len(acc)]
				for j, v := range r {
					acc[j] += v
				}
			}
			for j, v := range acc {
				dst[lo+j] = float32(v / n)
			}
		}
	}
}

// compareExchange leaves the smaller of a[j], b[j] in a and the larger in
// b, at every j.
func compareExchange(a, b []float64) {
	b = b[:len(a)]
	for j, x := range a {
		y := b[j]
		a[j], b[j] = min(x, y), max(x, y)
	}
}
