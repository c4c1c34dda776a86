package gguf

import (
	"fmt"
	"math"
)

// TensorType is a ggml tensor element type, numbered as ggml's enum
// ggml_type (ggml/include/ggml.h; gguf-py/gguf/constants.py
// GGMLQuantizationType).
type TensorType uint32

// The tensor types of ggml. Numbers absent from the list (4, 5, 31–33,
// 36–38) were removed from ggml and are refused.
const (
	TypeF32     TensorType = 0
	TypeF16     TensorType = 1
	TypeQ4_0    TensorType = 2
	TypeQ4_1    TensorType = 3
	TypeQ5_0    TensorType = 6
	TypeQ5_1    TensorType = 7
	TypeQ8_0    TensorType = 8
	TypeQ8_1    TensorType = 9
	TypeQ2_K    TensorType = 10
	TypeQ3_K    TensorType = 11
	TypeQ4_K    TensorType = 12
	TypeQ5_K    TensorType = 13
	TypeQ6_K    TensorType = 14
	TypeQ8_K    TensorType = 15
	TypeIQ2_XXS TensorType = 16
	TypeIQ2_XS  TensorType = 17
	TypeIQ3_XXS TensorType = 18
	TypeIQ1_S   TensorType = 19
	TypeIQ4_NL  TensorType = 20
	TypeIQ3_S   TensorType = 21
	TypeIQ2_S   TensorType = 22
	TypeIQ4_XS  TensorType = 23
	TypeI8      TensorType = 24
	TypeI16     TensorType = 25
	TypeI32     TensorType = 26
	TypeI64     TensorType = 27
	TypeF64     TensorType = 28
	TypeIQ1_M   TensorType = 29
	TypeBF16    TensorType = 30
	TypeTQ1_0   TensorType = 34
	TypeTQ2_0   TensorType = 35
	TypeMXFP4   TensorType = 39
)

// qk is ggml's QK_K, the super-block of the k-quants.
const qk = 256

// typeTraits is one row of the type table: the name, the elements per
// block and the bytes per block (gguf-py/gguf/constants.py
// GGML_QUANT_SIZES).
type typeTraits struct {
	name      string
	blockSize int
	typeSize  int
}

var typeTable = map[TensorType]typeTraits{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 2 + 16},
	TypeQ4_1:    {"Q4_1", 32, 2 + 2 + 16},
	TypeQ5_0:    {"Q5_0", 32, 2 + 4 + 16},
	TypeQ5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16},
	TypeQ8_0:    {"Q8_0", 32, 2 + 32},
	TypeQ8_1:    {"Q8_1", 32, 4 + 4 + 32},
	TypeQ2_K:    {"Q2_K", qk, 2 + 2 + qk/16 + qk/4},
	TypeQ3_K:    {"Q3_K", qk, 2 + qk/4 + qk/8 + 12},
	TypeQ4_K:    {"Q4_K", qk, 2 + 2 + qk/2 + 12},
	TypeQ5_K:    {"Q5_K", qk, 2 + 2 + qk/2 + qk/8 + 12},
	TypeQ6_K:    {"Q6_K", qk, 2 + qk/2 + qk/4 + qk/16},
	TypeQ8_K:    {"Q8_K", qk, 4 + qk + qk/8},
	TypeIQ2_XXS: {"IQ2_XXS", qk, 2 + qk/4},
	TypeIQ2_XS:  {"IQ2_XS", qk, 2 + qk/4 + qk/32},
	TypeIQ3_XXS: {"IQ3_XXS", qk, 2 + qk/4 + qk/8},
	TypeIQ1_S:   {"IQ1_S", qk, 2 + qk/8 + qk/16},
	TypeIQ4_NL:  {"IQ4_NL", 32, 2 + 16},
	TypeIQ3_S:   {"IQ3_S", qk, 2 + qk/4 + qk/8 + qk/32 + 4},
	TypeIQ2_S:   {"IQ2_S", qk, 2 + qk/4 + qk/16},
	TypeIQ4_XS:  {"IQ4_XS", qk, 2 + 2 + qk/2 + qk/64},
	TypeI8:      {"I8", 1, 1},
	TypeI16:     {"I16", 1, 2},
	TypeI32:     {"I32", 1, 4},
	TypeI64:     {"I64", 1, 8},
	TypeF64:     {"F64", 1, 8},
	TypeIQ1_M:   {"IQ1_M", qk, qk/8 + qk/16 + qk/32},
	TypeBF16:    {"BF16", 1, 2},
	TypeTQ1_0:   {"TQ1_0", qk, 2 + 4*13},
	TypeTQ2_0:   {"TQ2_0", qk, 2 + 64},
	TypeMXFP4:   {"MXFP4", 32, 1 + 16},
}

// Known reports whether t is a type of the table.
func (t TensorType) Known() bool { _, ok := typeTable[t]; return ok }

// String is the type's name as ggml prints it ("Q8_0"), or "type(N)".
func (t TensorType) String() string {
	if tt, ok := typeTable[t]; ok {
		return tt.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements one block holds (1 for the plain
// types); 0 for an unknown type.
func (t TensorType) BlockSize() int { return typeTable[t].blockSize }

// TypeSize is the number of bytes of one block; 0 for an unknown type.
func (t TensorType) TypeSize() int { return typeTable[t].typeSize }

// ParseTensorType reads a type's name ("F32", "q8_0"), case-insensitive.
func ParseTensorType(s string) (TensorType, error) {
	for t, tt := range typeTable {
		if equalFold(tt.name, s) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown tensor type %q", ErrInvalid, s)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// rowBytes returns the bytes of a tensor of type t and shape ne (ggml
// order), checking, as gguf.cpp's gguf_init_from_file_impl does, that the
// first dimension is a whole number of blocks and that nothing overflows.
func rowBytes(t TensorType, ne []uint64) (uint64, error) {
	tt, ok := typeTable[t]
	if !ok {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if len(ne) == 0 {
		return 0, fmt.Errorf("no dimensions")
	}
	if ne[0]%uint64(tt.blockSize) != 0 {
		return 0, fmt.Errorf("%d elements per row is not a multiple of %s's block size %d", ne[0], tt.name, tt.blockSize)
	}
	n := uint64(1)
	for _, d := range ne {
		if d > math.MaxInt64 || (d != 0 && n > math.MaxInt64/d) {
			return 0, fmt.Errorf("shape %v overflows", ne)
		}
		n *= d
	}
	blocks := n / uint64(tt.blockSize)
	if blocks > math.MaxInt64/uint64(tt.typeSize) {
		return 0, fmt.Errorf("shape %v of %s overflows", ne, tt.name)
	}
	return blocks * uint64(tt.typeSize), nil
}
