package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/clawmesh/clawmesh"

// pkg is what the rules read of one package.
type pkg struct {
	Path    string   // relative to the module: "model/serve"
	Imports []string // its own (non-test) imports of the module's packages, relative
	Ext     []string // its imports from outside the module
	Deps    []string // every package its build links, relative where ours, full otherwise
}

// under reports whether p is root or below it.
func under(p, root string) bool { return p == root || strings.HasPrefix(p, root+"/") }

// helperPkg reports whether p exists for tests: a *test package
// (servetest, pooltest) or the fake upstream.
func helperPkg(p string) bool {
	last := p[strings.LastIndex(p, "/")+1:]
	return strings.HasSuffix(last, "test") || p == "internal/fakeupstream"
}

// benchPkg reports whether p is a benchmark or harness package, which may
// use what tests use.
func benchPkg(p string) bool {
	last := p[strings.LastIndex(p, "/")+1:]
	return strings.HasSuffix(last, "bench") || last == "harness"
}

// modelLeaves are the packages outside model that model may import besides
// internal/core: leaves that import nothing of ours (the check below holds
// them to it). httpguard keeps browsers' pages off every local HTTP server,
// the model server's included.
var modelLeaves = []string{"internal/core", "internal/httpguard"}

// formatPkgs are the model file-format packages, pure format code with no
// engine, that a node may import besides model/serveapi (model/baseid
// reads a model's identity from those formats, model/peft stacks PEFT
// adapters).
var formatPkgs = []string{"model/safetensors", "model/gguf", "model/mlx", "model/baseid", "model/peft"}

// forbiddenInSim are the transports the simulator must not link: it runs
// the pure cores (the fetch plan, the manifest, the group's state machine)
// in virtual time, apart from the libraries that carry them for real.
var forbiddenInSim = []string{"github.com/libp2p/go-libp2p", "github.com/quic-go/quic-go", "github.com/hashicorp/raft"}

// check returns every import in pkgs that breaks a rule, one line each.
func check(pkgs []pkg) []string {
	byPath := map[string]pkg{}
	for _, p := range pkgs {
		byPath[p.Path] = p
	}
	var bad []string
	for _, p := range pkgs {
		for _, imp := range p.Imports {
			if why := edge(p.Path, imp, byPath); why != "" {
				bad = append(bad, fmt.Sprintf("%s imports %s: %s", p.Path, imp, why))
			}
		}
		if p.Path == "sim" {
			for _, f := range forbiddenInSim {
				var via []string
				for _, d := range append([]string{p.Path}, p.Deps...) {
					if slices.ContainsFunc(byPath[d].Ext, func(e string) bool { return under(e, f) }) {
						via = append(via, d)
					}
				}
				if len(via) > 0 || slices.ContainsFunc(p.Deps, func(d string) bool { return under(d, f) }) {
					bad = append(bad, fmt.Sprintf("sim links %s (through %s): the simulator runs the pure cores, not their transports", f, strings.Join(via, ", ")))
				}
			}
		}
	}
	for _, l := range modelLeaves {
		if len(byPath[l].Imports) > 0 {
			bad = append(bad, fmt.Sprintf("%s imports %s: model may import it only while it is a leaf", l, strings.Join(byPath[l].Imports, ", ")))
		}
	}
	return bad
}

// edge says why from may not import to ("" if it may).
func edge(from, to string, byPath map[string]pkg) string {
	switch {
	case under(from, "model") && !under(to, "model") && !slices.Contains(modelLeaves, to):
		return "the model stack imports nothing of ours but the shared vocabulary"
	case under(from, "node") && under(to, "model") && to != "model/serveapi" && !slices.Contains(formatPkgs, to) && !helperPkg(from):
		return "a node reaches its model server over HTTP: of model it imports only model/serveapi and the file formats"
	case under(from, "node") && under(to, "trainer"), under(from, "trainer") && under(to, "node"):
		return "node and trainer never import each other"
	case under(from, "trainer") && !benchPkg(from) && under(to, "pool"):
		return "the trainer does not use a device's DataPool"
	case to == "trainer/harness" || under(to, "trainer/harness/"):
		if from != "cmd/clawmesh" && !benchPkg(from) {
			return "harnesses are for tests, benchmarks and the CLI"
		}
	case helperPkg(to):
		if !helperPkg(from) && !benchPkg(from) && !under(from, "cmd") {
			return "test helpers stay out of production code"
		}
	case under(to, "cmd"):
		return "nothing imports cmd"
	case to == "sim" && !under(from, "cmd"):
		return "only the CLI imports the simulator"
	case (under(from, "pool") || under(from, "reward")) && (under(to, "mesh") || under(to, "node") || under(to, "trainer")):
		return "pool and reward are below the mesh, the node and the trainer"
	case under(from, "mesh") && (under(to, "node") || under(to, "trainer") || under(to, "model") || under(to, "sim")):
		return "the mesh is below the node, the trainer and the simulator"
	}
	return ""
}

