package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
)

// TestStopDuringStartup stops `clawmesh node` (as SIGTERM does: main's
// context) as soon as it serves, while a first start compiles the reward
// plugins: it exits 0, saying it stopped, and nothing that reads like a
// broken plugin.
func TestStopDuringStartup(t *testing.T) {
	up := scriptedUpstream(t, "hi")
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"node", "--data", data, "--listen", "127.0.0.1:0", "--upstream", up}, &logs, &logs)
	}()
	waitFor(t, "the node's address file", func() bool { _, err := node.ReadAddr(data); return err == nil })
	cancel()
	code := <-done
	l := logs.String()
	if code != 0 || !strings.Contains(l, "clawmesh node: stopped") {
		t.Errorf("code %d:\n%s", code, l)
	}
	for _, bad := range []string{"level=ERROR", "unusable", "context canceled", "module closed"} {
		if strings.Contains(l, bad) {
			t.Errorf("the log says %q:\n%s", bad, l)
		}
	}
}

// TestNodeOnAPoolInUse: a second process on the same data directory is
// told that another one uses it, and what to do, not pebble's lock error.
func TestNodeOnAPoolInUse(t *testing.T) {
	data := t.TempDir()
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, errs, code := runCLI(t, "node", "--data", data, "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9/v1", "--no-mdns")
	want := "clawmesh node: another clawmesh process (a node, or a pool command) is using the pool in " + data + "\nStop it first, or give 'clawmesh node' another --data.\n"
	if code != 1 || !strings.HasSuffix(errs, want) || strings.Contains(errs, "locked") {
		t.Errorf("code %d, %q; want %q", code, errs, want)
	}
}

// TestNodeStartErrors: settings the node refuses are usage errors naming
// the setting, and an address another process holds says so.
func TestNodeStartErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--upstream", "127.0.0.1:11434"}, 2, "clawmesh node: upstream \"127.0.0.1:11434\" must be an http:// or https:// URL\nRun 'clawmesh node --help' for usage.\n"},
		{[]string{"--upstream", "http://127.0.0.1:9/v1", "--listen", "nonsense"}, 2, "clawmesh node: --listen \"nonsense\": want HOST:PORT, such as 127.0.0.1:8400\nRun 'clawmesh node --help' for usage.\n"},
		{[]string{"--upstream", "http://127.0.0.1:9/v1", "--listen", ln.Addr().String()}, 1, "clawmesh node: the gateway address " + ln.Addr().String() + " is in use by another process (another node?)\nStop it, or give 'clawmesh node' another --listen.\n"},
	} {
		_, errs, code := runCLI(t, append([]string{"node", "--data", t.TempDir(), "--no-mdns", "--no-scoring"}, c.args...)...)
		if code != c.code || !strings.HasSuffix(errs, c.want) || strings.Contains(errs, "bad config") || strings.Contains(errs, "listen: listen") {
			t.Errorf("node %q: code %d, %q; want %d, %q", c.args, code, errs, c.code, c.want)
		}
	}
}
