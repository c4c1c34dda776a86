package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
)

// TestSigtermDrainsStream builds the clawmesh binary, runs `clawmesh node`
// as a process, opens a stream the upstream holds in the middle, and sends
// the process SIGTERM. The stream must then complete whole once the upstream
// goes on, the process exit 0, and the step be in the pool.
func TestSigtermDrainsStream(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it")
	}
	bin := buildBinary(t)

	hold := make(chan struct{})
	upstream := serveUpstream(t, fakeupstream.Script{Chunks: 4, Hold: hold, Turns: []fakeupstream.Turn{{Text: "abcdefgh", HoldAfter: 2}}})
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()

	data := t.TempDir()
	np := startNodeProcess(t, bin, data, "--no-scoring", "--upstream", upstream)
	cmd, exited, addr := np.cmd, np.exited, np.addr
	stderr := np.stderr

	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	var got strings.Builder
	for !strings.Contains(got.String(), `"content":"cd"`) { // the chunks before the hold
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("stream before SIGTERM: %v (%q)", err, got.String())
		}
		got.WriteString(line)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The node stops taking calls but keeps the stream: a bounded check
	// that it has not exited while the stream is held.
	select {
	case <-exited:
		t.Fatalf("node exited (%v) while a stream was in flight: %s", np.waitErr, stderr.String())
	case <-time.After(300 * time.Millisecond):
	}
	close(hold)
	released = true
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatalf("stream after SIGTERM: %v", err)
	}
	got.Write(rest)
	if !strings.HasSuffix(got.String(), "data: [DONE]\n\n") || !strings.Contains(got.String(), `"content":"gh"`) {
		t.Fatalf("the stream did not complete whole: %q", got.String())
	}
	select {
	case <-exited:
		if np.waitErr != nil {
			t.Fatalf("node exit: %v: %s", np.waitErr, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("node did not exit after its last stream: %s", stderr.String())
	}

	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	steps, err := p.List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].Action().Content != "abcdefgh" || steps[0].ClientDisconnected || steps[0].State != core.StateOpen {
		t.Fatalf("pool after SIGTERM: %d steps %+v", len(steps), steps)
	}
}

// nodeProcess is a `clawmesh node` process a test started.
type nodeProcess struct {
	cmd     *exec.Cmd
	addr    string        // the gateway's address
	stderr  *bytes.Buffer // what it logged
	exited  chan struct{} // closed once it has exited, waitErr set
	waitErr error
}

// startNodeProcess starts bin as `clawmesh node` on data, listening on a
// free loopback port, with more flags, waits (up to 30 s) for its address
// file, and kills it when the test ends if it is still running.
func startNodeProcess(t *testing.T, bin, data string, flags ...string) *nodeProcess {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"node", "--data", data, "--listen", "127.0.0.1:0"}, flags...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	np := &nodeProcess{cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = np.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { np.waitErr = cmd.Wait(); close(np.exited) }()
	t.Cleanup(func() {
		select {
		case <-np.exited:
		default:
			cmd.Process.Kill()
			<-np.exited
		}
	})
	for i := 0; i < 300 && np.addr == ""; i++ {
		if a, err := node.ReadAddr(data); err == nil {
			np.addr = a
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if np.addr == "" {
		t.Fatalf("node did not start: %s", np.stderr.String())
	}
	return np
}

// TestSecondSignalExitsAtOnce: a node draining a stream after SIGTERM, with
// a long drain timeout, exits at once on a second signal, and its pool
// then opens.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it")
	}
	bin := buildBinary(t)
	hold := make(chan struct{})
	defer close(hold)
	upstream := serveUpstream(t, fakeupstream.Script{Chunks: 4, Hold: hold, Turns: []fakeupstream.Turn{{Text: "abcdefgh", HoldAfter: 2}}})

	data := t.TempDir()
	const drain = 10 * time.Minute
	np := startNodeProcess(t, bin, data, "--no-scoring", "--drain-timeout", drain.String(), "--upstream", upstream)
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Post("http://"+np.addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for got := ""; !strings.Contains(got, `"content":"cd"`); { // the chunks before the hold
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("stream before SIGTERM: %v (%q)", err, got)
		}
		got += line
	}
	if err := np.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select { // bounded: the node drains the held stream
	case <-np.exited:
		t.Fatalf("node exited (%v) while a stream was in flight: %s", np.waitErr, np.stderr.String())
	case <-time.After(500 * time.Millisecond):
	}
	if err := np.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	// A bound, not a measure: far inside the drain timeout.
	select {
	case <-np.exited:
	case <-time.After(time.Minute):
		t.Fatalf("the node did not exit on a second signal (drain timeout %v)", drain)
	}
	if np.waitErr == nil || !strings.Contains(np.stderr.String(), "again: exiting now") {
		t.Fatalf("exit %v; the node did not say it exits at once: %s", np.waitErr, np.stderr.String())
	}
	if rest, err := io.ReadAll(rd); err == nil && strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream ended whole although the node exited in its middle: %q", rest)
	}
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatalf("the pool after the node exited at once: %v", err)
	}
	p.Close()
}
