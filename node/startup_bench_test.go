package node_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/node"
)

// BenchmarkStartFirstCall measures a first start on an empty data directory
// (no compilation cache) until the first proxied call has its reply:
// "first-call" with the plugins compiling in the background, as the node
// runs; "plugins-then-call" waiting for them first, as the node did before;
// "no-scoring", with no plugins at all, the floor. ms/op is the time from
// node.New to the reply.
func BenchmarkStartFirstCall(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up := fakeModel(b, ctx)
	for _, mode := range []string{"first-call", "plugins-then-call", "no-scoring"} {
		b.Run(mode, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				data := b.TempDir()
				start := time.Now()
				n, err := node.New(ctx, node.Config{DataDir: data, Upstream: up, NoScoring: mode == "no-scoring"})
				if err != nil {
					b.Fatal(err)
				}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- n.Serve(runCtx, ln) }()
				if mode == "plugins-then-call" {
					if err := n.PluginsReady(ctx); err != nil {
						b.Fatal(err)
					}
				}
				resp, err := http.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
				total += time.Since(start)
				b.StopTimer()
				stop()
				<-done
				n.Close(context.Background())
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/first-call")
		})
	}
}
