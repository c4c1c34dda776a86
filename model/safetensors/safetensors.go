// Package safetensors reads and writes the safetensors tensor file format:
// an 8-byte little-endian header length, a JSON header naming every tensor's
// dtype, shape and byte range (plus an optional "__metadata__" string map),
// then the raw little-endian tensor bytes. It also converts between float32
// and the half-precision dtypes (F16, BF16) models are usually shipped in.
//
// Headers arrive from peers (adapter bundles travel over the mesh), so the
// decoder checks every length, offset and shape before trusting it.
package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// MaxHeaderSize bounds the JSON header a decoder accepts (100 MB, as the
// reference implementation does).
const MaxHeaderSize = 100 << 20

// Sentinel errors.
var (
	ErrInvalid  = errors.New("safetensors: invalid file")
	ErrNotFound = errors.New("safetensors: tensor not found")
	ErrDType    = errors.New("safetensors: unsupported dtype")
)

// DType names an element type as the header spells it.
type DType string

const (
	F64  DType = "F64"
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	I64  DType = "I64"
	I32  DType = "I32"
	I16  DType = "I16"
	I8   DType = "I8"
	U8   DType = "U8"
	Bool DType = "BOOL"
)

// Size is the element size in bytes, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16, I16:
		return 2
	case I8, U8, Bool:
		return 1
	}
	return 0
}

