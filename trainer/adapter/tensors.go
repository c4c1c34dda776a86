package adapter

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// checkTensors checks that ts are sorted by unique names that safetensors
// can carry, that each shape matches its data, and (if finite) that every
// value is finite.
func checkTensors(ts []Tensor, finite bool) error {
	for i, t := range ts {
		if t.Name == "" || t.Name == "__metadata__" {
			return fmt.Errorf("%w: tensor %d is named %q", ErrInvalid, i, t.Name)
		}
		if i > 0 && ts[i-1].Name >= t.Name {
			return fmt.Errorf("%w: tensors not sorted by unique names at %q, %q", ErrInvalid, ts[i-1].Name, t.Name)
		}
		n, ok := elems(t.Shape)
		if !ok || n != len(t.Data) {
			return fmt.Errorf("%w: %s has shape %v and %d values", ErrInvalid, t.Name, t.Shape, len(t.Data))
		}
		if finite {
			if j := nonFinite(t.Data); j >= 0 {
				return fmt.Errorf("%w: %s[%d] is %v", ErrInvalid, t.Name, j, t.Data[j])
			}
		}
	}
	return nil
}

// elems is the element count of shape; false for a negative dimension or
// a count over MaxInt32 elements per tensor.
func elems(shape []int) (int, bool) {
	n := 1
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt32/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// nonFinite returns the index of the first NaN or ±Inf in v, or -1.
func nonFinite(v []float32) int {
	for i, x := range v {
		// The exponent is all ones for NaN and Inf alone.
		if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
			return i
		}
	}
	return -1
}

// sameLayout reports where a and b differ in names or shapes, or "".
func sameLayout(a, b []Tensor) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d tensors against %d", len(a), len(b))
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return fmt.Sprintf("tensor %q against %q", a[i].Name, b[i].Name)
		}
		if !slices.Equal(a[i].Shape, b[i].Shape) {
			return fmt.Sprintf("%s has shape %v against %v", a[i].Name, a[i].Shape, b[i].Shape)
		}
	}
	return ""
}

// encodeTensors writes ts (already checked) as F32 safetensors in their
// order. The header is JSON with sorted keys, so the bytes depend on the
// tensors alone.
func encodeTensors(ts []Tensor, meta map[string]string) ([]byte, error) {
	size := 0
	st := make([]safetensors.Tensor, len(ts))
	for i, t := range ts {
		data, err := safetensors.Encode(safetensors.F32, t.Data)
		if err != nil {
			return nil, err
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		st[i] = safetensors.Tensor{Name: t.Name, DType: safetensors.F32, Shape: shape, Data: data}
		size += len(data)
	}
	var buf bytes.Buffer
	buf.Grow(size + 64*len(ts) + 64)
	if err := safetensors.Write(&buf, st, meta); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeTensors parses safetensors bytes from a peer within l (defaults
// applied): duplicate names, data outside any tensor, dtypes other than
// F32, BF16 and F16, and non-finite values are refused. The tensors come
// back sorted by name.
func decodeTensors(b []byte, l Limits) ([]Tensor, map[string]string, error) {
	if int64(len(b)) > l.maxWeightsBytes() {
		return nil, nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(b))
	}
	if len(b) < 8 {
		return nil, nil, fmt.Errorf("%w: %d bytes, shorter than the length prefix", ErrInvalid, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(l.MaxHeaderBytes) {
		return nil, nil, fmt.Errorf("%w: header of %d bytes", ErrTooLarge, n)
	}
	if n > uint64(len(b)-8) {
		return nil, nil, fmt.Errorf("%w: header of %d bytes in %d", ErrInvalid, n, len(b))
	}
	js, data := b[8:8+n], b[8+n:]
	// encoding/json keeps the last of duplicate keys: find them first.
	if err := checkKeys(js, l.MaxTensors+1); err != nil {
		return nil, nil, err
	}
	h, err := safetensors.DecodeHeader(js, int64(len(data)))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(h.Tensors) > l.MaxTensors {
		return nil, nil, fmt.Errorf("%w: %d tensors", ErrTooLarge, len(h.Tensors))
	}
	var total, covered int64
	for name, ti := range h.Tensors {
		switch ti.DType {
		case safetensors.F32, safetensors.BF16, safetensors.F16:
		default:
			return nil, nil, fmt.Errorf("%w: %s has dtype %s, want F32, BF16 or F16", ErrInvalid, name, ti.DType)
		}
		// DecodeHeader checked that the offsets span exactly the shape's
		// bytes inside data, so the count cannot overflow.
		total += int64(ti.Elems())
		covered += ti.DataOffsets[1] - ti.DataOffsets[0]
	}
	if total > l.MaxParams {
		return nil, nil, fmt.Errorf("%w: %d parameters", ErrTooLarge, total)
	}
	// Tensors do not overlap (DecodeHeader), so this means no gaps.
	if covered != int64(len(data)) {
		return nil, nil, fmt.Errorf("%w: %d of %d data bytes outside any tensor", ErrInvalid, int64(len(data))-covered, len(data))
	}
	names := make([]string, 0, len(h.Tensors))
	for name := range h.Tensors {
		names = append(names, name)
	}
	slices.Sort(names)
	ts := make([]Tensor, len(names))
	for i, name := range names {
		ti := h.Tensors[name]
		if _, ok := elems(ti.Shape); !ok {
			return nil, nil, fmt.Errorf("%w: %s has shape %v", ErrTooLarge, name, ti.Shape)
		}
		v := make([]float32, ti.Elems())
		if err := safetensors.Decode(v, ti.DType, data[ti.DataOffsets[0]:ti.DataOffsets[1]]); err != nil {
			return nil, nil, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
		}
		ts[i] = Tensor{Name: name, Shape: slices.Clone(ti.Shape), Data: v}
	}
	if err := checkTensors(ts, true); err != nil {
		return nil, nil, err
	}
	return ts, h.Metadata, nil
}

// checkKeys checks that js is one JSON object, with nothing but space
// after it, with at most max unique keys.
func checkKeys(js []byte, max int) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("%w: header is not a JSON object", ErrInvalid)
	}
	seen := make(map[string]bool)
	for i := 0; dec.More(); i++ {
		if i >= max {
			return fmt.Errorf("%w: header has over %d entries", ErrTooLarge, max)
		}
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: header: %v", ErrInvalid, err)
		}
		key, _ := tok.(string) // an object's key is always a string
		if seen[key] {
			return fmt.Errorf("%w: header names %q twice", ErrInvalid, key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("%w: header: %v", ErrInvalid, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return fmt.Errorf("%w: header: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: data after the header object", ErrInvalid)
	}
	return nil
}
