package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

// runLoopGateway serves a gateway on ln whose upstream is upstream.
func runLoopGateway(t *testing.T, upstream string, mem *memStore) (gw *Gateway, url string) {
	t.Helper()
	ln := listen(t)
	url = "http://" + ln.Addr().String()
	if upstream == "" {
		upstream = url + "/v1" // itself
	}
	gw, err := New(Config{Upstream: upstream, Store: mem})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("gateway Run did not return")
		}
	})
	return gw, url
}

// TestGatewayLoop: a gateway that is its own upstream answers a call with
// one 508 Loop Detected, an OpenAI-shaped error, after one pass round
// the loop, and records nothing; two gateways that are each other's
// upstream do the same; through a pass-through route as well.
func TestGatewayLoop(t *testing.T) {
	const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	check := func(t *testing.T, url string, mems []*memStore, gws []*Gateway) {
		t.Helper()
		status, hdr, b := post(t, url+"/v1/chat/completions", body, nil)
		if status != http.StatusLoopDetected || hdr.Get(LoopHeader) == "" {
			t.Fatalf("status %d (%s), want 508 naming the gateway: %s", status, hdr.Get(LoopHeader), b)
		}
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != "loop_detected" || e.Error.Type != "api_error" || !strings.Contains(e.Error.Message, "upstream") {
			t.Errorf("the error %s (%v) is not an OpenAI-shaped loop_detected", b, err)
		}
		var requests uint64
		for i, gw := range gws {
			requests += gw.Stats().Requests
			if n := len(mems[i].all(t)); n != 0 {
				t.Errorf("gateway %d recorded %d steps of a loop", i, n)
			}
		}
		if requests != uint64(len(gws)+1) {
			t.Errorf("the call went through the gateways %d times, want %d: once round the loop", requests, len(gws)+1)
		}
		resp, err := http.Get(url + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusLoopDetected {
			t.Errorf("pass-through: status %d, want 508", resp.StatusCode)
		}
	}
	t.Run("itself", func(t *testing.T) {
		mem := newMemStore()
		gw, url := runLoopGateway(t, "", mem)
		check(t, url, []*memStore{mem}, []*Gateway{gw})
	})
	t.Run("two", func(t *testing.T) {
		// b's upstream is a; a's is b: a is made on b's address once b
		// listens, so b is made first with a placeholder it never uses.
		ma, mb := newMemStore(), newMemStore()
		lnA := listen(t)
		urlA := "http://" + lnA.Addr().String()
		gb, urlB := runLoopGateway(t, urlA+"/v1", mb)
		ga, err := New(Config{Upstream: urlB + "/v1", Store: ma})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ga.Run(ctx, lnA) }()
		defer func() { cancel(); <-done }()
		check(t, urlA, []*memStore{ma, mb}, []*Gateway{ga, gb})
	})
}

// TestGatewayHopHeader: what a gateway forwards names it in HopHeader,
// after the gateways the call came through; a call through too many is
// refused.
func TestGatewayHopHeader(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.HopID = "gw1" })
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	if status, _, b := post(t, e.url+"/v1/chat/completions", body, map[string]string{HopHeader: "edge0"}); status != 200 {
		t.Fatalf("status %d: %s", status, b)
	}
	if got := lastRequest(t, e.up).Header.Get(HopHeader); got != "edge0, gw1" {
		t.Errorf("forwarded %s: %q, want %q", HopHeader, got, "edge0, gw1")
	}
	many := strings.TrimSuffix(strings.Repeat("x,", maxHops), ",")
	if status, _, b := post(t, e.url+"/v1/chat/completions", body, map[string]string{HopHeader: many}); status != http.StatusLoopDetected {
		t.Errorf("a call through %d gateways: status %d, want 508: %s", maxHops, status, b)
	}
	if _, err := New(Config{Upstream: "http://127.0.0.1:9/v1", Store: newMemStore(), HopID: "a, b"}); err == nil {
		t.Error("a HopID with a comma was accepted")
	}
}
