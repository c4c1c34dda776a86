package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

// routeEnv is a gateway whose Route is what the test stores, in front of
// two upstreams on 127.0.0.1: e.up (Config.Upstream) and e.direct (the one
// a Route may name instead).
func routeEnv(t *testing.T, script fakeupstream.Script) (*env, *atomic.Pointer[Route]) {
	var route atomic.Pointer[Route]
	route.Store(&Route{Adapter: "v1"})
	e := newEnv(t, script, func(c *Config) { c.Route = func() Route { return *route.Load() } })
	return e, &route
}

// members decodes a JSON object's members.
func members(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// TestRouteUpstreamAndFields sends calls of every kind through a gateway
// whose route names another upstream and body fields: each call goes
// wholly to the route's upstream, with the fields set in its body and the
// model rewritten, and its step records where it went.
func TestRouteUpstreamAndFields(t *testing.T) {
	e, route := routeEnv(t, fakeupstream.Script{})
	v2 := Route{Model: "served-v2", Adapter: "v2", Upstream: e.directURL + "/v1",
		Fields: `{"adapters": "/data/adapters/v2.mlx", "seed": 7}`}
	route.Store(&v2)

	calls := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"client-model","seed":1,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"client-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"client-model","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"client-model","input":"hi"}`},
	}
	for i, c := range calls {
		status, _, body := post(t, e.url+c.path, c.body, nil)
		if status != 200 {
			t.Fatalf("%s: %d %s", c.path, status, body)
		}
		if n := len(e.up.Requests()); n != 0 {
			t.Fatalf("%s: the configured upstream got %d requests; the route names another", c.path, n)
		}
		rs := e.direct.Requests()
		if len(rs) != i+1 {
			t.Fatalf("%s: the route's upstream got %d requests, want %d", c.path, len(rs), i+1)
		}
		got := members(t, rs[i].Body)
		want := members(t, []byte(c.body))
		want["model"] = json.RawMessage(`"served-v2"`)
		want["adapters"] = json.RawMessage(`"/data/adapters/v2.mlx"`)
		want["seed"] = json.RawMessage(`7`)
		for k, v := range want {
			if string(got[k]) != string(v) && k != "messages" && k != "input" {
				t.Errorf("%s: upstream body member %s = %s, want %s", c.path, k, got[k], v)
			}
			if _, ok := got[k]; !ok {
				t.Errorf("%s: upstream body lacks %s: %s", c.path, k, rs[i].Body)
			}
		}
	}
	// A call the gateway passes through goes there too.
	resp, err := http.Get(e.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models: %d", resp.StatusCode)
	}
	if rs := e.direct.Requests(); rs[len(rs)-1].Path != "/v1/models" || len(e.up.Requests()) != 0 {
		t.Fatalf("GET /v1/models did not go to the route's upstream alone")
	}
	eventually(t, "every call recorded", func() bool { return len(e.mem.all(t)) == len(calls) })
	for _, s := range e.mem.all(t) {
		if s.Upstream != e.directURL+"/v1" || s.Adapter != "v2" {
			t.Errorf("step %s: upstream %q adapter %q, want the route's %q and v2", s.ID, s.Upstream, s.Adapter, e.directURL+"/v1")
		}
	}

	// Back to a route without them: the configured upstream, the body as
	// the client sent it.
	route.Store(&Route{Adapter: "v1"})
	body := `{"model":"client-model","messages":[{"role":"user","content":"hi"}]}`
	if status, _, b := post(t, e.url+"/v1/chat/completions", body, nil); status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	rs := e.up.Requests()
	if len(rs) != 1 || len(e.direct.Requests()) != len(calls)+1 {
		t.Fatalf("a call on the default route: %d requests upstream, %d to the other", len(rs), len(e.direct.Requests()))
	}
	if got := jsonKeys(t, rs[0].Body); strings.Join(got, ",") != "messages,model" || !strings.Contains(string(rs[0].Body), `"client-model"`) {
		t.Fatalf("the default route changed the body: %s", rs[0].Body)
	}

	// Fields that are not a JSON object: the call goes as the client sent
	// it, and its step names no adapter (it was not served by one).
	route.Store(&Route{Adapter: "v3", Fields: `{"adapters":`})
	if status, _, b := post(t, e.url+"/v1/chat/completions", body, nil); status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	rs = e.up.Requests()
	if got := jsonKeys(t, rs[len(rs)-1].Body); strings.Join(got, ",") != "messages,model" {
		t.Fatalf("bad fields reached the body: %s", rs[len(rs)-1].Body)
	}
	steps := e.mem.all(t)
	if s := steps[len(steps)-1]; s.Adapter != "" {
		t.Fatalf("a call sent without its route's fields records adapter %q", s.Adapter)
	}
}

// TestRouteFlipMidStream flips the route while a streamed call is in
// flight: the call finishes from the upstream it started on, and only the
// next call goes to the new route's.
func TestRouteFlipMidStream(t *testing.T) {
	hold := make(chan struct{})
	e, route := routeEnv(t, fakeupstream.Script{Hold: hold, Chunks: 4, Respond: func(n int, r fakeupstream.Request) fakeupstream.Turn {
		tn := fakeupstream.Turn{Text: "one two three four"}
		if strings.Contains(string(r.Body), "hold") {
			tn.HoldAfter = 2
		}
		return tn
	}})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) }) // before the gateway stops
	route.Store(&Route{Adapter: "v2", Upstream: e.directURL + "/v1", Fields: `{"adapters":"/a/v2.mlx"}`})

	type result struct {
		status int
		body   []byte
	}
	done := make(chan result, 1)
	go func() {
		status, _, body := post(t, e.url+"/v1/chat/completions",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hold"}]}`, nil)
		done <- result{status, body}
	}()
	eventually(t, "the stream to start", func() bool { return len(e.direct.Requests()) == 1 })
	route.Store(&Route{Adapter: "v3", Fields: `{"adapters":"/a/v3.mlx"}`})
	release.Do(func() { close(hold) })
	r := <-done
	if r.status != 200 || !strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("the stream across the flip: %d %s", r.status, r.body)
	}
	var text strings.Builder
	for _, line := range strings.Split(string(r.body), "\n") {
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(d), &chunk) == nil && len(chunk.Choices) > 0 {
			text.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	if text.String() != "one two three four" {
		t.Fatalf("the stream across the flip said %q", text.String())
	}
	if n := len(e.up.Requests()); n != 0 {
		t.Fatalf("the new route's upstream got %d requests during the old call", n)
	}
	if status, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil); status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	rs := e.up.Requests()
	if len(rs) != 1 || len(e.direct.Requests()) != 1 || string(members(t, rs[0].Body)["adapters"]) != `"/a/v3.mlx"` {
		t.Fatalf("the call after the flip: %d to the new upstream (%v), %d to the old", len(rs), rs, len(e.direct.Requests()))
	}
}
