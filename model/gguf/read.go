package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Format constants (gguf.h).
const (
	// Magic opens every GGUF file.
	Magic = "GGUF"
	// Version is the version Write writes; Read accepts 2 and 3, which
	// differ only in what version 1 lacked.
	Version = 3
	// DefaultAlignment is the data alignment when general.alignment is absent.
	DefaultAlignment = 32
	// MaxDims is ggml's GGML_MAX_DIMS.
	MaxDims = 4
	// MaxNameLen is the longest tensor name ggml holds (GGML_MAX_NAME − 1).
	MaxNameLen = 63
	// KeyAlignment is the metadata key of the data alignment (a uint32).
	KeyAlignment = "general.alignment"
)

// Sentinel errors.
var (
	// ErrInvalid reports a file that is not well-formed GGUF.
	ErrInvalid = errors.New("gguf: invalid file")
	// ErrNotFound reports a tensor or key the file lacks.
	ErrNotFound = errors.New("gguf: not found")
	// ErrType reports a tensor or value of another type than asked.
	ErrType = errors.New("gguf: wrong type")
)

// TensorInfo describes one tensor. Shape is in ggml's order, the fastest
// varying dimension first: a PyTorch [out, in] weight is Shape {in, out}.
type TensorInfo struct {
	Name  string
	Shape []uint64
	Type  TensorType
	// Offset is where the tensor's data starts, from the start of the data
	// section.
	Offset uint64
}

// Elems is the number of elements.
func (ti TensorInfo) Elems() uint64 {
	n := uint64(1)
	for _, d := range ti.Shape {
		n *= d
	}
	return n
}

// Size is the number of bytes of the tensor's data.
func (ti TensorInfo) Size() uint64 {
	n, _ := rowBytes(ti.Type, ti.Shape)
	return n
}

// File is a decoded GGUF file: its metadata and tensor infos, and the
// reader its tensor data is read from.
type File struct {
	Version   uint32
	KV        []KV
	Tensors   []TensorInfo
	Alignment uint64
	// DataOffset is the file offset of the data section.
	DataOffset int64

	r      io.ReaderAt
	size   int64
	closer io.Closer
	keys   map[string]int
	names  map[string]int
}

// counter reads the header sequentially, knows its position, and refuses
// any length that runs past the end of the file before allocating for it.
type counter struct {
	br   *bufio.Reader
	pos  int64
	size int64
	buf  [8]byte
}

func (c *counter) fail(format string, a ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrInvalid, c.pos, fmt.Sprintf(format, a...))
}

func (c *counter) left() uint64 { return uint64(c.size - c.pos) }

func (c *counter) read(b []byte) error {
	if uint64(len(b)) > c.left() {
		return c.fail("%d bytes past the end of the file", uint64(len(b))-c.left())
	}
	if _, err := io.ReadFull(c.br, b); err != nil {
		return c.fail("%v", err)
	}
	c.pos += int64(len(b))
	return nil
}

func (c *counter) u8() (uint8, error) {
	err := c.read(c.buf[:1])
	return c.buf[0], err
}

func (c *counter) u16() (uint16, error) {
	err := c.read(c.buf[:2])
	return binary.LittleEndian.Uint16(c.buf[:2]), err
}

func (c *counter) u32() (uint32, error) {
	err := c.read(c.buf[:4])
	return binary.LittleEndian.Uint32(c.buf[:4]), err
}

func (c *counter) u64() (uint64, error) {
	err := c.read(c.buf[:8])
	return binary.LittleEndian.Uint64(c.buf[:8]), err
}

func (c *counter) str() (string, error) {
	n, err := c.u64()
	if err != nil {
		return "", err
	}
	if n > c.left() {
		return "", c.fail("string of %d bytes past the end of the file", n)
	}
	b := make([]byte, n)
	if err := c.read(b); err != nil {
		return "", err
	}
	return string(b), nil
}

// count reads an element count and checks that n elements of at least
// min bytes each fit in the rest of the file.
func (c *counter) count(what string, min uint64) (uint64, error) {
	n, err := c.u64()
	if err != nil {
		return 0, err
	}
	if min > 0 && n > c.left()/min {
		return 0, c.fail("%d %s cannot fit in the %d bytes left", n, what, c.left())
	}
	return n, nil
}

// maxDepth bounds nested arrays (gguf.cpp allows none; gguf-py writes them).
const maxDepth = 8

