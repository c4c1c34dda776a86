package torch

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
)

func sampleFrames() []*frame {
	return []*frame{
		{op: opHello, id: 0, meta: metaOf(map[string]int{"protocol": ProtocolVersion})},
		{op: opLogprobs, id: 7, meta: metaOf(map[string]bool{"base": true}),
			tensors: []tensor{i32Tensor([]int32{2, 3}), i32Tensor([]int32{1, 2, 3, 4, 5})}},
		{op: opTrain, id: 8, tensors: []tensor{f32Tensor([]float32{1.5, -2}), u8Tensor([]bool{true, false}),
			{dt: dtF64, dims: []uint32{2, 1}, data: make([]byte, 16)}, {dt: dtI64, dims: []uint32{0}}}},
		{op: opResult, id: 9},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var stream []byte
	for _, f := range sampleFrames() {
		var err error
		if stream, err = f.encode(stream); err != nil {
			t.Fatal(err)
		}
	}
	r := bytes.NewReader(stream)
	for i, want := range sampleFrames() {
		got, err := readFrame(r)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		for j := range got.tensors {
			if len(got.tensors[j].data) == 0 {
				got.tensors[j].data = nil
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("frame %d: %+v, want %+v", i, got, want)
		}
	}
	if _, err := readFrame(r); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
	ints, _ := sampleFrames()[1].tensors[1].ints()
	fl, _ := sampleFrames()[2].tensors[0].floats()
	if !reflect.DeepEqual(ints, []int{1, 2, 3, 4, 5}) || !reflect.DeepEqual(fl, []float32{1.5, -2}) {
		t.Fatalf("decoded %v %v", ints, fl)
	}
	if _, err := sampleFrames()[2].tensors[0].ints(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("float tensor read as ints: %v", err)
	}
}

// refusedFrames are frame bodies (after the length prefix) that both ends
// must refuse.
func refusedFrames(t *testing.T) map[string][]byte {
	good, err := sampleFrames()[1].encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	body := good[4:]
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), body...)) }
	return map[string][]byte{
		"magic":      mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":    mut(func(b []byte) []byte { b[4] = 9; return b }),
		"truncated":  body[:len(body)-1],
		"trailing":   append(append([]byte(nil), body...), 0),
		"meta":       mut(func(b []byte) []byte { b[headerSize] = '['; return b }),
		"dtype":      mut(func(b []byte) []byte { b[headerSize+len(`{"base":true}`)] = 42; return b }),
		"meta size":  mut(func(b []byte) []byte { b[12] = 0xff; b[13] = 0xff; return b }),
		"huge dims":  mut(func(b []byte) []byte { i := headerSize + len(`{"base":true}`) + 4; b[i+3] = 0x7f; return b }),
		"short head": body[:10],
		"ndim":       mut(func(b []byte) []byte { b[headerSize+len(`{"base":true}`)+1] = 9; return b }),
		"bad json":   mut(func(b []byte) []byte { b[headerSize+len(`{"base":true}`)-2] = 'x'; return b }),
	}
}

func TestFrameRefusals(t *testing.T) {
	for name, b := range refusedFrames(t) {
		if _, err := decodeFrame(b); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A frame's length prefix beyond the limit is refused before reading.
	if _, err := readFrame(bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff})); !errors.Is(err, ErrProtocol) {
		t.Errorf("huge frame: %v", err)
	}
	if _, err := (&frame{tensors: []tensor{{dt: dtF32, dims: []uint32{3}, data: make([]byte, 8)}}}).encode(nil); !errors.Is(err, ErrProtocol) {
		t.Errorf("tensor of the wrong size encoded: %v", err)
	}
}

func TestErrorCodes(t *testing.T) {
	for code, want := range map[string]error{"oom": engine.ErrOutOfMemory, "bad_input": engine.ErrBadInput,
		"adapter": engine.ErrAdapter, "model": ErrModel, "config": ErrModel, "internal": ErrWorker, "new": ErrWorker} {
		err := errorOf(&frame{op: opError, meta: metaOf(workerError{Code: code, Message: "m"})})
		if !errors.Is(err, want) {
			t.Errorf("%s: %v", code, err)
		}
	}
}

