// Command testreport reads `go test -json` on its standard input and prints
// what `go test` prints without it (each package's result line, and the
// whole output of a test that failed), then a summary of the tests that
// were skipped and why, so that a missing tool or library (wat2wasm,
// PyTorch, the OpenClaw agent) is seen rather than silently passed over.
// scripts/test.sh runs the tests through it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// skip is a skipped test and the reason it gave.
type skip struct {
	Package, Test, Reason string
}

func main() {
	to := flag.String("summary", "", "write the summary of skipped tests to this file instead of after the report")
	flag.Parse()
	skips, err := report(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	if *to == "" {
		summary(os.Stdout, skips)
		return
	}
	var b strings.Builder
	summary(&b, skips)
	if err := os.WriteFile(*to, []byte(b.String()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}

// report copies the non-verbose view of the events to w and returns the
// skipped tests.
func report(r io.Reader, w io.Writer) ([]skip, error) {
	type key struct{ pkg, test string }
	out := map[key][]string{}
	var skips []skip
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not an event (a build error printed as is): pass it on.
			fmt.Fprintln(w, string(line))
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			if e.Test == "" {
				if t := strings.TrimSpace(e.Output); t != "PASS" && !strings.HasPrefix(t, "=== ") {
					io.WriteString(w, e.Output)
				}
				continue
			}
			out[k] = append(out[k], e.Output)
		case "fail":
			if e.Test != "" {
				for _, l := range out[k] {
					if !strings.HasPrefix(l, "=== ") {
						io.WriteString(w, l)
					}
				}
			}
			delete(out, k)
		case "skip":
			if e.Test != "" {
				skips = append(skips, skip{e.Package, e.Test, reason(out[k])})
			}
			delete(out, k)
		case "pass":
			delete(out, k)
		}
	}
	return skips, sc.Err()
}

// reason is what a skipped test said: its output, less the run and skip
// lines and the file:line of each message.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case t == "" || strings.HasPrefix(t, "--- ") || strings.HasPrefix(t, "=== "):
		default:
			// "file_test.go:12: reason": the reason.
			if i := strings.Index(t, ": "); i > 0 && strings.Contains(t[:i], ".go:") {
				t = t[i+2:]
			}
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

func summary(w io.Writer, skips []skip) {
	if len(skips) == 0 {
		fmt.Fprintln(w, "== no test was skipped")
		return
	}
	sort.Slice(skips, func(i, j int) bool {
		if skips[i].Package != skips[j].Package {
			return skips[i].Package < skips[j].Package
		}
		return skips[i].Test < skips[j].Test
	})
	n := "tests were"
	if len(skips) == 1 {
		n = "test was"
	}
	fmt.Fprintf(w, "== %d %s skipped:\n", len(skips), n)
	for _, s := range skips {
		fmt.Fprintf(w, "   %s %s: %s\n", strings.TrimPrefix(s.Package, "github.com/clawmesh/clawmesh/"), s.Test, s.Reason)
	}
}