func (c *counter) value(t ValueType, depth int) (any, error) {
	switch t {
	case ValueUint8:
		return c.u8()
	case ValueInt8:
		v, err := c.u8()
		return int8(v), err
	case ValueUint16:
		return c.u16()
	case ValueInt16:
		v, err := c.u16()
		return int16(v), err
	case ValueUint32:
		return c.u32()
	case ValueInt32:
		v, err := c.u32()
		return int32(v), err
	case ValueFloat32:
		v, err := c.u32()
		return math.Float32frombits(v), err
	case ValueBool:
		v, err := c.u8()
		if err == nil && v > 1 {
			return nil, c.fail("bool of value %d", v)
		}
		return v == 1, err
	case ValueString:
		return c.str()
	case ValueUint64:
		return c.u64()
	case ValueInt64:
		v, err := c.u64()
		return int64(v), err
	case ValueFloat64:
		v, err := c.u64()
		return math.Float64frombits(v), err
	case ValueArray:
		if depth >= maxDepth {
			return nil, c.fail("arrays nested deeper than %d", maxDepth)
		}
		et, err := c.u32()
		if err != nil {
			return nil, err
		}
		elem := ValueType(et)
		if elem.size() == 0 {
			return nil, c.fail("array of unknown type %d", et)
		}
		n, err := c.count("array elements", elem.size())
		if err != nil {
			return nil, err
		}
		return c.array(elem, int(n), depth+1)
	}
	return nil, c.fail("unknown value type %d", uint32(t))
}

func readN[T any](c *counter, n int, depth int, t ValueType) ([]T, error) {
	out := make([]T, n)
	for i := range out {
		v, err := c.value(t, depth)
		if err != nil {
			return nil, err
		}
		out[i] = v.(T)
	}
	return out, nil
}

func (c *counter) array(t ValueType, n, depth int) (Array, error) {
	a := Array{Elem: t}
	var err error
	switch t {
	case ValueUint8:
		a.Values, err = readN[uint8](c, n, depth, t)
	case ValueInt8:
		a.Values, err = readN[int8](c, n, depth, t)
	case ValueUint16:
		a.Values, err = readN[uint16](c, n, depth, t)
	case ValueInt16:
		a.Values, err = readN[int16](c, n, depth, t)
	case ValueUint32:
		a.Values, err = readN[uint32](c, n, depth, t)
	case ValueInt32:
		a.Values, err = readN[int32](c, n, depth, t)
	case ValueFloat32:
		a.Values, err = readN[float32](c, n, depth, t)
	case ValueBool:
		a.Values, err = readN[bool](c, n, depth, t)
	case ValueString:
		a.Values, err = readN[string](c, n, depth, t)
	case ValueUint64:
		a.Values, err = readN[uint64](c, n, depth, t)
	case ValueInt64:
		a.Values, err = readN[int64](c, n, depth, t)
	case ValueFloat64:
		a.Values, err = readN[float64](c, n, depth, t)
	case ValueArray:
		a.Values, err = readN[Array](c, n, depth, t)
	}
	return a, err
}

