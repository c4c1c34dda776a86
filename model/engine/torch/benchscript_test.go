package torch

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchScript runs the GPU check and benchmark script on the CPU, so
// that the machine with a GPU finds it working: the shared vectors must
// pass on the device it is given, and the benchmark must produce its row.
func TestBenchScript(t *testing.T) {
	py := needTorch(t)
	abs, err := filepath.Abs(vectorsDir)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(py, append([]string{"-m", "clawmesh_torch.bench"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+mustAbs(t, "worker"), "PYTHONDONTWRITEBYTECODE=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bench.py %v: %v\n%s\n%s", args, err, out, stderr.Bytes())
		}
		return out
	}
	var res map[string]any
	if err := json.Unmarshal(run("--check", "--device", "cpu", "--vectors", abs), &res); err != nil {
		t.Fatal(err)
	}
	if res["ok"] != true {
		t.Fatalf("check: %v", res)
	}
	out := run("--bench", "--device", "cpu", "--shapes", "tiny", "--seqs", "2", "--seq-len", "16", "--steps", "1", "--rounds", "1", "--json")
	var row map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(out), &row); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if v, _ := row["clawmesh_tokens_per_s"].(float64); !(v > 0) || !strings.Contains(string(out), `"shape": "tiny"`) {
		t.Fatalf("bench row %s", out)
	}
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestBenchPrintDevice: on CUDA the result names the GPU, its measured
// matmul rate, the train step's MFU against it and the peak memory.
func TestBenchPrintDevice(t *testing.T) {
	r := BenchResult{Model: "m", Params: 6e8, Seqs: 8, SeqLen: 1024, FLOPsPerStep: 1e13,
		Subject: EngineFigures{Engine: "torch", Device: DeviceCUDA, TrainTokensPerSec: 20000, TrainFLOPS: 2.5e14},
		Device:  &DeviceStats{Device: "cuda:0", DType: "bfloat16", Name: "NVIDIA H100", PeakMemory: 3 << 30, TotalMemory: 80 << 30, MatmulFLOPS: 7.5e14},
		MFU:     1.0 / 3}
	var b bytes.Buffer
	r.Print(&b)
	for _, want := range []string{"torch  cuda  train   20000.0 tok/s", "NVIDIA H100 (cuda:0): bfloat16 matmul 750.0 TFLOP/s",
		"train MFU 33.3%", "peak memory 3.00 GiB of 80.0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
}
