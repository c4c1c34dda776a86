package torch

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/clawmesh/clawmesh/model/engine"
)

// The worker protocol (PROTOCOL.md): length-prefixed frames of a fixed
// binary header, a small JSON object of scalars (meta) and raw
// little-endian tensors.

// ProtocolVersion is the version both ends speak; a worker of another
// version is refused at HELLO.
const ProtocolVersion = 1

const (
	frameMagic  = "CMTW"
	headerSize  = 20        // magic, version, op, flags, id, meta length, tensor count
	maxFrame    = 1 << 30   // bytes after the length prefix
	maxMeta     = 16 << 20  // bytes of JSON
	maxTensors  = 1 << 16   // tensors in a frame
	maxTensorND = 8         // dimensions of one tensor
	maxElements = 1<<30 - 1 // elements of one tensor
)

// Ops. Requests go to the worker; RESULT, ERROR, HELLO and TOKEN come back.
const (
	opHello      uint8 = 1
	opOpen       uint8 = 2
	opLogprobs   uint8 = 3
	opTrain      uint8 = 4
	opGrad       uint8 = 5
	opGenerate   uint8 = 6
	opToken      uint8 = 7
	opContinue   uint8 = 8
	opStop       uint8 = 9
	opLoad       uint8 = 10
	opExport     uint8 = 11
	opReset      uint8 = 12
	opCheckpoint uint8 = 13
	opRestore    uint8 = 14
	opShutdown   uint8 = 15
	opDevice     uint8 = 16
	opResult     uint8 = 100
	opError      uint8 = 101
)

// Tensor element types.
const (
	dtF32 uint8 = 1
	dtI32 uint8 = 2
	dtU8  uint8 = 3
	dtF64 uint8 = 4
	dtI64 uint8 = 5
)

var dtSize = map[uint8]int{dtF32: 4, dtI32: 4, dtU8: 1, dtF64: 8, dtI64: 8}

// tensor is one raw little-endian array.
type tensor struct {
	dt   uint8
	dims []uint32
	data []byte
}

// frame is one message.
type frame struct {
	op      uint8
	id      uint32
	meta    json.RawMessage // a JSON object, or empty
	tensors []tensor
}

func (t tensor) elements() int {
	n := 1
	for _, d := range t.dims {
		n *= int(d)
	}
	return n
}

// encode appends f with its length prefix to b.
func (f *frame) encode(b []byte) ([]byte, error) {
	size := headerSize + len(f.meta)
	for _, t := range f.tensors {
		sz, ok := dtSize[t.dt]
		if !ok || len(t.dims) > maxTensorND || t.elements()*sz != len(t.data) {
			return nil, fmt.Errorf("%w: tensor dtype %d dims %v with %d bytes", ErrProtocol, t.dt, t.dims, len(t.data))
		}
		size += 4 + 4*len(t.dims) + len(t.data)
	}
	if size > maxFrame || len(f.meta) > maxMeta || len(f.tensors) > maxTensors {
		return nil, fmt.Errorf("%w: frame of %d bytes", ErrProtocol, size)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	b = append(b, frameMagic...)
	b = binary.LittleEndian.AppendUint16(b, ProtocolVersion)
	b = append(b, f.op, 0)
	b = binary.LittleEndian.AppendUint32(b, f.id)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(f.meta)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(f.tensors)))
	b = append(b, f.meta...)
	for _, t := range f.tensors {
		b = append(b, t.dt, uint8(len(t.dims)), 0, 0)
		for _, d := range t.dims {
			b = binary.LittleEndian.AppendUint32(b, d)
		}
		b = append(b, t.data...)
	}
	return b, nil
}

// readFrame reads one frame from r.
func readFrame(r io.Reader) (*frame, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(lb[:])
	if n < headerSize || n > maxFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes", ErrProtocol, n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeFrame(body)
}

