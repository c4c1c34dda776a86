package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/internal/llamacpp"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/safetensors"
	"github.com/clawmesh/clawmesh/model/serve/servetest"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/swap"
)

// asCLI makes this test binary the clawmesh command when it is started
// with it set: how a node run by a test starts `clawmesh serve` (its
// default --serve-bin is this executable).
const asCLI = "CLAWMESH_TEST_BINARY_IS_CLI"

func init() {
	if os.Getenv(asCLI) == "1" {
		main()
	}
}

// tinyModelDir writes the tiny model servetest serves (seed 7) as a
// Hugging Face model directory.
func tinyModelDir(t *testing.T) string {
	t.Helper()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := native.CreateTiny(dir, cfg, 7); err != nil {
		t.Fatal(err)
	}
	if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// holdVersion keeps the adapter in dir as version v in the weights
// directory of the node whose data directory is data, as if fetched:
// `weights use vN` then serves it.
func holdVersion(t *testing.T, data, dir string, v uint64) {
	t.Helper()
	wd, err := weights.OpenDir(filepath.Join(data, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	defer wd.Close()
	b, err := weights.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := chunks.NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.Version, m.Term, m.Index = v, 1, 10*v
	_, admin, _ := ed25519.GenerateKey(rand.Reader)
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	sk, _ := ic.UnmarshalEd25519PrivateKey(key)
	id, _ := peer.IDFromPrivateKey(sk)
	cert, err := member.IssueCertificate(admin, nil, member.CertSpec{Subject: id.String(), SubjectKey: pub, Role: member.RoleTrainer}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sign(key, cert, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := wd.Add(m, b); err != nil {
		t.Fatal(err)
	}
}

// streamed is one streamed reply as a client saw it.
type streamed struct {
	version     string // X-Clawmesh-Adapter
	fingerprint string // the chunks' system_fingerprint
	mixed       bool   // chunks with different fingerprints
	text        string
	logprobs    []float64
	err         error
}

// streamChat makes one streaming chat call with log-probs and reads it
// whole.
func streamChat(ctx context.Context, url string) streamed {
	body, _ := json.Marshal(map[string]any{"model": "tiny", "stream": true, "temperature": 0, "max_tokens": 6, "logprobs": true,
		"messages": []map[string]string{{"role": "user", "content": "name a colour"}}})
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamed{err: err}
	}
	defer resp.Body.Close()
	r := streamed{version: resp.Header.Get(serveapi.AdapterHeader)}
	if resp.StatusCode != 200 {
		r.err = fmt.Errorf("status %d", resp.StatusCode)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return r
		}
		var ch struct {
			Fingerprint string `json:"system_fingerprint"`
			Choices     []struct {
				Delta    struct{ Content string }
				Logprobs *struct {
					Content []struct{ Logprob float64 }
				}
			}
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			r.err = err
			return r
		}
		if r.fingerprint == "" {
			r.fingerprint = ch.Fingerprint
		} else if ch.Fingerprint != r.fingerprint {
			r.mixed = true
		}
		for _, c := range ch.Choices {
			r.text += c.Delta.Content
			if c.Logprobs != nil {
				for _, l := range c.Logprobs.Content {
					r.logprobs = append(r.logprobs, l.Logprob)
				}
			}
		}
	}
	r.err = fmt.Errorf("the stream ended without [DONE]: %v", sc.Err())
	return r
}

func sameReply(a, b streamed) bool {
	if a.text != b.text || len(a.logprobs) != len(b.logprobs) {
		return false
	}
	for i := range a.logprobs {
		if math.Abs(a.logprobs[i]-b.logprobs[i]) > 1e-3 {
			return false
		}
	}
	return true
}

// serverPID is the process id of the model server last started, from its
// log file.
func serverPID(t *testing.T, log string) int {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`(?m)^--- pid (\d+)$`).FindAllStringSubmatch(string(b), -1)
	if len(m) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(m[len(m)-1][1])
	return pid
}

// TestNodeServesClawmesh: `clawmesh node --serve clawmesh` starts
// `clawmesh serve` on the tiny model itself and stands in front of it;
// while clients stream replies through the gateway, versions v1, v2 and
// v3 are put into service one after the other: no call fails, and every
// reply is, token for token, the reply of the one version its header
// names. The server, killed, is started again by the node, serving v3
// still; the node, stopped, stops it.
func TestNodeServesClawmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a node, its model server and streaming clients")
	}
	t.Setenv(asCLI, "1") // the node's `clawmesh serve` is this binary
	ctx := context.Background()
	model := tinyModelDir(t)
	tiny := servetest.Start(t, "", 2)
	var adapters []string
	for _, steps := range []int{2, 5, 9} {
		adapters = append(adapters, tiny.Adapter(t, steps, 0.1))
	}

	data := t.TempDir()
	cli(t, "mesh", "init", "--data", data)
	for i, dir := range adapters {
		holdVersion(t, data, dir, uint64(i+1))
	}
	gw := freeAddr(t)
	gatewayData.Store(gw, data)
	var logs syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(data, "logs", "clawmesh.log"))
			t.Logf("node's log:\n%s\nserver's log:\n%s", logs.String(), b)
		}
	})
	nctx, stopNode := context.WithCancel(ctx)
	nodeDone := make(chan int, 1)
	go func() {
		nodeDone <- run(nctx, []string{"node", "--serve", "clawmesh", "--model", model, "--serve-args", "--concurrency 4 --threads 1",
			"--data", data, "--listen", gw, "--no-scoring", "--no-mdns", "--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--weights", "127.0.0.1:0"}, &logs, &logs)
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stopNode()
			<-nodeDone
		}
	})
	url := "http://" + gw + "/v1"
	waitLong(t, 2*time.Minute, "the node and its model server", func() bool {
		r := streamChat(ctx, url)
		return r.err == nil
	})
	serverLog := filepath.Join(data, "logs", "clawmesh.log")
	if serverPID(t, serverLog) == 0 {
		t.Fatalf("no server started in %s", serverLog)
	}
	base := streamChat(ctx, url)
	if base.err != nil || base.version != "base" {
		t.Fatalf("before any version: %+v", base)
	}

	var (
		mu      sync.Mutex
		replies []streamed
		cut     int // calls cut by the kill
		killed  atomic.Bool
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000 && !stop.Load(); i++ {
				r := streamChat(ctx, url)
				mu.Lock()
				if r.err != nil && killed.Load() {
					cut++
				} else {
					replies = append(replies, r)
				}
				mu.Unlock()
				if r.err != nil && killed.Load() {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(replies) }
	nc := nodeClient(gw)
	for _, v := range []string{"v1", "v2", "v3"} {
		if _, err := nc.UseWeights(ctx, v); err != nil {
			t.Fatalf("weights use %s: %v", v, err)
		}
		waitFor(t, v+" serving", func() bool {
			st, err := nc.Weights(ctx)
			return err == nil && st.Serving == v
		})
		n := count()
		waitFor(t, "calls after "+v, func() bool { return count() >= n+8 })
	}

	// The server dies: the node starts it again, with v3.
	pid := serverPID(t, serverLog)
	killed.Store(true)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server started again", func() bool { p := serverPID(t, serverLog); return p != 0 && p != pid })
	waitLong(t, 2*time.Minute, "v3 served again", func() bool {
		r := streamChat(ctx, url)
		return r.err == nil && r.version == "v3"
	})
	stop.Store(true)
	wg.Wait()

	// The reference reply of each version, asked of a server alone.
	ref := map[string]streamed{"base": base}
	for i, dir := range adapters {
		v := fmt.Sprintf("v%d", i+1)
		if err := tiny.Srv.LoadAdapter(ctx, dir, v); err != nil {
			t.Fatal(err)
		}
		ref[v] = streamChat(ctx, tiny.URL)
	}
	for a := range ref {
		for b := range ref {
			if a < b && sameReply(ref[a], ref[b]) {
				t.Fatalf("%s and %s reply alike: the test could not tell them apart", a, b)
			}
		}
	}
	per := map[string]int{}
	for i, r := range replies {
		if r.err != nil {
			t.Fatalf("call %d failed: %v", i, r.err)
		}
		want, ok := ref[r.version]
		if !ok || !sameReply(r, want) {
			t.Fatalf("call %d: a reply named %q is not that version's reply:\n got %q %v\nwant %q %v", i, r.version, r.text, r.logprobs, want.text, want.logprobs)
		}
		per[r.version]++
	}
	for _, v := range []string{"v1", "v2", "v3"} {
		if per[v] == 0 {
			t.Errorf("no call served by %s (%v)", v, per)
		}
	}
	t.Logf("%d calls under load: %v; %d cut by the kill", len(replies), per, cut)

	// The node stops its server.
	pid = serverPID(t, serverLog)
	stopNode()
	if code := <-nodeDone; code != 0 {
		t.Fatalf("node exited %d", code)
	}
	stopped = true
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("the model server (pid %d) still runs after the node stopped", pid)
	}
}

