package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
)

// allValues is metadata with one entry of each value type, nested arrays
// included.
func allValues() []KV {
	return []KV{
		{"general.architecture", "qwen3"},
		{"u8", uint8(200)}, {"i8", int8(-5)}, {"u16", uint16(60000)}, {"i16", int16(-30000)},
		{"u32", uint32(4000000000)}, {"i32", int32(-2000000000)}, {"f32", float32(1.5)},
		{"bool", true}, {"boolf", false}, {"str", "héllo"}, {"empty", ""},
		{"u64", uint64(1) << 60}, {"i64", int64(-1) << 60}, {"f64", math.Pi},
		{"a.u8", Array{ValueUint8, []uint8{1, 2}}}, {"a.i8", Array{ValueInt8, []int8{-1}}},
		{"a.u16", Array{ValueUint16, []uint16{7}}}, {"a.i16", Array{ValueInt16, []int16{-7}}},
		{"a.u32", Uint32s([]uint32{1, 2, 3})}, {"a.i32", Int32s([]int32{-1, 0, 1})},
		{"a.f32", Float32s([]float32{0.25})}, {"a.bool", Array{ValueBool, []bool{true, false}}},
		{"a.str", Strings([]string{"a", "", "ü"})}, {"a.u64", Array{ValueUint64, []uint64{9}}},
		{"a.i64", Array{ValueInt64, []int64{-9}}}, {"a.f64", Array{ValueFloat64, []float64{2.5}}},
		{"a.empty", Strings([]string{})},
		{"a.nested", Array{ValueArray, []Array{Uint32s([]uint32{1}), Uint32s([]uint32{2, 3})}}},
	}
}

func randFloats(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, align := range []uint32{0, 32, 64, 8} {
		kv := allValues()
		if align != 0 {
			kv = append(kv, KV{KeyAlignment, align})
		}
		var tensors []Tensor
		for i, typ := range []TensorType{TypeF32, TypeF16, TypeBF16, TypeQ8_0} {
			shape := []uint64{64, uint64(3 + i)}
			data, err := Encode(typ, randFloats(r, int(shape[0]*shape[1])))
			if err != nil {
				t.Fatal(err)
			}
			tensors = append(tensors, Tensor{Info: TensorInfo{Name: "t." + typ.String(), Shape: shape, Type: typ}, Data: data})
		}
		// A quantized type the codec does not decode still has its size checked.
		tensors = append(tensors, Tensor{Info: TensorInfo{Name: "q4k", Shape: []uint64{256, 2}, Type: TypeQ4_K}, Data: make([]byte, 2*144)})
		tensors = append(tensors, Tensor{Info: TensorInfo{Name: "one", Shape: []uint64{3}, Type: TypeF32}, Data: make([]byte, 12)})
		var buf bytes.Buffer
		if err := Write(&buf, kv, tensors); err != nil {
			t.Fatal(err)
		}
		f, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil {
			t.Fatalf("align %d: %v", align, err)
		}
		want := uint64(align)
		if want == 0 {
			want = DefaultAlignment
		}
		if f.Alignment != want || f.DataOffset%int64(want) != 0 {
			t.Fatalf("alignment %d data offset %d, want alignment %d", f.Alignment, f.DataOffset, want)
		}
		if !reflect.DeepEqual(f.KV, kv) {
			t.Fatalf("metadata differs:\n got %v\nwant %v", f.KV, kv)
		}
		for _, tn := range tensors {
			ti, data, err := f.TensorData(tn.Info.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data, tn.Data) || !reflect.DeepEqual(ti.Shape, tn.Info.Shape) || ti.Type != tn.Info.Type {
				t.Fatalf("tensor %s differs", tn.Info.Name)
			}
			if ti.Offset%want != 0 {
				t.Fatalf("tensor %s at unaligned offset %d", ti.Name, ti.Offset)
			}
		}
		// Writing what was read gives the same bytes.
		var again bytes.Buffer
		var ts []Tensor
		for _, ti := range f.Tensors {
			_, d, _ := f.TensorData(ti.Name)
			ts = append(ts, Tensor{Info: ti, Data: d})
		}
		if err := Write(&again, f.KV, ts); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), buf.Bytes()) {
			t.Fatal("rewrite differs")
		}
	}
}

