package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
)

// TestCrashChild is the child half of TestCrashKill9: it runs a node until
// it is killed. It does nothing in a normal test run.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv("CLAWMESH_CRASH_CHILD_DATA")
	if dir == "" {
		t.Skip("child process of TestCrashKill9 only")
	}
	n, err := node.New(context.Background(), node.Config{
		DataDir:   dir,
		Listen:    "127.0.0.1:0",
		Upstream:  os.Getenv("CLAWMESH_CRASH_CHILD_UPSTREAM"),
		NoScoring: true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	n.Run(context.Background()) // until SIGKILL
	os.Exit(4)
}

// TestCrashKill9 runs a node in a child process under concurrent load, kills
// it with SIGKILL, and checks that every reply a client received whole is in
// the pool afterwards, and that the pool opens cleanly.
func TestCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	up := fakeupstream.New(fakeupstream.Script{Chunks: 4, ChunkDelay: time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go up.Run(ctx, ln)

	data := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"CLAWMESH_CRASH_CHILD_DATA="+data,
		"CLAWMESH_CRASH_CHILD_UPSTREAM=http://"+ln.Addr().String()+"/v1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	var addr string
	for i := 0; i < 200; i++ { // up to 20s for the child to start
		if a, err := node.ReadAddr(data); err == nil && a != "" {
			addr = a
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if addr == "" {
		t.Fatalf("child node did not start: %s", stderr.String())
	}
	base := "http://" + addr + "/v1/chat/completions"

	var (
		mu       sync.Mutex
		received []string // response ids of replies received whole
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	client := &http.Client{Timeout: 10 * time.Second}
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 10000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := (w+i)%2 == 0
				id, ok := completeCall(client, base, fmt.Sprintf("w%d-%d", w, i), stream)
				if !ok {
					return // the node is gone
				}
				mu.Lock()
				received = append(received, id)
				mu.Unlock()
			}
		}(w)
	}
	// Let load build up, then kill the node mid-flight.
	for i := 0; i < 100; i++ {
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		n := len(received)
		mu.Unlock()
		if n >= 300 {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	close(stop)
	wg.Wait()

	mu.Lock()
	got := append([]string(nil), received...)
	mu.Unlock()
	if len(got) < 20 {
		t.Fatalf("only %d replies completed before the kill; the test proves nothing (child stderr: %s)", len(got), stderr.String())
	}

	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatalf("pool does not reopen after SIGKILL: %v", err)
	}
	defer p.Close()
	steps, err := p.List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, s := range steps {
		have[s.Response.ID] = true
	}
	missing := 0
	for _, id := range got {
		if !have[id] {
			missing++
			if missing < 5 {
				t.Errorf("reply %s reached the client but is not in the pool", id)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d received replies lost", missing, len(got))
	}
	t.Logf("%d replies received whole before SIGKILL, all in the pool (%d steps recorded)", len(got), len(steps))

	// The killed node left its last steps open; a node started on the same
	// data resumes them (a continuation would give them their next state),
	// and closes those idle past the timeout.
	open := 0
	for _, s := range steps {
		if s.State == core.StateOpen {
			open++
		}
	}
	if open == 0 {
		t.Fatal("no step was left open by the kill; the restart check proves nothing")
	}
	p.Close()
	n, err := node.New(context.Background(), node.Config{DataDir: data, Upstream: "http://127.0.0.1:1/v1", NoScoring: true})
	if err != nil {
		t.Fatal(err)
	}
	left, err := n.Pool().List(context.Background(), pool.Filter{State: core.StateOpen})
	if err != nil || len(left) != open {
		t.Fatalf("after a restart %d steps are open, %d were left open (%v)", len(left), open, err)
	}
	n.Close(context.Background())
	time.Sleep(5 * time.Millisecond)
	n, err = node.New(context.Background(), node.Config{DataDir: data, Upstream: "http://127.0.0.1:1/v1", NoScoring: true, IdleTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	left, err = n.Pool().List(context.Background(), pool.Filter{State: core.StateOpen})
	if err != nil || len(left) != 0 {
		t.Fatalf("after a restart with a 1ms idle timeout %d steps are still open (%v)", len(left), err)
	}
	after, _ := n.Pool().List(context.Background(), pool.Filter{})
	if len(after) != len(steps) {
		t.Fatalf("%d steps after the restart, %d before", len(after), len(steps))
	}
	t.Logf("the restarts resumed, then closed as idle, %d steps left open", open)
}

// completeCall makes one chat call and reports the response id if the reply
// arrived whole: the [DONE] event for a stream, a complete JSON body else.
func completeCall(c *http.Client, url, user string, stream bool) (string, bool) {
	body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hello %s"}]}`, stream, user)
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return "", false
	}
	if !stream {
		var out struct {
			ID string `json:"id"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.ID == "" {
			return "", false
		}
		return out.ID, true
	}
	var id string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			return id, id != ""
		}
		if strings.HasPrefix(line, "data: ") && id == "" {
			var ch struct {
				ID string `json:"id"`
			}
			if json.Unmarshal([]byte(line[6:]), &ch) == nil {
				id = ch.ID
			}
		}
	}
	return "", false
}
