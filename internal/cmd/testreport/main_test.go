package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReport runs `go test -json` on a package written for it (a test
// that passes, one that fails with output, a subtest skipped with a
// reason, one skipped with none) and checks the view and the summary.
func TestReport(t *testing.T) {
	got := reportOn(t, map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.26\n",
		"m_test.go": `package m

import "testing"

func TestPasses(t *testing.T) { t.Log("quiet") }
func TestFails(t *testing.T) { t.Log("what went wrong"); t.Fail() }
func TestFailsInSub(t *testing.T) {
	t.Run("deep", func(t *testing.T) { t.Error("deeper") })
}
func TestSkips(t *testing.T) {
	t.Run("sub", func(t *testing.T) { t.Skip("wat2wasm is not installed") })
}
func TestSkipsSilently(t *testing.T) { t.SkipNow() }`,
	})
	for _, want := range []string{"what went wrong", "--- FAIL: TestFails", "FAIL\texample.com/m",
		"== 2 tests were skipped:", "   example.com/m TestSkips/sub: wat2wasm is not installed", "   example.com/m TestSkipsSilently: (no reason given)",
		"== 2 tests failed:\n   example.com/m TestFails\n      |     m_test.go:6: what went wrong\n",
		"   example.com/m TestFailsInSub/deep\n      |     m_test.go:8: deeper\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "   example.com/m TestFailsInSub\n") {
		t.Errorf("the parent of a failed subtest named in the summary:\n%s", got)
	}
	if i, j := strings.Index(got, "skipped:"), strings.Index(got, "tests failed:"); i < 0 || j < i {
		t.Errorf("the failures are not last:\n%s", got)
	}
	for _, bad := range []string{"quiet", "=== RUN", "TestPasses"} {
		if strings.Contains(got, bad) {
			t.Errorf("%q shown, as go test would not without -v:\n%s", bad, got)
		}
	}
}

// TestReportBinaryDied: a test binary that dies in the middle of a test
// (here an os.Exit) ends no test; the summary names the test that was
// running, with what it printed, and the package's own last words.
func TestReportBinaryDied(t *testing.T) {
	got := reportOn(t, map[string]string{
		"go.mod": "module example.com/d\n\ngo 1.26\n",
		"d_test.go": `package d

import (
	"fmt"
	"os"
	"testing"
)

func TestFirst(t *testing.T) {}
func TestDies(t *testing.T) { fmt.Println("what it was doing"); os.Exit(3) }
`,
	})
	for _, want := range []string{"   example.com/d TestDies (running when the package failed)\n      | what it was doing\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	for _, bad := range []string{"TestFirst"} {
		if strings.Contains(got, bad) {
			t.Errorf("%q shown, as go test would not without -v:\n%s", bad, got)
		}
	}
}

// reportOn writes files (a module) into a directory, runs `go test -json`
// there, and returns what the report and its summary print of it.
func reportOn(t *testing.T, files map[string]string) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	dir := t.TempDir()
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), "GOFLAGS=-mod=mod")
	js, _ := cmd.Output() // the tests written for the report fail
	var out strings.Builder
	res, err := report(strings.NewReader(string(js)), &out)
	if err != nil {
		t.Fatal(err)
	}
	summary(&out, res)
	return out.String()
}