func TestFileAccessors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	kv := allValues()
	v := []float32{1, -2, 3, 0.5}
	data, _ := Encode(TypeF32, v)
	if err := WriteFile(path, kv, []Tensor{{Info: TensorInfo{Name: "w", Shape: []uint64{2, 2}, Type: TypeF32}, Data: data}}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if s, err := f.String("str"); err != nil || s != "héllo" {
		t.Fatalf("String: %q %v", s, err)
	}
	if u, err := f.Uint32("u32"); err != nil || u != 4000000000 {
		t.Fatalf("Uint32: %d %v", u, err)
	}
	if _, err := f.Uint32("str"); !errors.Is(err, ErrType) {
		t.Fatalf("Uint32 of a string: %v", err)
	}
	if _, err := f.String("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	got, ti, err := f.TensorFloat32("w")
	if err != nil || !reflect.DeepEqual(got, v) || ti.Elems() != 4 {
		t.Fatalf("TensorFloat32: %v %v %v", got, ti, err)
	}
	if _, _, err := f.TensorData("x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing tensor: %v", err)
	}
}

func TestCodec(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := randFloats(r, 32*16)
	x[5], x[40] = 0, -7 // a zero, and a block whose maximum is negative
	copy(x[64:96], make([]float32, 32))
	for _, c := range []struct {
		typ TensorType
		tol func(v float32) float64 // the largest error allowed for v
	}{
		{TypeF32, func(float32) float64 { return 0 }},
		{TypeF16, func(v float32) float64 { return math.Abs(float64(v)) * 0x1p-11 }},
		{TypeBF16, func(v float32) float64 { return math.Abs(float64(v)) * 0x1p-8 }},
	} {
		b, err := Encode(c.typ, x)
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float32, len(x))
		if err := Decode(y, c.typ, b); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if d := math.Abs(float64(x[i] - y[i])); d > c.tol(x[i]) {
				t.Fatalf("%s: x[%d] = %g decoded as %g", c.typ, i, x[i], y[i])
			}
		}
	}
	// Q8_0: each value within half a step of its block's scale (plus the
	// scale's own float16 rounding), the block's extreme exact up to it.
	b, err := Encode(TypeQ8_0, x)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != len(x)/32*34 {
		t.Fatalf("Q8_0 of %d values is %d bytes", len(x), len(b))
	}
	y := make([]float32, len(x))
	if err := Decode(y, TypeQ8_0, b); err != nil {
		t.Fatal(err)
	}
	for blk := 0; blk < len(x); blk += 32 {
		var amax float64
		for _, v := range x[blk : blk+32] {
			amax = max(amax, math.Abs(float64(v)))
		}
		step := amax / 127
		for i := blk; i < blk+32; i++ {
			if d := math.Abs(float64(x[i] - y[i])); d > step/2+amax*0x1p-10 {
				t.Fatalf("Q8_0: x[%d] = %g decoded as %g (step %g)", i, x[i], y[i], step)
			}
		}
	}
	if got := binary.LittleEndian.Uint16(b[2*34:]); got != 0 {
		t.Fatalf("an all-zero block has scale %#x", got)
	}
	if _, err := Encode(TypeQ8_0, x[:31]); err == nil {
		t.Fatal("Q8_0 of 31 values encoded")
	}
	if _, err := Encode(TypeQ4_K, x); err == nil {
		t.Fatal("Q4_K encoded")
	}
	if err := Decode(y[:2], TypeF32, b[:4]); err == nil {
		t.Fatal("decoded 4 bytes into 2 float32")
	}
}

func TestTypeTable(t *testing.T) {
	for _, c := range []struct {
		typ          TensorType
		block, bytes int
	}{
		{TypeF32, 1, 4}, {TypeF16, 1, 2}, {TypeBF16, 1, 2}, {TypeQ8_0, 32, 34}, {TypeQ4_0, 32, 18},
		{TypeQ4_K, 256, 144}, {TypeQ5_K, 256, 176}, {TypeQ6_K, 256, 210}, {TypeQ2_K, 256, 84},
		{TypeQ3_K, 256, 110}, {TypeIQ4_XS, 256, 136}, {TypeMXFP4, 32, 17},
	} {
		if c.typ.BlockSize() != c.block || c.typ.TypeSize() != c.bytes {
			t.Errorf("%s: block %d of %d bytes, want %d of %d", c.typ, c.typ.BlockSize(), c.typ.TypeSize(), c.block, c.bytes)
		}
	}
	if TensorType(4).Known() || TensorType(31).Known() || TensorType(100).Known() {
		t.Error("a removed or unknown type is known")
	}
	if typ, err := ParseTensorType("q8_0"); err != nil || typ != TypeQ8_0 {
		t.Errorf("ParseTensorType(q8_0) = %v, %v", typ, err)
	}
}
