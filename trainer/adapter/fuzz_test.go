package adapter

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

// fuzzLimits keep a fuzzer's allocations small.
var fuzzLimits = Limits{MaxParams: 1 << 16, MaxTensors: 64, MaxHeaderBytes: 1 << 14}

func seedTensors() []rawTensor {
	return []rawTensor{
		{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", safetensors.F32, []int{2, 3}, []float32{1, -2, 3, 0.5, 0, -1e-3}},
		{"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", safetensors.F32, []int{4, 2}, []float32{0, 0, 1, 2, 3, 4, 5, 6}},
		{"z", safetensors.F32, []int{}, []float32{7}},
	}
}

func FuzzUnmarshalDelta(f *testing.F) {
	d := &Delta{Parent: strings.Repeat("0f", 32)}
	for _, r := range seedTensors() {
		d.Tensors = append(d.Tensors, Tensor{Name: r.name, Shape: r.shape, Data: r.data})
	}
	b, err := d.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	half := seedTensors()
	for i := range half {
		half[i].dt = safetensors.BF16
	}
	f.Add(encodeRaw(f, half, map[string]string{"format": deltaFormat}))
	f.Add(b[:len(b)/2])
	f.Add([]byte{})
	f.Add([]byte("\x10\x00\x00\x00\x00\x00\x00\x00{}              "))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := UnmarshalDelta(b, fuzzLimits)
		if err != nil {
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("decoded an invalid delta: %v", err)
		}
		if n := d.Norm(); math.IsNaN(n) || math.IsInf(n, 0) {
			t.Fatalf("decoded a delta of norm %v", n)
		}
		enc, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := UnmarshalDelta(enc, Limits{})
		if err != nil || back.Parent != d.Parent || !sameBits(back.Tensors, d.Tensors) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// FuzzRead reads a bundle whose safetensors file is the input. It fuzzes
// what Read does once the files are in memory: writing a file per input
// would make the disk, not the decoder, what is measured.
func FuzzRead(f *testing.F) {
	cfg := []byte(rankConfig(2))
	good := encodeRaw(f, seedTensors(), map[string]string{"format": "pt"})
	f.Add(good)
	half := seedTensors()
	for i := range half {
		half[i].dt = []safetensors.DType{safetensors.BF16, safetensors.F16}[i%2]
	}
	f.Add(encodeRaw(f, half, nil))
	f.Add(good[:len(good)-3])
	f.Add(good[8:])
	// The seeds read from disk as they parse in memory.
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), cfg, 0o644); err != nil {
		f.Fatal(err)
	}
	for _, b := range [][]byte{good, good[8:]} {
		if err := os.WriteFile(filepath.Join(dir, WeightsFile), b, 0o644); err != nil {
			f.Fatal(err)
		}
		_, rerr := ReadLimited(dir, fuzzLimits)
		_, perr := parseBundle(cfg, b, fuzzLimits)
		if (rerr == nil) != (perr == nil) {
			f.Fatalf("Read: %v; parse: %v", rerr, perr)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		bu, err := parseBundle(cfg, b, fuzzLimits)
		if err != nil {
			return
		}
		if err := bu.Validate(); err != nil {
			t.Fatalf("read an invalid bundle: %v", err)
		}
		// What Write would write reads back the same.
		wb, err := bu.encodeWeights()
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		back, err := parseBundle(cfg, wb, fuzzLimits)
		if err != nil || !sameBits(back.Tensors, bu.Tensors) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}
