// Package llamacpp is for tests: it finds real llama.cpp, run through the npm
// package node-llama-cpp installed in this directory (`npm ci` here, with a
// Node.js of version 20 or later), and says where its probe script is. Tests
// that check GGUF files against llama.cpp call Require first: it skips the
// test when Node.js or the npm packages are missing, and fails it instead
// when CLAWMESH_REQUIRE_LLAMACPP=1 (scripts/test.sh sets it once the install
// succeeded), so a missing llama.cpp is never passed over in silence.
package llamacpp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// MinNodeMajor is the oldest Node.js major version node-llama-cpp runs on.
const MinNodeMajor = 20

// Dir returns this package's directory (where package.json, node_modules and
// probe.mjs are), found from this source file's path.
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	return filepath.Dir(file)
}

// Probe returns the path of probe.mjs, the script that loads a GGUF model
// (and LoRA adapters) with llama.cpp and prints next-token probabilities.
func Probe() string { return filepath.Join(Dir(), "probe.mjs") }

// NodeBin returns a Node.js binary of version MinNodeMajor or later:
// $CLAWMESH_NODE_BIN_DIR/node first, then `node` on PATH.
func NodeBin() (string, error) {
	var tried []string
	var cands []string
	if d := os.Getenv("CLAWMESH_NODE_BIN_DIR"); d != "" {
		cands = append(cands, filepath.Join(d, "node"))
	}
	if p, err := exec.LookPath("node"); err == nil {
		cands = append(cands, p)
	}
	for _, c := range cands {
		major, err := nodeMajor(c)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		if major >= MinNodeMajor {
			return c, nil
		}
		tried = append(tried, fmt.Sprintf("%s: version %d is older than %d", c, major, MinNodeMajor))
	}
	if len(tried) == 0 {
		return "", errors.New("llamacpp: no node binary (neither $CLAWMESH_NODE_BIN_DIR/node nor node on PATH)")
	}
	return "", fmt.Errorf("llamacpp: no node >= %d: %s", MinNodeMajor, strings.Join(tried, "; "))
}

// nodeMajor runs `bin --version` and parses "v20.1.2" into 20.
func nodeMajor(bin string) (int, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0, err
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0, fmt.Errorf("unexpected version %q", strings.TrimSpace(string(out)))
	}
	return n, nil
}

// Require returns a Node.js binary that can run node-llama-cpp from Dir. When
// there is none, or node_modules/node-llama-cpp is not installed, it skips
// the test, or fails it when CLAWMESH_REQUIRE_LLAMACPP=1.
func Require(t testing.TB) (node string) {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("CLAWMESH_REQUIRE_LLAMACPP") == "1" {
			t.Fatalf("CLAWMESH_REQUIRE_LLAMACPP=1 but %s", why)
		}
		t.Skipf("%s (scripts/test.sh installs it: `npm ci` in internal/llamacpp with node >= %d)", why, MinNodeMajor)
	}
	node, err := NodeBin()
	if err != nil {
		missing(err.Error())
		return ""
	}
	if _, err := os.Stat(filepath.Join(Dir(), "node_modules", "node-llama-cpp", "package.json")); err != nil {
		missing("node-llama-cpp is not installed in " + Dir())
		return ""
	}
	return node
}
