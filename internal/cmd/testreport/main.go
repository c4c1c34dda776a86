// Command testreport reads `go test -json` on its standard input and prints
// what `go test` prints without it (each package's result line, and the
// whole output of a test that failed), then a summary of the tests that
// were skipped and why, so that a missing tool or library (wat2wasm,
// PyTorch, the OpenClaw agent) is seen rather than silently passed over,
// and last the tests that failed with the end of their output, so that a
// log read from its end (a CI page) names them.
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

// failure is a test that failed (Test is empty for a package that failed
// outside its tests: a build error, a panic, a timeout) and the last lines
// of its output.
type failure struct {
	Package, Test string
	Tail          []string
}

// tailLines is how many of a failed test's last output lines the summary
// repeats.
const tailLines = 12

// results is what report found.
type results struct {
	skips []skip
	fails []failure
}

func main() {
	to := flag.String("summary", "", "write the summary of skipped tests to this file instead of after the report")
	flag.Parse()
	res, err := report(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	if *to == "" {
		summary(os.Stdout, res)
		return
	}
	var b strings.Builder
	summary(&b, res)
	if err := os.WriteFile(*to, []byte(b.String()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}

// report copies the non-verbose view of the events to w and returns the
// skipped and the failed tests.
func report(r io.Reader, w io.Writer) (results, error) {
	type key struct{ pkg, test string }
	out := map[key][]string{}
	var res results
	failedIn := map[string]bool{} // packages with a failed test
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
					out[k] = append(out[k], e.Output)
				}
				continue
			}
			out[k] = append(out[k], e.Output)
		case "fail":
			var shown []string
			for _, l := range out[k] {
				if !strings.HasPrefix(l, "=== ") {
					shown = append(shown, l)
				}
			}
			if e.Test != "" {
				for _, l := range shown {
					io.WriteString(w, l)
				}
				failedIn[e.Package] = true
				res.fails = append(res.fails, failure{e.Package, e.Test, tail(shown)})
			} else {
				// Tests of the package that started and never ended were
				// running when its binary died (killed, or an os.Exit):
				// what they printed is all there is to say why.
				var running []string
				for r := range out {
					if r.pkg == e.Package && r.test != "" {
						running = append(running, r.test)
					}
				}
				sort.Strings(running)
				for _, name := range running {
					var lines []string
					for _, l := range out[key{e.Package, name}] {
						if !strings.HasPrefix(l, "=== ") {
							io.WriteString(w, l)
							lines = append(lines, l)
						}
					}
					res.fails = append(res.fails, failure{e.Package, name + " (running when the package failed)", tail(lines)})
					delete(out, key{e.Package, name})
				}
				if !failedIn[e.Package] {
					// The package failed with no failed test: its own
					// output (a build error, a panic, a timeout, how the
					// binary ended) says why.
					res.fails = append(res.fails, failure{e.Package, "", tail(shown)})
				}
			}
			delete(out, k)
		case "skip":
			if e.Test != "" {
				res.skips = append(res.skips, skip{e.Package, e.Test, reason(out[k])})
			}
			delete(out, k)
		case "pass":
			delete(out, k)
		}
	}
	return res, sc.Err()
}

// tail is the last tailLines of lines that say something, without the
// "--- FAIL" lines of subtests and parents that the summary's names repeat.
func tail(lines []string) []string {
	var kept []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || t == "FAIL" || strings.HasPrefix(t, "--- FAIL") {
			continue
		}
		kept = append(kept, strings.TrimRight(l, "\n"))
	}
	if len(kept) > tailLines {
		kept = kept[len(kept)-tailLines:]
	}
	return kept
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

// summary writes the skipped tests, then the failed ones: a failed parent
// test whose subtests failed is named by those subtests only.
func summary(w io.Writer, res results) {
	skipSummary(w, res.skips)
	var fails []failure
	for _, f := range res.fails {
		parent := false
		for _, g := range res.fails {
			if g.Package == f.Package && f.Test != "" && strings.HasPrefix(g.Test, f.Test+"/") {
				parent = true
				break
			}
		}
		if !parent {
			fails = append(fails, f)
		}
	}
	if len(fails) == 0 {
		return
	}
	n := "tests failed"
	if len(fails) == 1 {
		n = "test failed"
	}
	fmt.Fprintf(w, "== %d %s:\n", len(fails), n)
	for _, f := range fails {
		name := f.Test
		if name == "" {
			name = "(the package itself)"
		}
		fmt.Fprintf(w, "   %s %s\n", strings.TrimPrefix(f.Package, "github.com/clawmesh/clawmesh/"), name)
		for _, l := range f.Tail {
			fmt.Fprintf(w, "      | %s\n", l)
		}
	}
}

func skipSummary(w io.Writer, skips []skip) {
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
