package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// raw assembles bytes of a file by hand, to write what Write refuses to.
type raw struct{ bytes.Buffer }

func (r *raw) u32(v uint32) *raw { r.Write(binary.LittleEndian.AppendUint32(nil, v)); return r }
func (r *raw) u64(v uint64) *raw { r.Write(binary.LittleEndian.AppendUint64(nil, v)); return r }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.WriteString(s); return r }
func (r *raw) head(nt, nkv uint64) *raw {
	r.WriteString("GGUF")
	return r.u32(3).u64(nt).u64(nkv)
}

// tensor appends one tensor info.
func (r *raw) tensor(name string, typ uint32, off uint64, shape ...uint64) *raw {
	r.str(name).u32(uint32(len(shape)))
	for _, d := range shape {
		r.u64(d)
	}
	return r.u32(typ).u64(off)
}

func padTo(b []byte, n int) []byte { return append(b, make([]byte, n-len(b))...) }

func TestReadRefuses(t *testing.T) {
	valid := func() []byte {
		var buf bytes.Buffer
		d, _ := Encode(TypeF32, make([]float32, 8))
		if err := Write(&buf, []KV{{"k", "v"}}, []Tensor{{Info: TensorInfo{Name: "a", Shape: []uint64{8}, Type: TypeF32}, Data: d}}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}()
	if _, err := Read(bytes.NewReader(valid), int64(len(valid))); err != nil {
		t.Fatalf("the valid file: %v", err)
	}
	huge := uint64(math.MaxUint64)
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "past the end"},
		{"bad magic", append([]byte("GGUX"), valid[4:]...), "magic"},
		{"version 1", func() []byte { r := &raw{}; r.WriteString("GGUF"); r.u32(1).u64(0).u64(0); return r.Bytes() }(), "version 1"},
		{"big-endian", func() []byte { r := &raw{}; r.WriteString("GGUF"); r.u32(3 << 24).u64(0).u64(0); return r.Bytes() }(), "big-endian"},
		{"truncated", valid[:len(valid)-1], "ends"},
		{"huge tensor count", (&raw{}).head(huge, 0).Bytes(), "cannot fit"},
		{"huge kv count", (&raw{}).head(0, 1<<40).Bytes(), "cannot fit"},
		{"huge key", func() []byte { r := (&raw{}).head(0, 1); r.u64(1 << 62); return padTo(r.Bytes(), 64) }(), "string of"},
		{"huge array", func() []byte {
			r := (&raw{}).head(0, 1)
			r.str("a").u32(uint32(ValueArray)).u32(uint32(ValueUint32)).u64(1 << 61)
			return padTo(r.Bytes(), 128)
		}(), "cannot fit"},
		{"huge string array", func() []byte {
			r := (&raw{}).head(0, 1)
			r.str("a").u32(uint32(ValueArray)).u32(uint32(ValueString)).u64(20)
			return padTo(r.Bytes(), 128)
		}(), "cannot fit"},
		{"deep arrays", func() []byte {
			r := (&raw{}).head(0, 1)
			r.str("a").u32(uint32(ValueArray))
			for range 10 {
				r.u32(uint32(ValueArray)).u64(1)
			}
			return padTo(r.Bytes(), 1024)
		}(), "nested"},
		{"unknown value type", func() []byte { r := (&raw{}).head(0, 1); r.str("a").u32(13); return padTo(r.Bytes(), 64) }(), "unknown value type"},
		{"bad bool", func() []byte {
			r := (&raw{}).head(0, 1)
			r.str("a").u32(uint32(ValueBool))
			r.WriteByte(2)
			return r.Bytes()
		}(), "bool"},
		{"duplicate key", func() []byte {
			r := (&raw{}).head(0, 2)
			r.str("a").u32(uint32(ValueUint8)).WriteByte(1)
			r.str("a").u32(uint32(ValueUint8)).WriteByte(1)
			return r.Bytes()
		}(), "duplicate key"},
		{"alignment not uint32", func() []byte {
			r := (&raw{}).head(0, 1)
			r.str(KeyAlignment).u32(uint32(ValueUint64)).u64(32)
			return r.Bytes()
		}(), "not a uint32"},
		{"alignment not a power of two", func() []byte {
			r := (&raw{}).head(0, 1)
			r.str(KeyAlignment).u32(uint32(ValueUint32)).u32(48)
			return r.Bytes()
		}(), "power of 2"},
		{"five dimensions", padTo((&raw{}).head(1, 0).tensor("a", 0, 0, 1, 1, 1, 1, 1).Bytes(), 256), "dimensions"},
		{"no dimensions", padTo((&raw{}).head(1, 0).tensor("a", 0, 0).Bytes(), 256), "dimensions"},
		{"unknown tensor type", padTo((&raw{}).head(1, 0).tensor("a", 4, 0, 32).Bytes(), 256), "unknown tensor type"},
		{"partial block", padTo((&raw{}).head(1, 0).tensor("a", uint32(TypeQ8_0), 0, 33).Bytes(), 256), "block size"},
		{"overflowing shape", padTo((&raw{}).head(1, 0).tensor("a", 0, 0, 1<<40, 1<<40).Bytes(), 256), "overflows"},
		{"tensor larger than the file", padTo((&raw{}).head(1, 0).tensor("a", 0, 0, 1<<20).Bytes(), 256), "larger than the file"},
		{"long name", padTo((&raw{}).head(1, 0).tensor(strings.Repeat("n", 64), 0, 0, 1).Bytes(), 256), "longer than"},
		{"duplicate tensor", padTo((&raw{}).head(2, 0).tensor("a", 0, 0, 1).tensor("a", 0, 32, 1).Bytes(), 256), "duplicate tensor"},
		{"misplaced tensor", padTo((&raw{}).head(2, 0).tensor("a", 0, 0, 1).tensor("b", 0, 64, 1).Bytes(), 256), "expected 32"},
		{"data past the end", padTo((&raw{}).head(1, 0).tensor("a", 0, 0, 16).Bytes(), 80), "ends at byte"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(c.b), int64(len(c.b)))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrInvalid saying %q", err, c.want)
			}
		})
	}
}

