package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/node/adapters"
)

// TestPrintWeights: `weights ls` adds the held-out pass@1 column when a
// version was evaluated, one cell per version (empty for one that was
// not), and prints the table as before when none was.
func TestPrintWeights(t *testing.T) {
	bundle, hash := strings.Repeat("0", 64), strings.Repeat("ab", 32)
	st := adapters.Status{Serving: "v2", Latest: "v3", Driver: "clawmesh", Versions: []adapters.Version{
		{Version: "v3", State: "known", Bytes: 1 << 20, Bundle: bundle, Hash: hash, Term: 2, Index: 30, Evals: []adapters.Eval{
			{Task: strings.Repeat("a1", 32), Prompts: 4, Passed: 4, PassAt1: 1}, {Task: strings.Repeat("b2", 32), Prompts: 10, Passed: 1, PassAt1: 0.1}}},
		{Version: "v2", State: "serving", Bytes: 1 << 20, Bundle: bundle, Hash: hash, Term: 2, Index: 20, Evals: []adapters.Eval{{Task: strings.Repeat("a1", 32), Prompts: 4, Passed: 3, PassAt1: 0.75}}},
		{Version: "v1", State: "installed", Bytes: 1 << 20, Bundle: bundle, Hash: hash, Term: 1, Index: 10},
	}}
	var buf bytes.Buffer
	printWeights(&buf, st)
	lines := map[string]string{}
	for _, l := range strings.Split(buf.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = strings.Join(f, " ")
		}
	}
	for first, want := range map[string]string{
		"VERSION": "VERSION HASH STATE SIZE BUNDLE TERM INDEX HELD-OUT PASS@1",
		"v3":      "v3 abababababab known 1.0 MiB 000000000000 2 30 a1a1a1a1 1.00 (4/4), b2b2b2b2 0.10 (1/10)",
		"v2":      "v2 abababababab serving 1.0 MiB 000000000000 2 20 0.75 (3/4)",
		"v1":      "v1 abababababab installed 1.0 MiB 000000000000 1 10",
	} {
		if lines[first] != want {
			t.Errorf("line %q, want %q in:\n%s", lines[first], want, buf.String())
		}
	}

	for i := range st.Versions {
		st.Versions[i].Evals = nil
	}
	buf.Reset()
	printWeights(&buf, st)
	if strings.Contains(buf.String(), "PASS@1") || !strings.Contains(buf.String(), "VERSION  HASH          STATE      SIZE     BUNDLE        TERM  INDEX\n") {
		t.Fatalf("without evaluations the table changed:\n%s", buf.String())
	}
}

// TestWeightsArgs: a bad version name is a usage error (exit 2) that names
// the forms taken, whether or not a node runs on the data directory.
func TestWeightsArgs(t *testing.T) {
	data := t.TempDir()
	for _, args := range [][]string{
		{"weights", "get", "v0x"}, {"weights", "get", "base"}, {"weights", "get", "v0"},
		{"weights", "use", "3"}, {"weights", "use", "newest"},
		{"weights", "get"}, {"weights", "use", "v1", "v2"}, {"weights", "ls", "v1"}, {"weights", "pin", "v1"}, {"weights"},
	} {
		_, errs, code := runCLI(t, append(args, "--data", data)...)
		if code != 2 || !strings.Contains(errs, "--help") {
			t.Errorf("%q: exit %d, %s", args, code, errs)
		}
	}
	// Good names get as far as looking for the node.
	for _, args := range [][]string{{"weights", "get", "v3"}, {"weights", "use", "base"}, {"weights", "use", "latest"}, {"weights", "use", "v12"}, {"weights", "ls"}} {
		_, errs, code := runCLI(t, append(args, "--data", data)...)
		if code != 1 || !strings.Contains(errs, "no node runs") {
			t.Errorf("%q: exit %d, %s", args, code, errs)
		}
	}
}
