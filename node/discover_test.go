package node_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/setup"
)

// TestDiscover runs a model server, a server that answers 404 at
// /v1/models, one that answers something other than a model list, and a
// closed port: only the model server is found.
func TestDiscover(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listen := func(h http.Handler) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	model := listen(fakeupstream.New(fakeupstream.Script{Model: "qwen3:8b"}))
	notFound := listen(http.NotFoundHandler())
	other := listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"hello":"world"}`)) }))
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()

	got := node.Discover(ctx, []setup.LocalServer{
		{Name: "closed", Port: closed, Kind: "vllm"},
		{Name: "404", Port: notFound, Kind: "llamacpp"},
		{Name: "other", Port: other, Kind: "sglang"},
		{Name: "Ollama", Port: model, Kind: "ollama"},
	})
	if len(got) != 1 || got[0].Name != "Ollama" || got[0].URL != "http://127.0.0.1:"+model+"/v1" || got[0].Kind != "ollama" ||
		len(got[0].Models) != 1 || got[0].Models[0] != "qwen3:8b" {
		t.Fatalf("found %+v, want the model server alone, with its model", got)
	}
}
