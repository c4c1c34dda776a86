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