// FuzzDecodeFrame: any bytes decode to a frame or an ErrProtocol, never a
// panic, and a decoded frame encodes to a frame that decodes the same.
func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range sampleFrames() {
		b, _ := fr.encode(nil)
		f.Add(b[4:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := decodeFrame(b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not ErrProtocol", err)
			}
			return
		}
		enc, err := fr.encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeFrame(enc[4:])
		if err != nil || again.op != fr.op || again.id != fr.id || len(again.tensors) != len(fr.tensors) ||
			!bytes.Equal(again.meta, fr.meta) {
			t.Fatalf("re-decoded %+v (%v), want %+v", again, err, fr)
		}
		for i := range fr.tensors {
			if !bytes.Equal(again.tensors[i].data, fr.tensors[i].data) || !reflect.DeepEqual(again.tensors[i].dims, fr.tensors[i].dims) {
				t.Fatalf("tensor %d changed", i)
			}
		}
	})
}

// pythonFrames has the worker's reader (protocol.py) read each frame body
// and say what it found.
const pythonFrames = `import json, socket, struct, sys
from clawmesh_torch import protocol as P
from clawmesh_torch.safetensors_io import tensor_bytes
out = []
for h in json.load(sys.stdin):
    body = bytes.fromhex(h)
    a, b = socket.socketpair()
    a.sendall(struct.pack("<I", len(body)) + body)
    a.close()
    try:
        f = P.read(b)
        out.append({"op": f.op, "id": f.id, "meta": f.meta,
                    "tensors": [[P._CODE[t.dtype], list(t.shape), tensor_bytes(t.contiguous()).hex()] for t in f.tensors]})
    except P.ProtocolError as e:
        out.append({"refused": str(e)})
    b.close()
print(json.dumps(out))
`

// TestPythonFrames: the worker's frame reader decodes what the Go side
// encodes, to the same op, id, meta and tensors, and refuses what the Go
// reader refuses (two implementations of PROTOCOL.md, checked against each
// other).
func TestPythonFrames(t *testing.T) {
	py := needTorch(t)
	var in []string
	for _, f := range sampleFrames() {
		b, err := f.encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, hex.EncodeToString(b[4:]))
	}
	bad := refusedFrames(t)
	names := slices.Sorted(maps.Keys(bad))
	for _, n := range names {
		in = append(in, hex.EncodeToString(bad[n]))
	}
	pyDir, err := writeWorker(filepath.Join(t.TempDir(), "py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", pythonFrames)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stdin = strings.NewReader(string(metaOf(in)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.Bytes())
	}
	var got []struct {
		Op      uint8          `json:"op"`
		ID      uint32         `json:"id"`
		Meta    map[string]any `json:"meta"`
		Tensors [][3]any       `json:"tensors"`
		Refused *string        `json:"refused"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(in) {
		t.Fatalf("%d results for %d frames (%v): %s", len(got), len(in), err, out)
	}
	for i, want := range sampleFrames() {
		g := got[i]
		if g.Refused != nil {
			t.Errorf("frame %d refused: %s", i, *g.Refused)
			continue
		}
		var wm map[string]any
		if len(want.meta) > 0 {
			json.Unmarshal(want.meta, &wm)
		}
		if g.Op != want.op || g.ID != want.id || len(g.Tensors) != len(want.tensors) || fmt.Sprint(g.Meta) != fmt.Sprint(wm) {
			t.Errorf("frame %d: python read op %d id %d meta %v, %d tensors; want %d %d %v %d", i, g.Op, g.ID, g.Meta, len(g.Tensors), want.op, want.id, wm, len(want.tensors))
			continue
		}
		for j, wt := range want.tensors {
			dims := make([]any, len(wt.dims))
			for k, d := range wt.dims {
				dims[k] = float64(d)
			}
			gt := g.Tensors[j]
			if gt[0] != float64(wt.dt) || fmt.Sprint(gt[1]) != fmt.Sprint(dims) || gt[2] != hex.EncodeToString(wt.data) {
				t.Errorf("frame %d tensor %d: python %v, want dtype %d dims %v data %x", i, j, gt, wt.dt, wt.dims, wt.data)
			}
		}
	}
	for k, n := range names {
		if g := got[len(sampleFrames())+k]; g.Refused == nil {
			t.Errorf("%s: the worker's reader accepted it", n)
		}
	}
}
