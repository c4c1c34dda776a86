package node_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
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

// MaxBody bounds a call's body: a larger one is refused with 413 and
// nothing is recorded.
func TestMaxBody(t *testing.T) {
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "ok"}}}, node.Config{MaxBody: 2048, NoScoring: true})
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a 4 KiB body with MaxBody 2 KiB: %d", resp.StatusCode)
	}
	if st, err := n.Pool().Stats(context.Background()); err != nil || st.Steps != 0 {
		t.Errorf("recorded %d steps, %v", st.Steps, err)
	}
}
