package torch

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
)

var ctx = context.Background()

var probed struct {
	once sync.Once
	env  Env
	err  error
}

// inCI reports whether the CI environment variable asks for every check
// to run (CI installs PyTorch).
func inCI() bool {
	v := os.Getenv("CI")
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err != nil || b
}

// needTorch returns a Python with torch, or skips the test (fails it in CI).
func needTorch(t testing.TB) string {
	t.Helper()
	probed.once.Do(func() { probed.env, probed.err = Probe(ctx, "") })
	if probed.err != nil {
		const how = "python3 with torch not found (Debian: apt-get install python3-torch libopenblas0-pthread, then /usr/bin/python3 has it)"
		if inCI() {
			t.Fatalf("%s; CI is set, so the torch engine's tests may not be skipped: %v", how, probed.err)
		}
		t.Skip(how)
	}
	return probed.env.Python
}