// Read decodes the GGUF file of size bytes that r holds. Every count,
// length and offset is checked against the file's size before anything is
// allocated for it, and the tensor infos as gguf.cpp checks them (known
// types, at most MaxDims dimensions, rows of whole blocks, names unique
// and shorter than 64 bytes, tensors packed in order at the alignment,
// all data inside the file). Tensor data is read on demand.
func Read(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: size %d", ErrInvalid, size)
	}
	c := &counter{br: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 1<<16), size: size}
	var magic [4]byte
	if err := c.read(magic[:]); err != nil {
		return nil, err
	}
	if string(magic[:]) != Magic {
		return nil, fmt.Errorf("%w: magic %q is not %q", ErrInvalid, magic[:], Magic)
	}
	f := &File{r: r, size: size, keys: map[string]int{}, names: map[string]int{}}
	var err error
	if f.Version, err = c.u32(); err != nil {
		return nil, err
	}
	if f.Version != 2 && f.Version != 3 {
		if f.Version&0xffff == 0 {
			return nil, fmt.Errorf("%w: version %#x: a big-endian file", ErrInvalid, f.Version)
		}
		return nil, fmt.Errorf("%w: version %d (2 and 3 are read)", ErrInvalid, f.Version)
	}
	// A tensor info is at least a name length, a dimension count, one
	// dimension, a type and an offset; a key-value pair a key length, a
	// type and one byte.
	nt, err := c.count("tensors", 8+4+8+4+8)
	if err != nil {
		return nil, err
	}
	nkv, err := c.count("key-value pairs", 8+4+1)
	if err != nil {
		return nil, err
	}
	f.KV = make([]KV, 0, nkv)
	for range nkv {
		key, err := c.str()
		if err != nil {
			return nil, err
		}
		if _, dup := f.keys[key]; dup {
			return nil, c.fail("duplicate key %q", key)
		}
		t, err := c.u32()
		if err != nil {
			return nil, err
		}
		v, err := c.value(ValueType(t), 0)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		f.keys[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.Get(KeyAlignment); ok {
		a, isU32 := v.(uint32)
		if !isU32 {
			return nil, fmt.Errorf("%w: %s is a %T, not a uint32", ErrInvalid, KeyAlignment, v)
		}
		if a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("%w: alignment %d is not a power of 2", ErrInvalid, a)
		}
		f.Alignment = uint64(a)
	}
	f.Tensors = make([]TensorInfo, 0, nt)
	var want uint64 // the offset the next tensor must have
	for range nt {
		var ti TensorInfo
		if ti.Name, err = c.str(); err != nil {
			return nil, err
		}
		if len(ti.Name) > MaxNameLen {
			return nil, c.fail("tensor name %q longer than %d bytes", ti.Name, MaxNameLen)
		}
		if _, dup := f.names[ti.Name]; dup {
			return nil, c.fail("duplicate tensor %q", ti.Name)
		}
		nd, err := c.u32()
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > MaxDims {
			return nil, c.fail("tensor %q has %d dimensions (1 to %d)", ti.Name, nd, MaxDims)
		}
		ti.Shape = make([]uint64, nd)
		for i := range ti.Shape {
			if ti.Shape[i], err = c.u64(); err != nil {
				return nil, err
			}
		}
		t, err := c.u32()
		if err != nil {
			return nil, err
		}
		ti.Type = TensorType(t)
		n, err := rowBytes(ti.Type, ti.Shape)
		if err != nil {
			return nil, c.fail("tensor %q: %v", ti.Name, err)
		}
		if ti.Offset, err = c.u64(); err != nil {
			return nil, err
		}
		if ti.Offset != want {
			return nil, c.fail("tensor %q at offset %d, expected %d", ti.Name, ti.Offset, want)
		}
		if n > uint64(size) {
			return nil, c.fail("tensor %q of %d bytes is larger than the file", ti.Name, n)
		}
		// want ≤ size before, n ≤ size: no overflow.
		if want += pad(n, f.Alignment); want > uint64(size) {
			return nil, c.fail("tensor %q ends past the end of the file", ti.Name)
		}
		f.names[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	f.DataOffset = c.pos
	if nt > 0 {
		f.DataOffset = int64(pad(uint64(c.pos), f.Alignment))
	}
	if len(f.Tensors) > 0 {
		last := f.Tensors[len(f.Tensors)-1]
		end := uint64(f.DataOffset) + last.Offset + last.Size()
		if end > uint64(size) {
			return nil, fmt.Errorf("%w: tensor data ends at byte %d of a %d-byte file", ErrInvalid, end, size)
		}
	}
	return f, nil
}

// pad rounds n up to a multiple of a (a power of two).
func pad(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }

// Open reads the GGUF file at path; Close releases it.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	f, err := Read(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.closer = fh
	return f, nil
}

// Close closes the file Open opened; for a File from Read it does nothing.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// Get returns the value of key.
func (f *File) Get(key string) (any, bool) {
	i, ok := f.keys[key]
	if !ok {
		return nil, false
	}
	return f.KV[i].Value, true
}

// String returns the string value of key.
func (f *File) String(key string) (string, error) { return get[string](f, key) }

// Uint32 returns the uint32 value of key.
func (f *File) Uint32(key string) (uint32, error) { return get[uint32](f, key) }

// Float32 returns the float32 value of key.
func (f *File) Float32(key string) (float32, error) { return get[float32](f, key) }

// Array returns the array value of key.
func (f *File) Array(key string) (Array, error) { return get[Array](f, key) }

func get[T any](f *File, key string) (T, error) {
	var zero T
	v, ok := f.Get(key)
	if !ok {
		return zero, fmt.Errorf("%w: key %q", ErrNotFound, key)
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: key %q is a %T, not a %T", ErrType, key, v, zero)
	}
	return t, nil
}

// Tensor returns the info of the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.names[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// TensorData reads the raw bytes of the tensor called name.
func (f *File) TensorData(name string) (TensorInfo, []byte, error) {
	ti, ok := f.Tensor(name)
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("%w: tensor %q", ErrNotFound, name)
	}
	b := make([]byte, ti.Size())
	if _, err := f.r.ReadAt(b, f.DataOffset+int64(ti.Offset)); err != nil {
		return TensorInfo{}, nil, fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	return ti, b, nil
}

// TensorFloat32 reads the tensor called name as float32 values (from F32,
// F16, BF16 or Q8_0).
func (f *File) TensorFloat32(name string) ([]float32, TensorInfo, error) {
	ti, b, err := f.TensorData(name)
	if err != nil {
		return nil, ti, err
	}
	out := make([]float32, ti.Elems())
	if err := Decode(out, ti.Type, b); err != nil {
		return nil, ti, fmt.Errorf("tensor %q: %w", name, err)
	}
	return out, ti, nil
}
