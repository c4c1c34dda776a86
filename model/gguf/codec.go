package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// Encode converts src to the bytes of a tensor of type t: F32, F16, BF16
// or Q8_0 (len(src) a multiple of 32).
func Encode(t TensorType, src []float32) ([]byte, error) {
	switch t {
	case TypeF32:
		b := make([]byte, 4*len(src))
		for i, v := range src {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b, nil
	case TypeF16:
		b := make([]byte, 2*len(src))
		for i, v := range src {
			binary.LittleEndian.PutUint16(b[2*i:], safetensors.F32ToF16(v))
		}
		return b, nil
	case TypeBF16:
		b := make([]byte, 2*len(src))
		for i, v := range src {
			binary.LittleEndian.PutUint16(b[2*i:], safetensors.F32ToBF16(v))
		}
		return b, nil
	case TypeQ8_0:
		if len(src)%q8Block != 0 {
			return nil, fmt.Errorf("%w: %d values are not whole Q8_0 blocks of %d", ErrType, len(src), q8Block)
		}
		b := make([]byte, len(src)/q8Block*q8Bytes)
		for i := 0; i < len(src); i += q8Block {
			quantizeQ8(b[i/q8Block*q8Bytes:], src[i:i+q8Block])
		}
		return b, nil
	}
	return nil, fmt.Errorf("%w: cannot encode %s", ErrType, t)
}

// Decode converts the bytes of a tensor of type t (F32, F16, BF16 or Q8_0)
// into dst; b must hold exactly len(dst) elements.
func Decode(dst []float32, t TensorType, b []byte) error {
	if !t.Known() || len(dst)%t.BlockSize() != 0 || len(b) != len(dst)/t.BlockSize()*t.TypeSize() {
		return fmt.Errorf("%w: %d bytes of %s for %d values", ErrType, len(b), t, len(dst))
	}
	switch t {
	case TypeF32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case TypeF16:
		for i := range dst {
			dst[i] = safetensors.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case TypeBF16:
		for i := range dst {
			dst[i] = safetensors.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case TypeQ8_0:
		for i := 0; i < len(dst); i += q8Block {
			blk := b[i/q8Block*q8Bytes:]
			d := safetensors.F16ToF32(binary.LittleEndian.Uint16(blk))
			for j := range q8Block {
				dst[i+j] = d * float32(int8(blk[2+j]))
			}
		}
	default:
		return fmt.Errorf("%w: cannot decode %s", ErrType, t)
	}
	return nil
}

const (
	q8Block = 32
	q8Bytes = 2 + q8Block
)

// quantizeQ8 writes one Q8_0 block of x to b: a float16 scale d = max|x|/127
// and 32 int8 x/d rounded half away from zero, as gguf-py's
// quants.Q8_0.quantize_blocks does (the scale used to round is the float32
// one; the float16 one is stored).
func quantizeQ8(b []byte, x []float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b, safetensors.F32ToF16(d))
	for j, v := range x {
		b[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}