// decodeFrame parses a frame's body (after the length prefix).
func decodeFrame(b []byte) (*frame, error) {
	if len(b) < headerSize || string(b[:4]) != frameMagic {
		return nil, fmt.Errorf("%w: not a worker frame", ErrProtocol)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != ProtocolVersion {
		return nil, fmt.Errorf("%w: protocol version %d, want %d", ErrProtocol, v, ProtocolVersion)
	}
	f := &frame{op: b[6], id: binary.LittleEndian.Uint32(b[8:])}
	ml := uint64(binary.LittleEndian.Uint32(b[12:]))
	nt := binary.LittleEndian.Uint32(b[16:])
	off := uint64(headerSize)
	if ml > maxMeta || off+ml > uint64(len(b)) || nt > maxTensors {
		return nil, fmt.Errorf("%w: meta of %d bytes, %d tensors in a frame of %d", ErrProtocol, ml, nt, len(b))
	}
	if ml > 0 {
		f.meta = json.RawMessage(b[off : off+ml])
		if !json.Valid(f.meta) || f.meta[0] != '{' {
			return nil, fmt.Errorf("%w: meta is not a JSON object", ErrProtocol)
		}
	}
	off += ml
	for range nt {
		if off+4 > uint64(len(b)) {
			return nil, fmt.Errorf("%w: tensor header beyond the frame", ErrProtocol)
		}
		dt, nd := b[off], int(b[off+1])
		off += 4
		sz, ok := dtSize[dt]
		if !ok || nd > maxTensorND || off+uint64(4*nd) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: tensor of dtype %d with %d dimensions", ErrProtocol, dt, nd)
		}
		t := tensor{dt: dt, dims: make([]uint32, nd)}
		count := uint64(1)
		for i := range nd {
			t.dims[i] = binary.LittleEndian.Uint32(b[off:])
			off += 4
			count *= uint64(t.dims[i])
			if count > maxElements {
				return nil, fmt.Errorf("%w: tensor of %v elements", ErrProtocol, t.dims)
			}
		}
		nb := count * uint64(sz)
		if off+nb > uint64(len(b)) {
			return nil, fmt.Errorf("%w: tensor data beyond the frame", ErrProtocol)
		}
		t.data = b[off : off+nb]
		off += nb
		f.tensors = append(f.tensors, t)
	}
	if off != uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d bytes after the last tensor", ErrProtocol, uint64(len(b))-off)
	}
	return f, nil
}

func i32Tensor(v []int32) tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return tensor{dt: dtI32, dims: []uint32{uint32(len(v))}, data: b}
}

func f32Tensor(v []float32) tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return tensor{dt: dtF32, dims: []uint32{uint32(len(v))}, data: b}
}

func u8Tensor(v []bool) tensor {
	b := make([]byte, len(v))
	for i, x := range v {
		if x {
			b[i] = 1
		}
	}
	return tensor{dt: dtU8, dims: []uint32{uint32(len(v))}, data: b}
}

// floats reads a float32 tensor.
func (t tensor) floats() ([]float32, error) {
	if t.dt != dtF32 {
		return nil, fmt.Errorf("%w: tensor of dtype %d, want float32", ErrProtocol, t.dt)
	}
	v := make([]float32, len(t.data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.data[4*i:]))
	}
	return v, nil
}

// ints reads an int32 tensor.
func (t tensor) ints() ([]int, error) {
	if t.dt != dtI32 {
		return nil, fmt.Errorf("%w: tensor of dtype %d, want int32", ErrProtocol, t.dt)
	}
	v := make([]int, len(t.data)/4)
	for i := range v {
		v[i] = int(int32(binary.LittleEndian.Uint32(t.data[4*i:])))
	}
	return v, nil
}

// metaOf encodes v as a frame's meta.
func metaOf(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are encoded
	}
	return b
}

// workerError is an ERROR frame's meta.
type workerError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// errorOf maps a worker's error code to the shared sentinels, in one place.
func errorOf(f *frame) error {
	var we workerError
	if err := json.Unmarshal(f.meta, &we); err != nil {
		return fmt.Errorf("%w: error frame: %v", ErrProtocol, err)
	}
	var sentinel error
	switch we.Code {
	case "oom":
		sentinel = engine.ErrOutOfMemory
	case "bad_input":
		sentinel = engine.ErrBadInput
	case "adapter":
		sentinel = engine.ErrAdapter
	case "config", "model":
		sentinel = ErrModel
	default:
		sentinel = ErrWorker
	}
	return fmt.Errorf("%w: %s", sentinel, we.Message)
}
