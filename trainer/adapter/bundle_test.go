package adapter

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/safetensors"
)

func TestReadWriteRoundTrip(t *testing.T) {
	e := newEngine(t, nativeDefault)
	train(t, e, texts[0], 1, 3)
	srcDir, b := export(t, e)
	want := logprobs(t, e)

	// The engine's own export is F32 too, but in layer order: its on-disk
	// hash is not the canonical one until Write has written it.
	if len(b.Tensors) != 2*3*2 {
		t.Fatalf("%d tensors", len(b.Tensors))
	}
	if !slices.IsSortedFunc(b.Tensors, func(x, y Tensor) int { return strings.Compare(x.Name, y.Name) }) {
		t.Fatalf("tensors not sorted")
	}
	cfg, _ := os.ReadFile(filepath.Join(srcDir, ConfigFile))
	if !bytes.Equal(cfg, b.Config) {
		t.Fatalf("config bytes changed on read")
	}

	h, err := b.Hash()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "v1")
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	if got, err := Hash(dir); err != nil || got != h {
		t.Fatalf("Hash(dir) = %s, %v; Bundle.Hash %s", got, err, h)
	}
	back, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Config, b.Config) || !sameBits(back.Tensors, b.Tensors) {
		t.Fatalf("read back differs")
	}
	if got, _ := back.Hash(); got != h {
		t.Fatalf("hash after round trip %s, want %s", got, h)
	}
	// Written again elsewhere: the same bytes.
	dir2 := filepath.Join(t.TempDir(), "again")
	if err := back.Write(dir2); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ConfigFile, WeightsFile} {
		x, _ := os.ReadFile(filepath.Join(dir, name))
		y, _ := os.ReadFile(filepath.Join(dir2, name))
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs between two writes", name)
		}
	}
	// The hash is the documented one.
	wb, _ := os.ReadFile(filepath.Join(dir, WeightsFile))
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\n%d\n%s%s\n%d\n%s", ConfigFile, len(cfg), cfg, WeightsFile, len(wb), wb))
	if hex.EncodeToString(sum[:]) != h {
		t.Fatalf("hash is not the documented definition")
	}
	// An engine loads what Write wrote and has the trained policy.
	other := newEngine(t, nativeDefault)
	if err := other.LoadAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if got := logprobs(t, other); !slices.Equal(got, want) {
		t.Fatalf("logprobs after load %v, want %v", got, want)
	}
}

