package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/setup"
)

// fakeServers runs a scripted model server for each name and returns them
// as local servers to look for, with a closed port first.
func fakeServers(t *testing.T, names ...string) []setup.LocalServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	servers := []setup.LocalServer{{Name: "closed", Port: strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), Kind: "vllm"}}
	ln.Close()
	for _, n := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go fakeupstream.New(fakeupstream.Script{Model: n + "-model", Turns: []fakeupstream.Turn{{Text: "from " + n}}}).Run(ctx, ln)
		servers = append(servers, setup.LocalServer{Name: n, Port: strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), Kind: "ollama"})
	}
	return servers
}

// TestNodeFindsLocalServer runs `clawmesh node` with no upstream: it finds
// the model server that answers, says so, and forwards to it.
func TestNodeFindsLocalServer(t *testing.T) {
	old := localServers
	t.Cleanup(func() { localServers = old })
	localServers = fakeServers(t, "Ollama")
	for _, v := range []string{"CLAWMESH_UPSTREAM", "CLAWMESH_CONFIG", "CLAWMESH_UPSTREAM_KIND"} {
		t.Setenv(v, "")
	}
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"node", "--data", data, "--listen", "127.0.0.1:0", "--no-scoring"}, &logs, &logs)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the node's address file", func() bool { _, err := node.ReadAddr(data); return err == nil })
	if l := logs.String(); !strings.Contains(l, "using the local model server") || !strings.Contains(l, "server=Ollama") ||
		!strings.Contains(l, "upstream=http://127.0.0.1:"+localServers[1].Port+"/v1") || !strings.Contains(l, "kind=ollama") {
		t.Errorf("the node did not say what it chose:\n%s", l)
	}
	endedCall(t, data, "hello")
	steps, _ := exportSteps(t, data)
	for _, s := range steps {
		if s.Action().Content != "from Ollama" {
			t.Errorf("recorded reply %q, want the found server's", s.Action().Content)
		}
	}
	if len(steps) != 1 {
		t.Errorf("%d steps, want 1", len(steps))
	}

	localServers = localServers[:1]
	_, errs, code := runCLI(t, "node", "--data", t.TempDir(), "--listen", "127.0.0.1:0")
	if code != 2 || !strings.Contains(errs, "no local model server answers") || !strings.Contains(errs, "--upstream") {
		t.Errorf("no server: code %d, %s", code, errs)
	}
}

// TestDiscoverAsks: with several servers answering, a terminal user picks
// one; without a terminal the first in order is taken.
func TestDiscoverAsks(t *testing.T) {
	old := localServers
	t.Cleanup(func() { localServers = old })
	localServers = fakeServers(t, "Ollama", "LM Studio")
	var out strings.Builder
	f, err := discoverUpstream(context.Background(), strings.NewReader("x\n2\n"), true, &out)
	if err != nil || f.Name != "LM Studio" {
		t.Errorf("chose %+v (%v), want the second", f, err)
	}
	if !strings.Contains(out.String(), "2) LM Studio at http://127.0.0.1:") || !strings.Contains(out.String(), "(1 model)") {
		t.Errorf("the question:\n%s", out.String())
	}
	if f, err := discoverUpstream(context.Background(), strings.NewReader("\n"), true, &out); err != nil || f.Name != "Ollama" {
		t.Errorf("default choice %+v (%v), want the first", f, err)
	}
	if f, err := discoverUpstream(context.Background(), strings.NewReader(""), false, &out); err != nil || f.Name != "Ollama" {
		t.Errorf("no terminal: %+v (%v), want the first", f, err)
	}
}

// TestIsTerminal: /dev/null, what a service's stdin is, and a file are no
// terminal, so that a node run as a service never waits on a question.
func TestIsTerminal(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(null) || isTerminal(f) {
		t.Errorf("isTerminal: /dev/null %v, a file %v; want neither", isTerminal(null), isTerminal(f))
	}
}