func TestWriteRefuses(t *testing.T) {
	f32 := TensorInfo{Name: "a", Shape: []uint64{4}, Type: TypeF32}
	for _, c := range []struct {
		name  string
		kv    []KV
		infos []TensorInfo
	}{
		{"duplicate key", []KV{{"a", "x"}, {"a", "y"}}, nil},
		{"untyped value", []KV{{"a", 3}}, nil},
		{"array of another type", []KV{{"a", Array{ValueUint32, []int32{1}}}}, nil},
		{"bad alignment", []KV{{KeyAlignment, uint32(3)}}, nil},
		{"alignment of another type", []KV{{KeyAlignment, uint64(32)}}, nil},
		{"duplicate tensor", nil, []TensorInfo{f32, f32}},
		{"partial block", nil, []TensorInfo{{Name: "q", Shape: []uint64{31}, Type: TypeQ8_0}}},
		{"unknown type", nil, []TensorInfo{{Name: "q", Shape: []uint64{1}, Type: 5}}},
		{"five dimensions", nil, []TensorInfo{{Name: "q", Shape: []uint64{1, 1, 1, 1, 1}, Type: TypeF32}}},
	} {
		if _, err := NewWriter(&bytes.Buffer{}, c.kv, c.infos); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", c.name, err)
		}
	}
	w, err := NewWriter(&bytes.Buffer{}, nil, []TensorInfo{f32})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor(make([]byte, 15)); err == nil {
		t.Error("15 bytes written for 4 float32")
	}
	w, _ = NewWriter(&bytes.Buffer{}, nil, []TensorInfo{f32})
	if err := w.Close(); err == nil {
		t.Error("closed with a tensor unwritten")
	}
}

func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	d, _ := Encode(TypeQ8_0, make([]float32, 64))
	_ = Write(&buf, allValues(), []Tensor{
		{Info: TensorInfo{Name: "q", Shape: []uint64{32, 2}, Type: TypeQ8_0}, Data: d},
		{Info: TensorInfo{Name: "f", Shape: []uint64{2}, Type: TypeF32}, Data: make([]byte, 8)},
	})
	f.Add(buf.Bytes())
	f.Add((&raw{}).head(1, 0).tensor("a", 0, 0, 16).Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		// What was read is whole: every tensor's data can be read, and the
		// file writes again into one that reads the same.
		var ts []Tensor
		for _, ti := range file.Tensors {
			_, data, err := file.TensorData(ti.Name)
			if err != nil {
				t.Fatalf("tensor %q of a file read: %v", ti.Name, err)
			}
			ts = append(ts, Tensor{Info: ti, Data: data})
		}
		var out bytes.Buffer
		if err := Write(&out, file.KV, ts); err != nil {
			t.Fatalf("rewrite: %v", err)
		}
		again, err := Read(bytes.NewReader(out.Bytes()), int64(out.Len()))
		if err != nil {
			t.Fatalf("reading the rewrite: %v", err)
		}
		if len(again.KV) != len(file.KV) || len(again.Tensors) != len(file.Tensors) {
			t.Fatal("rewrite differs")
		}
	})
}