func TestWriteReplaces(t *testing.T) {
	e := newEngine(t, nativeDefault)
	_, a := export(t, e)
	train(t, e, texts[1], 1, 2)
	_, b := export(t, e)
	parent := t.TempDir()
	dir := filepath.Join(parent, "current")
	if err := a.Write(dir); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	got, err := Hash(dir)
	want, _ := b.Hash()
	if err != nil || got != want {
		t.Fatalf("after replace: %s %v, want %s", got, err, want)
	}
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 {
		t.Fatalf("left beside the bundle: %v", entries)
	}
	// A file where the directory should be is an error, and stays.
	file := filepath.Join(parent, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	if err := b.Write(file); err == nil {
		t.Fatalf("Write over a file succeeded")
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 2 {
		t.Fatalf("after a failed write: %v", entries)
	}
	// An invalid bundle writes nothing.
	bad := &Bundle{Config: b.Config, Tensors: slices.Clone(b.Tensors)}
	bad.Tensors[0], bad.Tensors[1] = bad.Tensors[1], bad.Tensors[0]
	if err := bad.Write(filepath.Join(parent, "bad")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unsorted bundle: %v", err)
	}
	if _, err := os.Stat(filepath.Join(parent, "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("invalid bundle written: %v", err)
	}
}

// TestReadHalf reads BF16 and F16 bundles, as torch exports them.
func TestReadHalf(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		vals := []float32{0.5, -0.25, 1.5, 3, 0, -1, 0.125, 2}
		dir := writeRaw(t, rankConfig(2), []rawTensor{
			{"m.lora_A.weight", dt, []int{2, 4}, vals},
			{"m.lora_B.weight", dt, []int{1, 2}, vals[:2]},
		}, nil)
		b, err := Read(dir)
		if err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		if !slices.Equal(b.Tensors[0].Data, vals) || !slices.Equal(b.Tensors[1].Data, vals[:2]) {
			t.Fatalf("%s: %+v", dt, b.Tensors)
		}
		// Written back it is F32, so the hash is not the file's.
		h1, _ := Hash(dir)
		h2, _ := b.Hash()
		if h1 == h2 {
			t.Fatalf("%s: bundle hash equals the %s file's", dt, dt)
		}
	}
}

func TestReadRefuses(t *testing.T) {
	good := []rawTensor{
		{"m.lora_A.weight", safetensors.F32, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}},
		{"m.lora_B.weight", safetensors.F32, []int{2, 2}, []float32{1, 2, 3, 4}},
	}
	if _, err := Read(writeRaw(t, rankConfig(2), good, nil)); err != nil {
		t.Fatalf("good bundle: %v", err)
	}
	with := func(i int, f func(*rawTensor)) []rawTensor {
		ts := slices.Clone(good)
		f(&ts[i])
		return ts
	}
	goodFile := encodeRaw(t, good, nil)
	header := func(js string) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
		return append(append(b, js...), make([]byte, 40)...)
	}
	for _, tc := range []struct {
		name    string
		config  string
		weights []byte
		limits  Limits
		want    error
	}{
		{name: "config not json", config: "{", want: ErrInvalid},
		{name: "config json then junk", config: rankConfig(2) + "x", want: ErrInvalid},
		{name: "not lora", config: `{"peft_type":"IA3","r":2,"lora_alpha":4}`, want: ErrInvalid},
		{name: "no rank", config: `{"peft_type":"LORA","lora_alpha":4}`, want: ErrInvalid},
		{name: "rank disagrees", config: rankConfig(3), want: ErrInvalid},
		{name: "nan", weights: encodeRaw(t, with(0, func(r *rawTensor) { r.data = []float32{1, 2, float32(math.NaN()), 4, 5, 6} }), nil), want: ErrInvalid},
		{name: "inf", weights: encodeRaw(t, with(1, func(r *rawTensor) { r.data = []float32{1, float32(math.Inf(-1)), 3, 4} }), nil), want: ErrInvalid},
		{name: "bf16 inf", weights: encodeRaw(t, with(1, func(r *rawTensor) { r.dt, r.data = safetensors.BF16, []float32{1, 2, 3, float32(math.Inf(1))} }), nil), want: ErrInvalid},
		{name: "int dtype", weights: encodeRaw(t, with(1, func(r *rawTensor) { r.dt = safetensors.I32 }), nil), want: ErrInvalid},
		{name: "f64 dtype", weights: encodeRaw(t, with(1, func(r *rawTensor) { r.dt = safetensors.F64 }), nil), want: ErrInvalid},
		{name: "trailing bytes", weights: append(slices.Clone(goodFile), 0, 0, 0, 0), want: ErrInvalid},
		{name: "truncated", weights: goodFile[:len(goodFile)-1], want: ErrInvalid},
		{name: "empty", weights: []byte{}, want: ErrInvalid},
		{name: "header past end", weights: binary.LittleEndian.AppendUint64(nil, 100), want: ErrInvalid},
		{name: "duplicate name", weights: header(`{"a":{"dtype":"F32","shape":[5],"data_offsets":[0,20]},"a":{"dtype":"F32","shape":[5],"data_offsets":[20,40]}}`), want: ErrInvalid},
		{name: "overlap", weights: header(`{"a":{"dtype":"F32","shape":[10],"data_offsets":[0,40]},"b":{"dtype":"F32","shape":[5],"data_offsets":[20,40]}}`), want: ErrInvalid},
		{name: "junk after header", weights: header(`{"a":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}} {}`), want: ErrInvalid},
		{name: "header array", weights: header(`[1,2]`), want: ErrInvalid},
		{name: "empty name", weights: header(`{"":{"dtype":"F32","shape":[10],"data_offsets":[0,40]}}`), want: ErrInvalid},
		{name: "too many params", limits: Limits{MaxParams: 9}, want: ErrTooLarge},
		{name: "too many tensors", limits: Limits{MaxTensors: 1}, want: ErrTooLarge},
		{name: "header too long", limits: Limits{MaxHeaderBytes: 64}, want: ErrTooLarge},
		{name: "config too long", limits: Limits{MaxConfigBytes: 10}, want: ErrTooLarge},
		{name: "negative limit", limits: Limits{MaxParams: -1}, want: ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.config
			if cfg == "" {
				cfg = rankConfig(2)
			}
			dir := writeRaw(t, cfg, good, nil)
			if tc.weights != nil {
				os.WriteFile(filepath.Join(dir, WeightsFile), tc.weights, 0o644)
			}
			_, err := ReadLimited(dir, tc.limits)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// Missing files, and a directory where a file should be.
	dir := writeRaw(t, rankConfig(2), good, nil)
	os.Remove(filepath.Join(dir, ConfigFile))
	if _, err := Read(dir); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), ConfigFile) {
		t.Fatalf("no config: %v", err)
	}
	if _, err := Hash(dir); !errors.Is(err, ErrInvalid) {
		t.Fatalf("hash without config: %v", err)
	}
	dir = writeRaw(t, rankConfig(2), good, nil)
	os.Remove(filepath.Join(dir, WeightsFile))
	if _, err := Read(dir); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), WeightsFile) {
		t.Fatalf("no weights: %v", err)
	}
	os.Mkdir(filepath.Join(dir, WeightsFile), 0o755)
	if _, err := Read(dir); !errors.Is(err, ErrInvalid) {
		t.Fatalf("weights a directory: %v", err)
	}
	if _, err := Hash(dir); !errors.Is(err, ErrInvalid) {
		t.Fatalf("hash of a directory: %v", err)
	}
}

// rankConfig is a minimal PEFT LoRA config of rank r.
func rankConfig(r int) string {
	return fmt.Sprintf(`{"peft_type":"LORA","r":%d,"lora_alpha":%d,"target_modules":["m"]}`, r, 2*r)
}

type rawTensor struct {
	name  string
	dt    safetensors.DType
	shape []int
	data  []float32
}

func encodeRaw(t testing.TB, ts []rawTensor, meta map[string]string) []byte {
	t.Helper()
	var st []safetensors.Tensor
	for _, r := range ts {
		var data []byte
		if r.dt == safetensors.I32 {
			data = make([]byte, 4*len(r.data))
		} else {
			var err error
			if data, err = safetensors.Encode(r.dt, r.data); err != nil {
				t.Fatal(err)
			}
		}
		st = append(st, safetensors.Tensor{Name: r.name, DType: r.dt, Shape: r.shape, Data: data})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, st, meta); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// writeRaw writes a bundle directory byte for byte as given.
func writeRaw(t testing.TB, config string, ts []rawTensor, meta map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, WeightsFile), encodeRaw(t, ts, meta), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
