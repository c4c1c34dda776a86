package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/pool"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHTTP(t *testing.T, url string) {
	t.Helper()
	for i := 0; i < 300; i++ {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never answered", url)
}

// serveTiny runs `clawmesh serve --tiny` (with extra flags) on loopback
// until the test ends, and returns its address once it answers.
func serveTiny(t *testing.T, serveArgs ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := freeAddr(t)
	done := make(chan int, 1)
	go func() {
		args := append([]string{"serve", "--tiny", "--listen", addr, "--log", "error"}, serveArgs...)
		done <- run(ctx, args, io.Discard, io.Discard)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitHTTP(t, "http://"+addr+"/v1/models")
	return addr
}

// serveAndNode runs `clawmesh serve --tiny` (with extra flags) and a node in
// front of it (upstream kind clawmesh, no scoring) until the test ends, and
// returns the model server's and the gateway's addresses.
func serveAndNode(t *testing.T, serveArgs ...string) (modelAddr, gwAddr string) {
	t.Helper()
	modelAddr = serveTiny(t, serveArgs...)
	ctx, cancel := context.WithCancel(context.Background())

	data := t.TempDir()
	gwAddr = freeAddr(t)
	gatewayData.Store(gwAddr, data)
	nodeDone := make(chan int, 1)
	go func() {
		nodeDone <- run(ctx, []string{"node", "--upstream", "http://" + modelAddr + "/v1", "--upstream-kind", "clawmesh",
			"--listen", gwAddr, "--data", data, "--no-scoring", "--log", "error"}, io.Discard, io.Discard)
	}()
	t.Cleanup(func() { cancel(); <-nodeDone })
	waitHTTP(t, "http://"+gwAddr+"/v1/models")
	return modelAddr, gwAddr
}

// TestNodeInFrontOfServe runs `clawmesh serve --tiny` and a node in front of
// it (upstream kind clawmesh), and checks that steps are recorded with exact
// token ids and log-probs and with the adapter version that served them,
// across a hot adapter swap.
func TestNodeInFrontOfServe(t *testing.T) {
	ctx := context.Background()
	modelAddr, gwAddr := serveAndNode(t)

	call := func(i int) {
		body := fmt.Sprintf(`{"model":"tiny","stream":%v,"max_tokens":12,"seed":%d,"messages":[{"role":"user","content":"hello number %d"}]}`, i%2 == 0, i, i)
		resp, err := http.Post("http://"+gwAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if bytes.Contains(b, []byte(`"logprobs":{`)) || bytes.Contains(b, []byte(`"token_ids":[`)) {
			t.Errorf("the client did not ask for logprobs or token ids but got them: %s", b)
		}
		if i%2 == 0 {
			sc := bufio.NewScanner(bytes.NewReader(b))
			last := ""
			for sc.Scan() {
				if sc.Text() != "" {
					last = sc.Text()
				}
			}
			if last != "data: [DONE]" {
				t.Errorf("stream did not end with [DONE]: %q", last)
			}
		}
	}
	call(0)
	call(1)

	// A new adapter version, loaded without a restart.
	tok, err := tokenizer.Tiny(tokenizer.TinyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := native.NewTiny(native.TinyConfig(tok.VocabSize()), 2, native.Options{})
	if err != nil {
		t.Fatal(err)
	}
	adir := filepath.Join(t.TempDir(), "v7")
	if err := eng.ExportAdapter(ctx, adir); err != nil {
		t.Fatal(err)
	}
	eng.Close()
	resp, err := http.Post("http://"+modelAddr+"/clawmesh/v1/adapter", "application/json",
		strings.NewReader(fmt.Sprintf(`{"path":%q,"version":"v7"}`, adir)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("adapter load: %d %s", resp.StatusCode, b)
	}
	call(2)

	c := nodeClient(gwAddr)
	steps, err := c.List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 {
		t.Fatalf("%d steps recorded, want 3", len(steps))
	}
	for i, s := range steps {
		want := "base"
		if i == 2 {
			want = "v7"
		}
		if s.Adapter != want {
			t.Errorf("step %d served by adapter %q, recorded %q", i, want, s.Adapter)
		}
		ch := s.Response.Choices
		if len(ch) != 1 || ch[0].Fidelity != core.FidelityExact || len(ch[0].Tokens) == 0 {
			t.Fatalf("step %d: want exact token ids and log-probs, got %+v", i, ch)
		}
		for _, tl := range ch[0].Tokens {
			if tl.ID < 0 || tl.ID >= tok.VocabSize() || tl.Logprob > 0 {
				t.Errorf("step %d: token %+v out of range", i, tl)
			}
		}
		if u := s.Response.Usage; u == nil || u.CompletionTokens != len(ch[0].Tokens) {
			t.Errorf("step %d: usage %+v for %d recorded tokens", i, u, len(ch[0].Tokens))
		}
	}
}

// gatewayData maps a node's gateway address to its data directory, for
// the admin API's token.
var gatewayData sync.Map

// nodeClient is the owner's client of the node serving at gwAddr.
func nodeClient(gwAddr string) *node.Client {
	data, _ := gatewayData.Load(gwAddr)
	dir, _ := data.(string)
	return &node.Client{Base: "http://" + gwAddr, Token: adminapi.ClientToken(dir, "")}
}