// TestNodeServesLlamaServer: `clawmesh node --serve llama-server` runs
// llama-server (a stand-in answered by real llama.cpp) on a GGUF export of
// the tiny model; while clients stream replies through the gateway,
// versions v1 and v2 go into service blue/green: each exported as a GGUF
// adapter and served by a process of its own, started with --lora, the
// old process stopped once its calls have finished. No call fails; every
// reply comes whole from one process (its chunks' system_fingerprint
// names the adapter), and each process answers as its adapter makes it.
// The live process, killed, comes back with its adapter; the node,
// stopped, stops it.
func TestNodeServesLlamaServer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a node, llama.cpp servers and streaming clients")
	}
	nodeBin := llamacpp.Require(t)
	ctx := context.Background()
	dir := tinyModelDir(t)
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := gguf.ExportBase(dir, model, gguf.BaseOptions{}); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "llama-server")
	script := "#!/bin/sh\nexec " + strconv.Quote(nodeBin) + " " + strconv.Quote(filepath.Join(llamacpp.Dir(), "llama-server.mjs")) + ` "$@"` + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	// Each reply streams for over half a second: a swap catches calls in
	// flight.
	t.Setenv("LLAMA_STAND_IN_TOKEN_DELAY_MS", "100")
	tiny := servetest.Start(t, "", 1)
	data := t.TempDir()
	cli(t, "mesh", "init", "--data", data)
	for i, steps := range []int{3, 9} {
		holdVersion(t, data, tiny.Adapter(t, steps, 0.3), uint64(i+1))
	}
	gw := freeAddr(t)
	gatewayData.Store(gw, data)
	var logs syncBuffer
	logFile := func(v string) string { return filepath.Join(data, "logs", "llama-server-"+v+".log") }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node's log:\n%s", logs.String())
			for _, v := range []string{"base", "v1", "v2"} {
				b, _ := os.ReadFile(logFile(v))
				t.Logf("%s's log:\n%s", v, b)
			}
		}
	})
	nctx, stopNode := context.WithCancel(ctx)
	nodeDone := make(chan int, 1)
	go func() {
		nodeDone <- run(nctx, []string{"node", "--serve", "llama-server", "--model", model, "--serve-bin", bin, "--serve-args", "-c 512 -np 4 -t 1",
			"--data", data, "--listen", gw, "--no-scoring", "--no-mdns", "--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--weights", "127.0.0.1:0"}, &logs, &logs)
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stopNode()
			<-nodeDone
		}
	})
	url := "http://" + gw + "/v1"
	waitLong(t, 2*time.Minute, "the node and llama-server", func() bool { return streamChat(ctx, url).err == nil })
	pids := map[string]int{"base": serverPID(t, logFile("base"))}

	var (
		mu      sync.Mutex
		replies []streamed
		cut     int
		killed  atomic.Bool
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000 && !stop.Load(); i++ {
				r := streamChat(ctx, url)
				mu.Lock()
				if r.err != nil && killed.Load() {
					cut++
				} else {
					replies = append(replies, r)
				}
				mu.Unlock()
				if r.err != nil && killed.Load() {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(replies) }
	waitFor(t, "calls on the base model", func() bool { return count() >= 8 })
	nc := nodeClient(gw)
	prev := "base"
	for _, v := range []string{"v1", "v2"} {
		if _, err := nc.UseWeights(ctx, v); err != nil {
			t.Fatalf("weights use %s: %v", v, err)
		}
		waitLong(t, 2*time.Minute, v+" serving", func() bool {
			st, err := nc.Weights(ctx)
			return err == nil && st.Serving == v
		})
		pids[v] = serverPID(t, logFile(v))
		n := count()
		waitFor(t, "calls after "+v, func() bool { return count() >= n+8 })
		waitFor(t, "the process of "+prev+" stopped", func() bool { return syscall.Kill(pids[prev], 0) != nil })
		prev = v
	}

	// v2's process dies: the node starts it again, with v2.
	killed.Store(true)
	if err := syscall.Kill(pids["v2"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "v2's server started again", func() bool { p := serverPID(t, logFile("v2")); return p != 0 && p != pids["v2"] })
	waitLong(t, 2*time.Minute, "v2 served again", func() bool {
		r := streamChat(ctx, url)
		return r.err == nil && r.fingerprint == "stand-in+v2.gguf"
	})
	stop.Store(true)
	wg.Wait()

	text := map[string]string{}
	per := map[string]int{}
	for i, r := range replies {
		if r.err != nil {
			t.Fatalf("call %d failed: %v", i, r.err)
		}
		if r.mixed {
			t.Fatalf("call %d: a reply from two processes: %+v", i, r)
		}
		want, ok := text[r.fingerprint]
		if !ok {
			text[r.fingerprint] = r.text
		} else if r.text != want {
			t.Fatalf("call %d: %s answered %q, and before %q", i, r.fingerprint, r.text, want)
		}
		per[r.fingerprint]++
	}
	for _, f := range []string{"stand-in", "stand-in+v1.gguf", "stand-in+v2.gguf"} {
		if per[f] == 0 {
			t.Fatalf("no reply from %s: %v", f, per)
		}
	}
	if text["stand-in"] == text["stand-in+v1.gguf"] || text["stand-in+v1.gguf"] == text["stand-in+v2.gguf"] {
		t.Fatalf("the adapters change nothing: %q", text)
	}
	t.Logf("%d calls under load: %v; %d cut by the kill", len(replies), per, cut)

	pid := serverPID(t, logFile("v2"))
	stopNode()
	if code := <-nodeDone; code != 0 {
		t.Fatalf("node exited %d", code)
	}
	stopped = true
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("llama-server (pid %d) still runs after the node stopped", pid)
	}
}

// chatVersion makes one small chat call to upstream and says who served
// it: clawmesh serve's X-Clawmesh-Adapter, or the stand-in llama-server's
// system_fingerprint.
func chatVersion(ctx context.Context, upstream string) (string, error) {
	body := `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}`
	resp, err := http.Post(upstream+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r struct {
		Fingerprint string `json:"system_fingerprint"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d: %v", resp.StatusCode, err)
	}
	if v := resp.Header.Get(serveapi.AdapterHeader); v != "" {
		return v, nil
	}
	return r.Fingerprint, nil
}

// standInBin writes a llama-server program that runs the stand-in.
func standInBin(b testing.TB) string {
	b.Helper()
	nodeBin := llamacpp.Require(b)
	bin := filepath.Join(b.TempDir(), "llama-server")
	script := "#!/bin/sh\nexec " + strconv.Quote(nodeBin) + " " + strconv.Quote(filepath.Join(llamacpp.Dir(), "llama-server.mjs")) + ` "$@"` + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o700); err != nil {
		b.Fatal(err)
	}
	return bin
}

// BenchmarkVersionToReply is the time from a version arriving (the
// driver's Load) to the first reply served by it: Load, the warm-up,
// the route moved, one call. For clawmesh serve on the tiny model (the
// version loaded into the running process), and for llama-server (the
// stand-in on real llama.cpp, the tiny model as GGUF: the version
// exported to GGUF and a second process started with --lora). Reports
// the median (p50-ms) over b.N versions.
func BenchmarkVersionToReply(b *testing.B) {
	ctx := context.Background()
	tiny := servetest.Start(b, "", 1)
	adapters := []string{tiny.Adapter(b, 2, 0.1), tiny.Adapter(b, 5, 0.1)}
	for _, kind := range []string{modelserver.KindClawmesh, modelserver.KindLlamaServer} {
		b.Run(kind, func(b *testing.B) {
			dir := tinyModelDirB(b)
			cfg := modelserver.Config{Kind: kind, Model: dir, Dir: b.TempDir()}
			var route atomic.Pointer[swap.Target]
			route.Store(&swap.Target{Version: swap.BaseVersion})
			cfg.Route = func() swap.Target { return *route.Load() }
			if kind == modelserver.KindClawmesh {
				b.Setenv(asCLI, "1")
				cfg.Bin = os.Args[0]
				cfg.Args = []string{"--threads", "1"}
			} else {
				cfg.Bin = standInBin(b)
				cfg.Model = filepath.Join(b.TempDir(), "tiny.gguf")
				if err := gguf.ExportBase(dir, cfg.Model, gguf.BaseOptions{}); err != nil {
					b.Fatal(err)
				}
				cfg.Args = []string{"-c", "256", "-np", "1", "-t", "1"}
			}
			s, err := modelserver.Start(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			drv, err := s.Driver()
			if err != nil {
				b.Fatal(err)
			}
			var took []time.Duration
			b.ResetTimer()
			for i := range b.N {
				v := fmt.Sprintf("v%d", i+1)
				start := time.Now()
				tg, err := drv.Load(ctx, v, adapters[i%2])
				if err == nil {
					err = drv.Warm(ctx, tg)
				}
				if err != nil {
					b.Fatal(err)
				}
				route.Store(&tg)
				up := cmp.Or(tg.Upstream, s.Upstream())
				got, err := chatVersion(ctx, up)
				if err != nil || (got != v && got != "stand-in+"+v+".gguf") {
					b.Fatalf("first reply after %s: served by %q, %v", v, got, err)
				}
				took = append(took, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
		})
	}
}

// tinyModelDirB is tinyModelDir for a benchmark.
func tinyModelDirB(b *testing.B) string {
	b.Helper()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(b.TempDir(), "tiny")
	if err := native.CreateTiny(dir, cfg, 7); err != nil {
		b.Fatal(err)
	}
	if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
		b.Fatal(err)
	}
	return dir
}

// procMem is what /proc says of a process's memory, in bytes: its
// resident set, the part of it that maps files (the model), and its
// proportional set size (each shared page counted once among the
// processes that map it).
type procMem struct{ rss, rssFile, pss int64 }

func readMem(pid int) (procMem, error) {
	var m procMem
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	sm, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return m, err
	}
	field := func(b []byte, name string) int64 {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, name+":"); ok {
				f := strings.Fields(rest)
				if len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					return kb << 10
				}
			}
		}
		return 0
	}
	return procMem{rss: field(st, "VmRSS"), rssFile: field(st, "RssFile"), pss: field(sm, "Pss")}, nil
}

// BenchmarkBlueGreenMemory is what serving a llama-server version
// blue/green costs in memory: a model of about 100M parameters (random;
// as a GGUF of F32, F16 or Q8_0 weights: 400, 200 or 110 MB), one process
// serving it, then two (the second with a rank-8 adapter on q and v, both
// answering), as the node runs them during a swap. Reports, in MiB, the
// first process's RSS, the part of it that maps files (the model), and
// its PSS; the two processes' summed RSS and PSS (PSS counts the model's
// shared pages once); and swap-cost, the PSS the second process adds.
func BenchmarkBlueGreenMemory(b *testing.B) {
	if _, err := os.Stat("/proc/self/smaps_rollup"); err != nil {
		b.Skip("reads Linux's /proc")
	}
	bin := standInBin(b)
	ctx := context.Background()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		b.Fatal(err)
	}
	cfg.Hidden, cfg.Intermediate, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.HeadDim = 1024, 3072, 8, 16, 8, 64
	dir := filepath.Join(b.TempDir(), "model")
	if err := native.CreateTiny(dir, cfg, 7); err != nil {
		b.Fatal(err)
	}
	if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
		b.Fatal(err)
	}
	adapter := peftAdapter(b, cfg.Layers, cfg.Hidden, cfg.KVHeads*cfg.HeadDim, 8)
	for _, typ := range []gguf.TensorType{gguf.TypeF32, gguf.TypeF16, gguf.TypeQ8_0} {
		b.Run(typ.String(), func(b *testing.B) {
			model := filepath.Join(b.TempDir(), "model.gguf")
			if err := gguf.ExportBase(dir, model, gguf.BaseOptions{Type: typ}); err != nil {
				b.Fatal(err)
			}
			for range b.N {
				var route atomic.Pointer[swap.Target]
				route.Store(&swap.Target{Version: swap.BaseVersion})
				s, err := modelserver.Start(ctx, modelserver.Config{Kind: modelserver.KindLlamaServer, Model: model, Bin: bin, Dir: b.TempDir(),
					Args: []string{"-c", "512", "-np", "1", "-t", "1"}, Route: func() swap.Target { return *route.Load() }})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := chatVersion(ctx, s.Upstream()); err != nil {
					b.Fatal(err)
				}
				one, err := readMem(s.PIDs()[0])
				if err != nil {
					b.Fatal(err)
				}
				drv, _ := s.Driver()
				tg, err := drv.Load(ctx, "v1", adapter)
				if err == nil {
					err = drv.Warm(ctx, tg)
				}
				if err != nil {
					b.Fatal(err)
				}
				var both []procMem
				for _, pid := range s.PIDs() {
					m, err := readMem(pid)
					if err != nil {
						b.Fatal(err)
					}
					both = append(both, m)
				}
				s.Close()
				if len(both) != 2 {
					b.Fatalf("%d processes during the swap", len(both))
				}
				mib := func(n int64) float64 { return float64(n) / (1 << 20) }
				b.ReportMetric(mib(one.rss), "rss-one-MiB")
				b.ReportMetric(mib(one.rssFile), "rss-one-file-MiB")
				b.ReportMetric(mib(one.pss), "pss-one-MiB")
				b.ReportMetric(mib(both[0].rss+both[1].rss), "rss-two-MiB")
				b.ReportMetric(mib(both[0].pss+both[1].pss), "pss-two-MiB")
				b.ReportMetric(mib(both[0].pss+both[1].pss-one.pss), "swap-cost-MiB")
			}
		})
	}
}

// peftAdapter writes a PEFT LoRA adapter of rank r on q_proj and v_proj
// for a Qwen3 model of the given shape (small random values).
func peftAdapter(b *testing.B, layers, hidden, kv, r int) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "adapter")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	cfg := `{"peft_type": "LORA", "r": ` + strconv.Itoa(r) + `, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "bias": "none", "base_model_name_or_path": "Qwen/Qwen3-0.6B"}`
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	var ts []safetensors.Tensor
	vals := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7-3) * 1e-3
		}
		return v
	}
	for l := range layers {
		for _, p := range []struct {
			name string
			out  int
		}{{"q_proj", hidden}, {"v_proj", kv}} {
			pre := fmt.Sprintf("base_model.model.model.layers.%d.self_attn.%s.", l, p.name)
			a, _ := safetensors.F32Tensor(pre+"lora_A.weight", safetensors.F32, []int{r, hidden}, vals(r*hidden))
			bt, _ := safetensors.F32Tensor(pre+"lora_B.weight", safetensors.F32, []int{p.out, r}, vals(p.out*r))
			ts = append(ts, a, bt)
		}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), ts, nil); err != nil {
		b.Fatal(err)
	}
	return dir
}

// TestServeFlags: what `clawmesh node` refuses of --serve and its flags,
// and says.
func TestServeFlags(t *testing.T) {
	data := t.TempDir()
	model := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(model, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--serve", "vllm", "--model", model}, `--serve "vllm": want one of llama-server, mlx, clawmesh`},
		{[]string{"--serve", "llama-server"}, "--serve llama-server needs --model (a GGUF file)"},
		{[]string{"--model", model}, "--model, --serve-bin and --serve-args go with --serve"},
		{[]string{"--serve", "llama-server", "--model", model, "--upstream", "http://127.0.0.1:9/v1"}, "the node's upstream is the server it runs"},
		{[]string{"--serve", "llama-server", "--model", filepath.Join(data, "none.gguf")}, "none.gguf: no such file or directory"},
		{[]string{"--serve", "llama-server", "--model", model, "--serve-args", `-c "8192`}, `--serve-args: unclosed "`},
		{[]string{"--serve", "llama-server", "--model", model, "--serve-bin", "no-such-llama-server"}, "no llama-server program"},
		{[]string{"--serve", "clawmesh", "--model", model, "--upstream-kind", "vllm"}, `upstream kind "vllm", but the model server the node runs is clawmesh`},
	} {
		_, errs, code := runCLI(t, append([]string{"node", "--data", data, "--listen", freeAddr(t)}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, want %q in:\n%s", tc.args, code, tc.want, errs)
		}
	}
}

func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  -c 8192\t--threads 8 ", []string{"-c", "8192", "--threads", "8"}},
		{`--chat-template-file '/a b/t.jinja' --alias "my \"model\""`, []string{"--chat-template-file", "/a b/t.jinja", "--alias", `my "model"`}},
		{`a\ b '' "x\y"`, []string{"a b", "", `x\y`}},
	} {
		got, err := splitArgs(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("splitArgs(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`"open`, `'open`, `end\`} {
		if _, err := splitArgs(bad); err == nil {
			t.Errorf("splitArgs(%q): no error", bad)
		}
	}
}