// goList reads the module's packages, their imports and their links.
func goList(t *testing.T) []pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command on PATH: %v", err)
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = strings.TrimSpace(string(root))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	rel := func(p string) (string, bool) {
		if p == module {
			return "", true
		}
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var j struct {
			ImportPath    string
			Imports, Deps []string
		}
		if err := dec.Decode(&j); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		p := pkg{}
		p.Path, _ = rel(j.ImportPath)
		for _, i := range j.Imports {
			if r, ok := rel(i); ok {
				p.Imports = append(p.Imports, r)
			} else if strings.Contains(i, ".") {
				p.Ext = append(p.Ext, i)
			}
		}
		for _, d := range j.Deps {
			if r, ok := rel(d); ok {
				d = r
			}
			p.Deps = append(p.Deps, d)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages: not the module", len(pkgs))
	}
	return pkgs
}

// TestImportGraph checks the module's real import graph.
func TestImportGraph(t *testing.T) {
	for _, b := range check(goList(t)) {
		t.Error(b)
	}
}

// TestRulesCatch checks that every rule fires: each case is a graph the
// real one must never become.
func TestRulesCatch(t *testing.T) {
	ok := []pkg{
		{Path: "internal/core"}, {Path: "internal/httpguard"},
		{Path: "model/serve", Imports: []string{"internal/core", "internal/httpguard", "model/engine"}},
		{Path: "model/serve/servetest", Imports: []string{"model/serve", "model/engine/native/nativetest"}},
		{Path: "node/gateway", Imports: []string{"model/serveapi", "pool", "internal/httpguard"}},
		{Path: "node/gateway/bench", Imports: []string{"internal/fakeupstream", "node/gateway"}},
		{Path: "trainer", Imports: []string{"model/engine", "mesh", "trainer/group"}},
		{Path: "trainer/harness", Imports: []string{"trainer", "pool", "mesh/memnet"}},
		{Path: "cmd/clawmesh", Imports: []string{"trainer/harness", "internal/fakeupstream", "sim", "node", "trainer"}},
		{Path: "sim", Imports: []string{"trainer/group"}, Deps: []string{"trainer/group", "math"}},
	}
	if bad := check(ok); len(bad) > 0 {
		t.Fatalf("a graph that keeps the rules was refused: %q", bad)
	}
	cases := []struct {
		name string
		add  pkg
	}{
		{"model imports the trainer", pkg{Path: "model/engine/native", Imports: []string{"trainer/adapter"}}},
		{"model imports the mesh", pkg{Path: "model/serve", Imports: []string{"mesh/weights"}}},
		{"model imports a non-leaf internal package", pkg{Path: "model/chat", Imports: []string{"internal/atomicfile"}}},
		{"node imports the model server", pkg{Path: "node/swap", Imports: []string{"model/serve"}}},
		{"node imports an engine", pkg{Path: "node", Imports: []string{"model/engine"}}},
		{"node imports the trainer", pkg{Path: "node/adapters", Imports: []string{"trainer/adapter"}}},
		{"trainer imports the node", pkg{Path: "trainer", Imports: []string{"node/swap"}}},
		{"trainer imports pool", pkg{Path: "trainer", Imports: []string{"pool"}}},
		{"trainer sub-package imports pool", pkg{Path: "trainer/store", Imports: []string{"pool"}}},
		{"production imports the harness", pkg{Path: "trainer", Imports: []string{"trainer/harness"}}},
		{"node imports the harness", pkg{Path: "node", Imports: []string{"trainer/harness"}}},
		{"production imports the fake upstream", pkg{Path: "node/gateway", Imports: []string{"internal/fakeupstream"}}},
		{"production imports a test package", pkg{Path: "node/adapters", Imports: []string{"pool/pooltest"}}},
		{"trainer imports a test package", pkg{Path: "trainer/learn", Imports: []string{"model/engine/native/nativetest"}}},
		{"sim links libp2p", pkg{Path: "sim", Deps: []string{"github.com/libp2p/go-libp2p/core/peer"}}},
		{"sim links libp2p through the mesh", pkg{Path: "sim", Imports: []string{"mesh/p2p"}, Deps: []string{"mesh/p2p", "github.com/libp2p/go-libp2p"}}},
		{"sim links quic-go", pkg{Path: "sim", Deps: []string{"github.com/quic-go/quic-go"}}},
		{"sim links raft", pkg{Path: "sim", Deps: []string{"github.com/hashicorp/raft"}}},
		{"a model leaf grows an import", pkg{Path: "internal/httpguard", Imports: []string{"internal/atomicfile"}}},
		{"something imports cmd", pkg{Path: "node", Imports: []string{"cmd/clawmesh"}}},
		{"the mesh imports the trainer", pkg{Path: "mesh/weights", Imports: []string{"trainer/group"}}},
		{"pool imports the mesh", pkg{Path: "pool", Imports: []string{"mesh/batch"}}},
	}
	for _, c := range cases {
		g := slices.Clone(ok)
		if i := slices.IndexFunc(g, func(p pkg) bool { return p.Path == c.add.Path }); i >= 0 {
			g[i] = c.add
		} else {
			g = append(g, c.add)
		}
		if bad := check(g); len(bad) == 0 {
			t.Errorf("%s: not caught", c.name)
		}
	}
}
