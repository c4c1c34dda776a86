package node_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/node"
)

func TestProbeUpstream(t *testing.T) {
	ctx := context.Background()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer up" {
			w.WriteHeader(401)
			return
		}
		w.Write([]byte(`{"data":[]}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	if w := node.ProbeUpstream(ctx, srv.URL+"/v1", "up"); w != "" {
		t.Errorf("a working upstream: %q", w)
	}
	if w := node.ProbeUpstream(ctx, srv.URL, "up"); !strings.Contains(w, "404") || !strings.Contains(w, "--upstream "+srv.URL+"/v1") {
		t.Errorf("an upstream without /v1: %q", w)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	if w := node.ProbeUpstream(ctx, dead, ""); !strings.Contains(w, "does not answer") {
		t.Errorf("an unreachable upstream: %q", w)
	}
}
