package adapter

import (
	"fmt"
	"math"
	"slices"
)

// Delta is a tensor-wise difference between two adapters of the same shape:
// what a trainer peer's training added to the version it started from.
type Delta struct {
	// Parent is the Hash of the bundle the delta was taken from, which is
	// the only bundle Apply adds it to; "" means unchecked.
	Parent string
	// Tensors are sorted by name, as a Bundle's.
	Tensors []Tensor
}

// deltaFormat is the metadata "format" of an encoded delta.
const deltaFormat = "clawmesh-lora-delta/1"

// Validate checks d: tensors as a Bundle's, finite values, and a Parent
// that is "" or a hash as Hash writes it.
func (d *Delta) Validate() error {
	if !validHash(d.Parent) {
		return fmt.Errorf("%w: delta parent %q is not a hex SHA-256", ErrInvalid, d.Parent)
	}
	return checkTensors(d.Tensors, true)
}

func validHash(s string) bool {
	if s == "" {
		return true
	}
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Diff returns child − parent, tensor by tensor, with Parent set to the
// parent's Hash. The bundles must have the same tensor names and shapes and
// the same LoRA rank, alpha and rank/alpha patterns.
//
// Apply(parent, Diff(child, parent)) gives back child bit for bit wherever
// child − parent is exact in float32: always where the parent value is 0
// or the two are within a factor of 2 of each other (Sterbenz), which
// covers a round of small updates from a fresh adapter. Elsewhere float32
// subtraction rounds, and the child comes back within one float32 ulp of
// max(|child|, |child − parent|).
func Diff(child, parent *Bundle) (*Delta, error) {
	if err := child.Validate(); err != nil {
		return nil, fmt.Errorf("child: %w", err)
	}
	ph, err := parent.Hash() // validates parent
	if err != nil {
		return nil, fmt.Errorf("parent: %w", err)
	}
	cc, _ := parseConfig(child.Config)
	pc, _ := parseConfig(parent.Config)
	if !cc.sameScale(pc) {
		return nil, fmt.Errorf("%w: child has r %d alpha %g rslora %v, parent r %d alpha %g rslora %v (or their patterns differ)",
			ErrMismatch, cc.R, cc.LoraAlpha, cc.UseRSLoRA, pc.R, pc.LoraAlpha, pc.UseRSLoRA)
	}
	if why := sameLayout(child.Tensors, parent.Tensors); why != "" {
		return nil, fmt.Errorf("%w: child against parent: %s", ErrMismatch, why)
	}
	d := &Delta{Parent: ph, Tensors: make([]Tensor, len(child.Tensors))}
	for i, c := range child.Tensors {
		p := parent.Tensors[i].Data
		v := make([]float32, len(c.Data))
		for j, x := range c.Data {
			v[j] = x - p[j]
		}
		if j := nonFinite(v); j >= 0 {
			return nil, fmt.Errorf("%w: %s[%d]: %v − %v overflows float32", ErrInvalid, c.Name, j, c.Data[j], p[j])
		}
		d.Tensors[i] = Tensor{Name: c.Name, Shape: slices.Clone(c.Shape), Data: v}
	}
	return d, nil
}

// Apply returns parent + d as a new bundle with the parent's config. The
// delta must have the parent's tensor names and shapes, and its Parent, if
// set, must be the parent's Hash.
func Apply(parent *Bundle, d *Delta) (*Bundle, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("delta: %w", err)
	}
	ph, err := parent.Hash() // validates parent
	if err != nil {
		return nil, fmt.Errorf("parent: %w", err)
	}
	if d.Parent != "" && d.Parent != ph {
		return nil, fmt.Errorf("%w: delta is from %s, parent is %s", ErrMismatch, d.Parent, ph)
	}
	if why := sameLayout(d.Tensors, parent.Tensors); why != "" {
		return nil, fmt.Errorf("%w: delta against parent: %s", ErrMismatch, why)
	}
	out := &Bundle{Config: slices.Clone(parent.Config), Tensors: make([]Tensor, len(parent.Tensors))}
	for i, p := range parent.Tensors {
		dv := d.Tensors[i].Data
		v := make([]float32, len(p.Data))
		for j, x := range p.Data {
			v[j] = x + dv[j]
		}
		if j := nonFinite(v); j >= 0 {
			return nil, fmt.Errorf("%w: %s[%d]: %v + %v overflows float32", ErrInvalid, p.Name, j, p.Data[j], dv[j])
		}
		out.Tensors[i] = Tensor{Name: p.Name, Shape: slices.Clone(p.Shape), Data: v}
	}
	return out, nil
}

// Norm is the global L2 norm of d over all its tensors, computed in
// float64. It is NaN or +Inf if d holds a NaN or an infinity, and finite
// otherwise.
func (d *Delta) Norm() float64 {
	var s float64
	for _, t := range d.Tensors {
		s += sumSquares(t.Data)
	}
	return math.Sqrt(s)
}

func sumSquares(v []float32) float64 {
	// Four partial sums: shorter dependency chains, and slightly less
	// rounding than one.
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b, c, e := float64(v[i]), float64(v[i+1]), float64(v[i+2]), float64(v[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += e * e
	}
	for ; i < len(v); i++ {
		x := float64(v[i])
		s0 += x * x
	}
	return (s0 + s1) + (s2 + s3)
}

// MarshalBinary encodes d for the wire: safetensors with F32 tensors in
// name order and the metadata {"format": "clawmesh-lora-delta/1",
// "parent": Parent}. The same delta always gives the same bytes.
func (d *Delta) MarshalBinary() ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return encodeTensors(d.Tensors, map[string]string{"format": deltaFormat, "parent": d.Parent})
}

// UnmarshalDelta decodes what MarshalBinary encodes, within the limits l
// (zero: defaults). It accepts F32, BF16 and F16 tensors and refuses
// anything else: another format, duplicate names, bytes outside a tensor,
// non-finite values.
func UnmarshalDelta(b []byte, l Limits) (*Delta, error) {
	l, err := l.withDefaults()
	if err != nil {
		return nil, err
	}
	ts, meta, err := decodeTensors(b, l)
	if err != nil {
		return nil, fmt.Errorf("delta: %w", err)
	}
	if meta["format"] != deltaFormat {
		return nil, fmt.Errorf("%w: delta format %q, want %q", ErrInvalid, meta["format"], deltaFormat)
	}
	d := &Delta{Parent: meta["parent"], Tensors: ts}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}
