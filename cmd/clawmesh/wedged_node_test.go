package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/pool"
)

// TestSigtermWedgedStore builds the binary with the faultinject tag (its
// pool's WAL writes block for good while DATA/wedge exists), runs `clawmesh
// node`, wedges the store, and checks that a call is still answered, that
// SIGTERM then ends the process by the drain timeout plus stopGrace (the
// pool cannot close), and that the pool, opened afterwards, holds the
// steps recorded before the wedge.
func TestSigtermWedgedStore(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it")
	}
	bin := buildBinary(t, "faultinject")
	upstream := serveUpstream(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "Still answered."}}})

	data := t.TempDir()
	const drain = 2 * time.Second
	np := startNodeProcess(t, bin, data, "--no-scoring", "--min-free", "0",
		"--drain-timeout", drain.String(), "--upstream", upstream)
	cmd, exited, addr, stderr := np.cmd, np.exited, np.addr, np.stderr
	client := &http.Client{Timeout: 60 * time.Second}
	call := func(content string) {
		t.Helper()
		resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+content+`"}]}`))
		if err != nil {
			t.Fatalf("call %q: %v\n%s", content, err, stderr.String())
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Still answered.") {
			t.Fatalf("call %q: status %d, %v: %s", content, resp.StatusCode, err, body)
		}
	}
	call("before the wedge")

	if err := os.WriteFile(filepath.Join(data, "wedge"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	call("while the store is wedged") // released unrecorded after the store timeout

	stopped := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// A bound, not a measure: the node must be gone by the drain timeout
	// plus stopGrace; a minute is far past it.
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatalf("the node did not exit within a minute of SIGTERM with its store wedged: %s", stderr.String())
	}
	t.Logf("exited %v after SIGTERM (drain timeout %v, grace %v)", time.Since(stopped).Round(100*time.Millisecond), drain, stopGrace)
	if !strings.Contains(stderr.String(), "the store is left to the operating system") && !strings.Contains(stderr.String(), "after the drain timeout: exiting") {
		t.Errorf("the node did not say that it left the store: %s", stderr.String())
	}

	if err := os.Remove(filepath.Join(data, "wedge")); err != nil {
		t.Fatal(err)
	}
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatalf("the pool after the wedged node exited: %v", err)
	}
	defer p.Close()
	steps, err := p.List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range steps {
		if m := s.Request.Messages; len(m) > 0 && m[len(m)-1].Content == "before the wedge" {
			found = true
		}
	}
	if !found {
		for _, s := range steps {
			t.Logf("step %s: %+v", s.ID, s.Request.Messages)
		}
		t.Fatalf("the step recorded before the wedge is not in the pool (%d steps)", len(steps))
	}
}
