package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Tensor is one tensor to write: Data holds Info.Size() bytes.
type Tensor struct {
	Info TensorInfo
	Data []byte
}

// Writer writes a GGUF file as gguf.cpp's gguf_write_to_buf lays it out:
// the header, metadata and tensor infos, padding to the alignment, then
// each tensor's data padded to the alignment. NewWriter writes all but the
// data; WriteTensor writes the tensors' data in the order of the infos, so
// a large file need not be held in memory.
type Writer struct {
	w       *bufio.Writer
	infos   []TensorInfo
	align   uint64
	next    int
	written uint64
	err     error
}

// NewWriter writes the header of a file with metadata kv and tensors infos
// (their Offset fields are ignored: offsets are laid out here). The
// alignment is kv's general.alignment (a uint32 power of two) or 32.
func NewWriter(w io.Writer, kv []KV, infos []TensorInfo) (*Writer, error) {
	gw := &Writer{w: bufio.NewWriterSize(w, 1<<20), align: DefaultAlignment}
	keys := map[string]bool{}
	for _, e := range kv {
		if keys[e.Key] {
			return nil, fmt.Errorf("%w: duplicate key %q", ErrInvalid, e.Key)
		}
		keys[e.Key] = true
		if _, err := typeOf(e.Value); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrInvalid, e.Key, err)
		}
		if e.Key == KeyAlignment {
			a, ok := e.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("%w: %s must be a uint32 power of two, not %v", ErrInvalid, KeyAlignment, e.Value)
			}
			gw.align = uint64(a)
		}
	}
	names := map[string]bool{}
	var off uint64
	gw.infos = make([]TensorInfo, len(infos))
	for i, ti := range infos {
		if len(ti.Name) > MaxNameLen || names[ti.Name] {
			return nil, fmt.Errorf("%w: tensor name %q too long or repeated", ErrInvalid, ti.Name)
		}
		names[ti.Name] = true
		if len(ti.Shape) == 0 || len(ti.Shape) > MaxDims {
			return nil, fmt.Errorf("%w: tensor %q has %d dimensions", ErrInvalid, ti.Name, len(ti.Shape))
		}
		n, err := rowBytes(ti.Type, ti.Shape)
		if err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrInvalid, ti.Name, err)
		}
		ti.Shape = append([]uint64(nil), ti.Shape...)
		ti.Offset = off
		off += pad(n, gw.align)
		gw.infos[i] = ti
	}
	gw.bytes([]byte(Magic))
	gw.u32(Version)
	gw.u64(uint64(len(infos)))
	gw.u64(uint64(len(kv)))
	for _, e := range kv {
		gw.str(e.Key)
		t, _ := typeOf(e.Value)
		gw.u32(uint32(t))
		gw.value(e.Value)
	}
	for _, ti := range gw.infos {
		gw.str(ti.Name)
		gw.u32(uint32(len(ti.Shape)))
		for _, d := range ti.Shape {
			gw.u64(d)
		}
		gw.u32(uint32(ti.Type))
		gw.u64(ti.Offset)
	}
	gw.pad()
	gw.written = 0
	if gw.err != nil {
		return nil, gw.err
	}
	return gw, nil
}

// Infos returns the tensor infos with their offsets laid out.
func (w *Writer) Infos() []TensorInfo { return w.infos }

// WriteTensor writes the data of the next tensor; data must be its size.
func (w *Writer) WriteTensor(data []byte) error {
	if w.err != nil {
		return w.err
	}
	if w.next >= len(w.infos) {
		return errors.New("gguf: more tensor data than tensors")
	}
	ti := w.infos[w.next]
	if uint64(len(data)) != ti.Size() {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, its shape %v of %s needs %d", ti.Name, len(data), ti.Shape, ti.Type, ti.Size())
	}
	w.next++
	w.bytes(data)
	w.pad()
	return w.err
}

// Close flushes the file; every tensor's data must have been written.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.next != len(w.infos) {
		return fmt.Errorf("gguf: %d of %d tensors written", w.next, len(w.infos))
	}
	return w.w.Flush()
}

func (w *Writer) bytes(b []byte) {
	if w.err != nil {
		return
	}
	_, w.err = w.w.Write(b)
	w.written += uint64(len(b))
}

func (w *Writer) pad() {
	var zero [64]byte
	for w.written%w.align != 0 && w.err == nil {
		n := min(pad(w.written, w.align)-w.written, uint64(len(zero)))
		w.bytes(zero[:n])
	}
}

func (w *Writer) u32(v uint32) { w.bytes(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *Writer) u64(v uint64) { w.bytes(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *Writer) str(s string) { w.u64(uint64(len(s))); w.bytes([]byte(s)) }

func (w *Writer) value(v any) {
	switch x := v.(type) {
	case uint8:
		w.bytes([]byte{x})
	case int8:
		w.bytes([]byte{byte(x)})
	case uint16:
		w.bytes(binary.LittleEndian.AppendUint16(nil, x))
	case int16:
		w.bytes(binary.LittleEndian.AppendUint16(nil, uint16(x)))
	case uint32:
		w.u32(x)
	case int32:
		w.u32(uint32(x))
	case float32:
		w.u32(math.Float32bits(x))
	case bool:
		if x {
			w.bytes([]byte{1})
		} else {
			w.bytes([]byte{0})
		}
	case string:
		w.str(x)
	case uint64:
		w.u64(x)
	case int64:
		w.u64(uint64(x))
	case float64:
		w.u64(math.Float64bits(x))
	case Array:
		w.u32(uint32(x.Elem))
		w.u64(uint64(x.Len()))
		eachValue(x, w.value)
	}
}

// eachValue calls fn with each element of a.
func eachValue(a Array, fn func(any)) {
	switch v := a.Values.(type) {
	case []uint8:
		each(v, fn)
	case []int8:
		each(v, fn)
	case []uint16:
		each(v, fn)
	case []int16:
		each(v, fn)
	case []uint32:
		each(v, fn)
	case []int32:
		each(v, fn)
	case []float32:
		each(v, fn)
	case []bool:
		each(v, fn)
	case []string:
		each(v, fn)
	case []uint64:
		each(v, fn)
	case []int64:
		each(v, fn)
	case []float64:
		each(v, fn)
	case []Array:
		each(v, fn)
	}
}

func each[T any](v []T, fn func(any)) {
	for _, x := range v {
		fn(x)
	}
}

// Write writes a whole GGUF file with metadata kv and tensors.
func Write(w io.Writer, kv []KV, tensors []Tensor) error {
	infos := make([]TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = t.Info
	}
	gw, err := NewWriter(w, kv, infos)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		if err := gw.WriteTensor(t.Data); err != nil {
			return err
		}
	}
	return gw.Close()
}

// createFile runs write on a temporary file beside path and renames it to
// path once write and the file's sync succeeded, so path is whole or
// absent.
func createFile(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// WriteFile writes a whole GGUF file to path (through a temporary file
// renamed into place).
func WriteFile(path string, kv []KV, tensors []Tensor) error {
	return createFile(path, func(w io.Writer) error { return Write(w, kv, tensors) })
}
