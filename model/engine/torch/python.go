package torch

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"
)

// The worker's Python sources, written next to the engine's state when it
// starts, so that the binary alone is enough.
//
//go:embed worker/clawmesh_torch/*.py
var workerFS embed.FS

// writeWorker writes the worker package under dir (dir/clawmesh_torch) and
// returns dir, the PYTHONPATH to run it with.
func writeWorker(dir string) (string, error) {
	pkg := filepath.Join(dir, "clawmesh_torch")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		return "", err
	}
	err := fs.WalkDir(workerFS, "worker/clawmesh_torch", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := workerFS.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(pkg, filepath.Base(p)), b, 0o644)
	})
	return dir, err
}

// Env describes a Python with PyTorch.
type Env struct {
	// Python is the interpreter's path.
	Python string `json:"python"`
	// Torch is torch.__version__.
	Torch string `json:"torch"`
	// CUDA reports whether torch sees a CUDA device; GPUs counts them.
	CUDA bool `json:"cuda"`
	GPUs int  `json:"gpus"`
}

// HowToInstall says how to get PyTorch, for error messages.
const HowToInstall = "install PyTorch for Python 3 (Debian or Ubuntu, CPU: apt-get install python3-torch libopenblas0-pthread; " +
	"otherwise pip install torch, with the CUDA build from pytorch.org for a GPU) or set CLAWMESH_PYTHON " +
	"to a Python that has it; --engine native needs no PyTorch"

const probeScript = `import json, torch
c = torch.cuda.is_available()
print(json.dumps({"torch": torch.__version__, "cuda": c, "gpus": torch.cuda.device_count() if c else 0}))`

// Candidates lists the interpreters tried, in order, when none is named:
// $CLAWMESH_PYTHON alone when it is set, else python3 on PATH, then
// Debian's /usr/bin/python3.
func Candidates() []string {
	if p := os.Getenv("CLAWMESH_PYTHON"); p != "" {
		return []string{p}
	}
	return []string{"python3", "/usr/bin/python3"}
}

// Probe finds a Python that imports torch: python if given, else the first
// of Candidates that does. It fails with ErrUnavailable, saying how to get
// PyTorch, when none does.
func Probe(ctx context.Context, python string) (Env, error) {
	cands := Candidates()
	if python != "" {
		cands = []string{python}
	}
	var tried []string
	seen := map[string]bool{}
	for _, c := range cands {
		p, err := exec.LookPath(c)
		if err != nil {
			tried = append(tried, c+" (not found)")
			continue
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		cmd := exec.CommandContext(pctx, p, "-c", probeScript)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err = cmd.Run()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return Env{}, ctx.Err()
			}
			why := "cannot import torch"
			if l := strings.TrimSpace(string(lastLine(errb.Bytes()))); l != "" {
				why += ": " + truncate(l, 200)
			}
			tried = append(tried, c+" ("+why+")")
			continue
		}
		var env Env
		if err := json.Unmarshal(bytes.TrimSpace(lastLine(out.Bytes())), &env); err != nil {
			tried = append(tried, c+" (unexpected output)")
			continue
		}
		env.Python = p
		return env, nil
	}
	return Env{}, fmt.Errorf("%w: tried %s; %s", ErrUnavailable, strings.Join(tried, ", "), HowToInstall)
}

// truncate cuts s to at most n bytes, at a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}
