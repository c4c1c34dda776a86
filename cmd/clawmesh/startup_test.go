package main

import (
	"context"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/node"
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
