package sim

import (
	"os/exec"
	"strings"
	"testing"
)

// transports are what the simulator must not link, even through another
// package: it runs the protocol's pure code (package doc), and a package
// of that code that pulled in a transport would have moved I/O back in.
var transports = []string{"go-libp2p", "quic-go", "hashicorp/raft"}

// TestNoTransportDeps lists the simulator's dependencies (its non-test
// build) and fails on any transport among them, naming the imports that
// lead there.
func TestNoTransportDeps(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	var order []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		imports[f[0]] = f[1:]
		order = append(order, f[0])
	}
	// go list -deps prints a package after everything it imports: the
	// simulator comes last.
	root := order[len(order)-1]
	via := map[string]string{root: ""} // package → the package that imports it, on a shortest path from root
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range imports[p] {
			if _, seen := via[q]; !seen {
				via[q] = p
				queue = append(queue, q)
			}
		}
	}
	for _, p := range order {
		if !isTransport(p) || isTransport(via[p]) {
			continue // report each transport once, where the chain enters it
		}
		chain := []string{p}
		for q := via[p]; q != ""; q = via[q] {
			chain = append(chain, q)
		}
		for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
			chain[i], chain[j] = chain[j], chain[i]
		}
		t.Errorf("%s links %s: %s", root, p, strings.Join(chain, " → "))
	}
}

func isTransport(p string) bool {
	for _, s := range transports {
		if strings.Contains(p, s) {
			return true
		}
	}
	return false
}