// TensorInfo is one header entry. DataOffsets are relative to the start of
// the data section, end exclusive.
type TensorInfo struct {
	DType       DType    `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// Elems is the number of elements the shape holds.
func (t TensorInfo) Elems() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is a decoded header.
type Header struct {
	Metadata map[string]string
	Tensors  map[string]TensorInfo
}

// Names lists the tensor names in data-offset order.
func (h Header) Names() []string {
	names := make([]string, 0, len(h.Tensors))
	for n := range h.Tensors {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := h.Tensors[names[i]], h.Tensors[names[j]]
		if a.DataOffsets[0] != b.DataOffsets[0] {
			return a.DataOffsets[0] < b.DataOffsets[0]
		}
		return names[i] < names[j]
	})
	return names
}

// DecodeHeader parses the JSON header (without the 8-byte length prefix) and
// checks it against a data section of dataLen bytes: known dtypes,
// non-negative shapes whose byte size matches the offsets, offsets inside the
// data, and no two tensors overlapping.
func DecodeHeader(js []byte, dataLen int64) (Header, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(js))
	if err := dec.Decode(&raw); err != nil {
		return Header{}, fmt.Errorf("%w: header: %v", ErrInvalid, err)
	}
	if raw == nil {
		return Header{}, fmt.Errorf("%w: header is not an object", ErrInvalid)
	}
	h := Header{Tensors: make(map[string]TensorInfo, len(raw))}
	for name, v := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(v, &h.Metadata); err != nil {
				return Header{}, fmt.Errorf("%w: __metadata__: %v", ErrInvalid, err)
			}
			continue
		}
		var ti TensorInfo
		if err := json.Unmarshal(v, &ti); err != nil {
			return Header{}, fmt.Errorf("%w: tensor %q: %v", ErrInvalid, name, err)
		}
		if err := checkInfo(ti, dataLen); err != nil {
			return Header{}, fmt.Errorf("%w: tensor %q: %v", ErrInvalid, name, err)
		}
		h.Tensors[name] = ti
	}
	// No overlaps: sorted by start, each must begin at or after the previous end.
	names := h.Names()
	var end int64
	for i, n := range names {
		ti := h.Tensors[n]
		if i > 0 && ti.DataOffsets[0] < end && ti.DataOffsets[1] > ti.DataOffsets[0] {
			return Header{}, fmt.Errorf("%w: tensor %q overlaps another", ErrInvalid, n)
		}
		if ti.DataOffsets[1] > end {
			end = ti.DataOffsets[1]
		}
	}
	return h, nil
}

func checkInfo(ti TensorInfo, dataLen int64) error {
	es := ti.DType.Size()
	if es == 0 {
		return fmt.Errorf("%w %q", ErrDType, ti.DType)
	}
	n := int64(1)
	for _, d := range ti.Shape {
		if d < 0 {
			return fmt.Errorf("negative dimension %d", d)
		}
		if d != 0 && n > math.MaxInt64/8/int64(d) {
			return errors.New("shape overflows")
		}
		n *= int64(d)
	}
	lo, hi := ti.DataOffsets[0], ti.DataOffsets[1]
	if lo < 0 || hi < lo || hi > dataLen {
		return fmt.Errorf("data offsets [%d,%d) outside data of %d bytes", lo, hi, dataLen)
	}
	if hi-lo != n*int64(es) {
		return fmt.Errorf("data offsets span %d bytes, shape needs %d", hi-lo, n*int64(es))
	}
	return nil
}

// File is a safetensors file held in memory.
type File struct {
	Header
	data []byte
}

// Parse decodes a whole safetensors file from b. The returned File refers to b.
func Parse(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the length prefix", ErrInvalid, len(b))
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n > MaxHeaderSize || n > uint64(len(b)-8) {
		return nil, fmt.Errorf("%w: header length %d", ErrInvalid, n)
	}
	h, err := DecodeHeader(b[8:8+n], int64(len(b)-8-int(n)))
	if err != nil {
		return nil, err
	}
	return &File{Header: h, data: b[8+n:]}, nil
}

// ReadFile reads and parses the file at path.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Raw returns a tensor's info and its bytes (aliasing the file's buffer).
func (f *File) Raw(name string) (TensorInfo, []byte, error) {
	ti, ok := f.Tensors[name]
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return ti, f.data[ti.DataOffsets[0]:ti.DataOffsets[1]], nil
}

// Float32 returns a tensor converted to float32 (from F32, F16, BF16 or F64)
// and its shape.
func (f *File) Float32(name string) ([]float32, []int, error) {
	ti, b, err := f.Raw(name)
	if err != nil {
		return nil, nil, err
	}
	out := make([]float32, ti.Elems())
	if err := Decode(out, ti.DType, b); err != nil {
		return nil, nil, fmt.Errorf("%q: %w", name, err)
	}
	return out, ti.Shape, nil
}

// Decode converts little-endian bytes of dtype dt into dst; len(b) must be
// len(dst) elements of dt.
func Decode(dst []float32, dt DType, b []byte) error {
	if dt.Size() == 0 || len(b) != len(dst)*dt.Size() {
		return fmt.Errorf("%w: %s with %d bytes for %d elements", ErrDType, dt, len(b), len(dst))
	}
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
		}
	default:
		return fmt.Errorf("%w: %s is not a float type", ErrDType, dt)
	}
	return nil
}

// Encode converts src to little-endian bytes of dtype dt (F32, F16, BF16 or F64).
func Encode(dt DType, src []float32) ([]byte, error) {
	b := make([]byte, len(src)*dt.Size())
	switch dt {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(v))
		}
	case F64:
		for i, v := range src {
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(float64(v)))
		}
	default:
		return nil, fmt.Errorf("%w: %s", ErrDType, dt)
	}
	return b, nil
}

// Tensor is one tensor to write.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte // little-endian, Elems×DType.Size() bytes
}

// F32Tensor builds a Tensor from float32 values stored as dtype dt.
func F32Tensor(name string, dt DType, shape []int, v []float32) (Tensor, error) {
	b, err := Encode(dt, v)
	if err != nil {
		return Tensor{}, err
	}
	return Tensor{Name: name, DType: dt, Shape: shape, Data: b}, nil
}

// Write writes tensors (in the given order) and metadata in safetensors
// format. The header is padded with spaces to a multiple of 8 bytes.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	hdr := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		if _, dup := hdr[t.Name]; dup || t.Name == "__metadata__" {
			return fmt.Errorf("%w: duplicate tensor name %q", ErrInvalid, t.Name)
		}
		ti := TensorInfo{DType: t.DType, Shape: t.Shape, DataOffsets: [2]int64{off, off + int64(len(t.Data))}}
		if ti.Shape == nil {
			ti.Shape = []int{}
		}
		if err := checkInfo(ti, off+int64(len(t.Data))); err != nil {
			return fmt.Errorf("%w: tensor %q: %v", ErrInvalid, t.Name, err)
		}
		hdr[t.Name] = ti
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var pre [8]byte
	binary.LittleEndian.PutUint64(pre[:], uint64(len(js)))
	if _, err := w.Write(pre[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes tensors to path (via a temporary file renamed into place).
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = Write(bw, tensors, metadata)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// BF16ToF32 widens a bfloat16 bit pattern.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 narrows to bfloat16 with round-to-nearest-even; NaN stays NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and non-zero mantissa
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToF32 widens an IEEE half-precision bit pattern.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: value = man × 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// F32ToF16 narrows to IEEE half precision with round-to-nearest-even;
// overflow becomes ±Inf, NaN stays NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rest := man & (1<<shift - 1)
		v := man >> shift
		if rest > half || (rest == half && v&1 == 1) {
			v++
		}
		return sign | uint16(v)
	}
	v := uint32(e)<<10 | man>>13
	rest := man & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && v&1 == 1) {
		v++ // may carry into the exponent, which is the right rounding
	}
	return sign | uint16(v)
}
