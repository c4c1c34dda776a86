package gguf

import (
	"fmt"
)

// ValueType is the type of a metadata value, numbered as gguf.h's enum
// gguf_type.
type ValueType uint32

// The metadata value types.
const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
	"string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueNames) {
		return valueNames[t]
	}
	return fmt.Sprintf("gguf_type(%d)", uint32(t))
}

// size is the encoded size of a scalar of type t; for a string or an array,
// the least it can take (its length or its element type and count).
func (t ValueType) size() uint64 {
	switch t {
	case ValueUint8, ValueInt8, ValueBool:
		return 1
	case ValueUint16, ValueInt16:
		return 2
	case ValueUint32, ValueInt32, ValueFloat32:
		return 4
	case ValueUint64, ValueInt64, ValueFloat64, ValueString:
		return 8
	case ValueArray:
		return 4 + 8
	}
	return 0
}

// KV is one metadata entry. Value is a Go value of the type it is written
// as: uint8, int8, uint16, int16, uint32, int32, float32, bool, string,
// uint64, int64, float64, or Array.
type KV struct {
	Key   string
	Value any
}

// Array is a metadata array: Values is a slice of the Go type of Elem
// ([]uint32 for ValueUint32, []string for ValueString, []Array for nested
// arrays, …).
type Array struct {
	Elem   ValueType
	Values any
}

// Len is the number of elements.
func (a Array) Len() int {
	switch v := a.Values.(type) {
	case []uint8:
		return len(v)
	case []int8:
		return len(v)
	case []uint16:
		return len(v)
	case []int16:
		return len(v)
	case []uint32:
		return len(v)
	case []int32:
		return len(v)
	case []float32:
		return len(v)
	case []bool:
		return len(v)
	case []string:
		return len(v)
	case []uint64:
		return len(v)
	case []int64:
		return len(v)
	case []float64:
		return len(v)
	case []Array:
		return len(v)
	}
	return 0
}

// Strings builds a string array.
func Strings(v []string) Array { return Array{Elem: ValueString, Values: v} }

// Int32s builds an int32 array.
func Int32s(v []int32) Array { return Array{Elem: ValueInt32, Values: v} }

// Uint32s builds a uint32 array.
func Uint32s(v []uint32) Array { return Array{Elem: ValueUint32, Values: v} }

// Float32s builds a float32 array.
func Float32s(v []float32) Array { return Array{Elem: ValueFloat32, Values: v} }

// typeOf returns the value type v is written as, or an error for a Go type
// with none (or an array whose slice does not match its Elem).
func typeOf(v any) (ValueType, error) {
	switch a := v.(type) {
	case uint8:
		return ValueUint8, nil
	case int8:
		return ValueInt8, nil
	case uint16:
		return ValueUint16, nil
	case int16:
		return ValueInt16, nil
	case uint32:
		return ValueUint32, nil
	case int32:
		return ValueInt32, nil
	case float32:
		return ValueFloat32, nil
	case bool:
		return ValueBool, nil
	case string:
		return ValueString, nil
	case uint64:
		return ValueUint64, nil
	case int64:
		return ValueInt64, nil
	case float64:
		return ValueFloat64, nil
	case Array:
		var want ValueType
		switch a.Values.(type) {
		case []uint8:
			want = ValueUint8
		case []int8:
			want = ValueInt8
		case []uint16:
			want = ValueUint16
		case []int16:
			want = ValueInt16
		case []uint32:
			want = ValueUint32
		case []int32:
			want = ValueInt32
		case []float32:
			want = ValueFloat32
		case []bool:
			want = ValueBool
		case []string:
			want = ValueString
		case []uint64:
			want = ValueUint64
		case []int64:
			want = ValueInt64
		case []float64:
			want = ValueFloat64
		case []Array:
			want = ValueArray
		default:
			return 0, fmt.Errorf("array of %T", a.Values)
		}
		if want != a.Elem {
			return 0, fmt.Errorf("array of %s holds %T", a.Elem, a.Values)
		}
		return ValueArray, nil
	}
	return 0, fmt.Errorf("no metadata type for %T", v)
}
