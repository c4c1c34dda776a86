package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	vals := []float32{0, 1, -2.5, 3.140625, 1e-3, -65504, 0.333333}
	var ts []Tensor
	for _, dt := range []DType{F32, BF16, F16, F64} {
		tn, err := F32Tensor("w."+string(dt), dt, []int{7}, vals)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tn)
	}
	ts = append(ts, Tensor{Name: "ids", DType: I32, Shape: []int{2}, Data: []byte{1, 0, 0, 0, 2, 0, 0, 0}})
	path := filepath.Join(t.TempDir(), "m.safetensors")
	meta := map[string]string{"format": "pt"}
	if err := WriteFile(path, ts, meta); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" {
		t.Fatalf("metadata = %v", f.Metadata)
	}
	if got := f.Names(); len(got) != 5 || got[0] != "w.F32" || got[4] != "ids" {
		t.Fatalf("names = %v", got)
	}
	tol := map[DType]float64{F32: 0, F64: 0, BF16: 1.0 / 128, F16: 1.0 / 1024}
	for _, dt := range []DType{F32, BF16, F16, F64} {
		got, shape, err := f.Float32("w." + string(dt))
		if err != nil {
			t.Fatal(err)
		}
		if len(shape) != 1 || shape[0] != 7 {
			t.Fatalf("%s shape %v", dt, shape)
		}
		for i, v := range vals {
			if d := math.Abs(float64(got[i] - v)); d > tol[dt]*math.Abs(float64(v)) {
				t.Errorf("%s[%d] = %v, want %v", dt, i, got[i], v)
			}
		}
	}
	if _, _, err := f.Float32("ids"); !errors.Is(err, ErrDType) {
		t.Errorf("Float32 of I32: err = %v", err)
	}
	if _, _, err := f.Float32("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing tensor: err = %v", err)
	}
}

func TestHalfConversions(t *testing.T) {
	cases := []struct {
		f    float32
		f16  uint16
		bf16 uint16
	}{
		{1, 0x3c00, 0x3f80},
		{-2, 0xc000, 0xc000},
		{65504, 0x7bff, 0x4780}, // bf16 rounds 0x477fe000 up
		{float32(math.Inf(1)), 0x7c00, 0x7f80},
		{0.5, 0x3800, 0x3f00},
		{5.960464477539063e-08, 0x0001, 0x3380}, // smallest f16 subnormal
		{1e6, 0x7c00, 0x4974},                   // f16 overflow → Inf
	}
	for _, c := range cases {
		if got := F32ToF16(c.f); got != c.f16 {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", c.f, got, c.f16)
		}
		if got := F32ToBF16(c.f); got != c.bf16 {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", c.f, got, c.bf16)
		}
	}
	// Ties round to even: 1 + 2^-11 lies halfway between two halves.
	if got := F32ToF16(1 + 1.0/2048); got != 0x3c00 {
		t.Errorf("tie rounding f16 = %#04x", got)
	}
	if got := F32ToF16(1 + 3.0/2048); got != 0x3c02 {
		t.Errorf("tie rounding f16 (odd) = %#04x", got)
	}
	if got := F32ToBF16(math.Float32frombits(0x3f808000)); got != 0x3f80 {
		t.Errorf("tie rounding bf16 = %#04x", got)
	}
	if v := BF16ToF32(F32ToBF16(float32(math.NaN()))); v == v {
		t.Errorf("bf16 NaN lost")
	}
	// Every half and bfloat16 pattern survives widening and narrowing.
	for h := 0; h < 1<<16; h++ {
		u := uint16(h)
		if f := F16ToF32(u); f == f {
			if back := F32ToF16(f); back != u {
				t.Fatalf("f16 %#04x → %v → %#04x", u, f, back)
			}
		}
		if f := BF16ToF32(u); f == f {
			if back := F32ToBF16(f); back != u {
				t.Fatalf("bf16 %#04x → %v → %#04x", u, f, back)
			}
		}
	}
}

func file(hdr string, data int) []byte {
	var b bytes.Buffer
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	b.Write(n[:])
	b.WriteString(hdr)
	b.Write(make([]byte, data))
	return b.Bytes()
}

func TestParseRejects(t *testing.T) {
	cases := map[string][]byte{
		"short":        {1, 2, 3},
		"huge length":  {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"not json":     file("{nope", 0),
		"not object":   file("[1,2]", 0),
		"null":         file("null", 0),
		"bad dtype":    file(`{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}`, 1),
		"size":         file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 8),
		"past end":     file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4),
		"negative dim": file(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`, 0),
		"reversed":     file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4),
		"overflow":     file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0),
		"overlap":      file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 8),
		"bad metadata": file(`{"__metadata__":{"a":1}}`, 0),
	}
	for name, b := range cases {
		if _, err := Parse(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := Parse(file(`{"a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]}}`, 4)); err != nil {
		t.Errorf("valid file rejected: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}`, 4))
	f.Add(file(`{"a":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[],"data_offsets":[4,6]}}`, 6))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		// Every accepted tensor is readable and re-encodes to an equivalent file.
		var ts []Tensor
		for _, n := range file.Names() {
			ti, raw, err := file.Raw(n)
			if err != nil {
				t.Fatal(err)
			}
			if ti.DType == F32 || ti.DType == F16 || ti.DType == BF16 || ti.DType == F64 {
				if _, _, err := file.Float32(n); err != nil {
					t.Fatalf("%q: %v", n, err)
				}
			}
			ts = append(ts, Tensor{Name: n, DType: ti.DType, Shape: ti.Shape, Data: raw})
		}
		var buf bytes.Buffer
		if err := Write(&buf, ts, file.Metadata); err != nil {
			t.Fatalf("rewrite: %v", err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("reparse: %v", err)
		}
		if len(again.Tensors) != len(file.Tensors) {
			t.Fatalf("tensor count %d → %d", len(file.Tensors), len(again.Tensors))
		}
	})
}
