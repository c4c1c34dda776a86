package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node/gateway/wire"
	"github.com/clawmesh/clawmesh/pool"
)

func wireCaps(lp, ids bool) wire.Caps { return wire.Caps{Logprobs: lp, TokenIDs: ids} }

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{
		{Store: newMemStore()},
		{Upstream: "ftp://x/v1", Store: newMemStore()},
		{Upstream: "http://127.0.0.1:1/v1"},
		{Upstream: "http://127.0.0.1:1/v1", Store: newMemStore(), MaxBodyBytes: -1},
		{Upstream: "http://127.0.0.1:1/v1", Store: newMemStore(), StreamIdleTimeout: -time.Second},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}

func TestStepIDSortable(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b, c := NewStepID(t0), NewStepID(t0), NewStepID(t0.Add(time.Millisecond))
	if a == b || len(a) != 26 {
		t.Fatalf("ids %q %q", a, b)
	}
	if !(a < c && b < c) {
		t.Errorf("ids not time-sortable: %q %q %q", a, b, c)
	}
}

func TestTraceID(t *testing.T) {
	for in, want := range map[string]string{
		"00-1be91ccc5596bc8940990b686d426835-ea328bf9640005df-01":       "1be91ccc5596bc8940990b686d426835",
		"00-00000000000000000000000000000000-ea328bf9640005df-01":       "",
		"00-1BE91CCC5596BC8940990B686D426835-ea328bf9640005df-01":       "",
		"00-1be91ccc5596bc8940990b686d426835-ea328bf9640005df":          "",
		"01-1be91ccc5596bc8940990b686d426835-ea328bf9640005df-01-extra": "1be91ccc5596bc8940990b686d426835",
		"": "",
	} {
		if got := traceID(in); got != want {
			t.Errorf("traceID(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSessionIdentity: path beats header beats body; X-Session-* headers
// are stripped before forwarding; side turns and trace ids are recorded.
func TestSessionIdentity(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, nil)
	body := `{"model":"m","user":"body-user","messages":[{"role":"user","content":"hello"}]}`
	cases := []struct {
		path    string
		hdr     map[string]string
		session core.SessionID
		turn    core.TurnType
	}{
		{"/s/pathsess/v1/chat/completions", map[string]string{"X-Session-Id": "hdr"}, "pathsess", core.TurnMain},
		{"/v1/chat/completions", map[string]string{"X-Session-Id": "hdr", "X-Turn-Type": "side"}, "hdr", core.TurnSide},
		{"/v1/chat/completions", nil, "body-user", core.TurnMain},
	}
	for i, c := range cases {
		hdr := map[string]string{"Traceparent": "00-1be91ccc5596bc8940990b686d426835-ea328bf9640005df-01"}
		for k, v := range c.hdr {
			hdr[k] = v
		}
		st, _, b := post(t, e.url+c.path, body, hdr)
		if st != 200 {
			t.Fatalf("case %d: %d %s", i, st, b)
		}
		up := lastRequest(t, e.up)
		if up.Path != "/v1/chat/completions" || up.Header.Get("X-Session-Id") != "" || up.Header.Get("X-Turn-Type") != "" {
			t.Errorf("case %d: forwarded %s with headers %v", i, up.Path, up.Header)
		}
		steps := e.mem.all(t)
		s := steps[len(steps)-1]
		if s.SessionID != c.session || s.Turn != c.turn || s.TraceID != "1be91ccc5596bc8940990b686d426835" {
			t.Errorf("case %d: session %q turn %q trace %q", i, s.SessionID, s.Turn, s.TraceID)
		}
	}
	// The body's fields, most reliable first: metadata.user_id,
	// prompt_cache_key, user.
	for i, c := range []struct{ body, want string }{
		{`{"model":"m","metadata":{"user_id":"meta"},"prompt_cache_key":"pck","user":"u","messages":[{"role":"user","content":"a"}]}`, "meta"},
		{`{"model":"m","prompt_cache_key":"pck","user":"u","messages":[{"role":"user","content":"b"}]}`, "pck"},
		{`{"model":"m","metadata":{"user_id":7},"user":"u","messages":[{"role":"user","content":"c"}]}`, "u"},
	} {
		if st, _, b := post(t, e.url+"/v1/chat/completions", c.body, nil); st != 200 {
			t.Fatalf("body case %d: %d %s", i, st, b)
		}
		steps := e.mem.all(t)
		if got := steps[len(steps)-1].SessionID; got != core.SessionID(c.want) {
			t.Errorf("body case %d: session %q, want %q", i, got, c.want)
		}
	}
	if st, _, _ := post(t, e.url+"/v1/chat/completions", chatBody, map[string]string{"X-Turn-Type": "sideways"}); st != 400 {
		t.Errorf("bad X-Turn-Type: %d", st)
	}
	if st, _, _ := post(t, e.url+"/v1/chat/completions", `{"messages":`, nil); st != 400 {
		t.Errorf("bad JSON: %d", st)
	}
}

// TestSideTurnNoNextState: a side turn in the middle of a session is
// recorded but does not become the main step's next state.
func TestSideTurnNoNextState(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "first"}, {Text: "HEARTBEAT_OK"}, {Text: "second"}}}, nil)
	h := map[string]string{"X-Session-Id": "s1"}
	post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}]}`, h)
	post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"first"},{"role":"user","content":"heartbeat"}]}`,
		map[string]string{"X-Session-Id": "s1", "X-Turn-Type": "side"})
	post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"first"},{"role":"user","content":"b"}]}`, h)
	steps := e.mem.all(t)
	if len(steps) != 3 {
		t.Fatalf("%d steps", len(steps))
	}
	if ns := steps[0].NextState; ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Content != "b" || ns.StepID != steps[2].ID {
		t.Errorf("main step next state %+v, want the user's b from step 3", ns)
	}
	if steps[1].Turn != core.TurnSide || steps[1].SessionID != "s1" {
		t.Errorf("side step %+v", steps[1])
	}
}

// TestSessionDone: X-Session-Done on a call supplies the previous step's
// next state and ends the chain, so the call's own step is closed with none.
func TestSessionDone(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "first"}, {Text: "bye"}}}, nil)
	post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}]}`, map[string]string{"X-Session-Id": "d1"})
	if st, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"first"},{"role":"user","content":"thanks"}]}`,
		map[string]string{"X-Session-Id": "d1", "X-Session-Done": "true"}); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	steps := e.mem.all(t)
	if len(steps) != 2 {
		t.Fatalf("%d steps", len(steps))
	}
	if ns := steps[0].NextState; steps[0].State != core.StateClosed || ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Content != "thanks" {
		t.Errorf("first step: state %s, next state %+v", steps[0].State, ns)
	}
	if steps[1].State != core.StateClosed || steps[1].NextState != nil {
		t.Errorf("last step of a done session: state %s, next state %+v", steps[1].State, steps[1].NextState)
	}
	if st, _, _ := post(t, e.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Done": "maybe"}); st != 400 {
		t.Errorf("bad X-Session-Done: %d", st)
	}
}

func TestFeedback(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, nil)
	post(t, e.url+"/s/fb/v1/chat/completions", chatBody, nil)
	id := e.mem.all(t)[0].ID
	fb := e.url + "/clawmesh/v1/feedback"

	st, _, b := post(t, fb, `{"session_id":"fb","score":1,"text":"great"}`, nil)
	var out struct {
		StepID core.StepID `json:"step_id"`
	}
	if st != 200 || json.Unmarshal(b, &out) != nil || out.StepID != id {
		t.Fatalf("feedback by session: %d %s (want step %s)", st, b, id)
	}
	if st, _, b := post(t, fb, `{"step_id":"`+string(id)+`","score":-0.5}`, nil); st != 200 {
		t.Fatalf("feedback by step: %d %s", st, b)
	}
	s := e.mem.get(t, id)
	if len(s.Feedback) != 2 || *s.Feedback[0].Score != 1 || s.Feedback[0].Text != "great" || *s.Feedback[1].Score != -0.5 || s.Feedback[1].At.IsZero() {
		t.Errorf("feedback recorded %+v", s.Feedback)
	}
	for body, want := range map[string]int{
		`{"session_id":"fb","score":2}`:     400,
		`{"session_id":"fb"}`:               400,
		`{"score":1}`:                       400,
		`not json`:                          400,
		`{"session_id":"nobody","score":1}`: 404,
		`{"step_id":"nope","score":1}`:      404,
		`{"session_id":"other","step_id":"` + string(id) + `","score":1}`: 404,
	} {
		if st, _, b := post(t, fb, body, nil); st != want {
			t.Errorf("%s: %d %s, want %d", body, st, b, want)
		}
	}
}

// TestDisconnectCancelsUpstream: a client that goes away mid-stream cancels
// the upstream call, and the partial step is recorded.
func TestDisconnectCancelsUpstream(t *testing.T) {
	hold := make(chan struct{}) // never released: only the disconnect ends the stream
	e := newEnv(t, fakeupstream.Script{Chunks: 4, Hold: hold, Turns: []fakeupstream.Turn{{Text: "abcdefgh", HoldAfter: 1}}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	for i := 0; i < 2; i++ { // role chunk, first text chunk
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		rd.ReadString('\n')
	}
	cancel()
	resp.Body.Close()
	eventually(t, "upstream cancel", func() bool { return e.up.Canceled() == 1 })
	eventually(t, "partial step", func() bool { return len(e.mem.all(t)) == 1 })
	s := e.mem.all(t)[0]
	if !s.ClientDisconnected || s.State != core.StateClosed || s.Action().Content != "ab" {
		t.Errorf("disconnected step: disconnected %v state %v action %+v", s.ClientDisconnected, s.State, s.Action())
	}
	if e.gw.Stats().ClientDisconnected != 1 {
		t.Errorf("stats %+v", e.gw.Stats())
	}
}

func TestUpstreamDown(t *testing.T) {
	ln := listen(t)
	dead := "http://" + ln.Addr().String()
	ln.Close()
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.Upstream = dead + "/v1" })
	st, h, b := post(t, e.url+"/v1/chat/completions", chatBody, nil)
	var oe struct {
		Error struct {
			Message, Type string
		} `json:"error"`
	}
	if st != 502 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") || json.Unmarshal(b, &oe) != nil || oe.Error.Message == "" {
		t.Errorf("chat: %d %s", st, b)
	}
	st, _, b = post(t, e.url+"/v1/messages", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil)
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type, Message string
		} `json:"error"`
	}
	if st != 502 || json.Unmarshal(b, &ae) != nil || ae.Type != "error" || ae.Error.Type != "api_error" {
		t.Errorf("messages: %d %s", st, b)
	}
	if st, _, _ := post(t, e.url+"/v1/embeddings", `{}`, nil); st != 502 {
		t.Errorf("pass-through: %d", st)
	}
	steps := e.mem.all(t)
	if len(steps) != 2 || steps[0].Response.Status != 502 || steps[0].Response.Error == nil || steps[0].State != core.StateFailed {
		t.Errorf("recorded %d steps: %+v", len(steps), steps)
	}
}

// TestFailedCallKeepsLittle: a prompt the upstream refuses as too long
// reaches the upstream whole, but its step, failed, keeps only the start of
// each long text, saying how much was left out; a call that succeeds keeps
// all of it.
func TestFailedCallKeepsLittle(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Status: 400, ErrorBody: `{"error":{"message":"maximum context length exceeded","type":"invalid_request_error"}}`},
		{Text: "ok"},
	}}, nil)
	long := strings.Repeat("é word ", 300_000) // 2.4 MB, two-byte characters among one-byte ones
	body := func(q string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]any{
			{"role": "system", "content": "be brief"},
			{"role": "user", "content": q},
			{"role": "assistant", "content": "", "tool_calls": []map[string]any{{"id": "c1", "type": "function", "function": map[string]string{"name": "f", "arguments": q}}}},
			{"role": "tool", "tool_call_id": "c1", "content": "done"},
		}})
		return string(b)
	}
	if st, _, b := post(t, e.url+"/v1/chat/completions", body(long), nil); st != 400 {
		t.Fatalf("the refused call: %d %s", st, b)
	}
	if st, _, b := post(t, e.url+"/v1/chat/completions", body(long+"again"), nil); st != 200 {
		t.Fatalf("the good call: %d %s", st, b)
	}
	if reqs := e.up.Requests(); len(reqs) != 2 || len(reqs[0].Body) < 2*len(long) {
		t.Fatalf("the upstream got %d requests; the first of %d bytes, want the whole prompt", len(reqs), len(reqs[0].Body))
	}
	steps := e.mem.all(t)
	if len(steps) != 2 || steps[0].State != core.StateFailed || steps[1].State == core.StateFailed {
		t.Fatalf("%d steps: want the failed one, then the good one", len(steps))
	}
	failed, good := steps[0].Request.Messages, steps[1].Request.Messages
	if len(failed) != 4 || failed[0].Content != "be brief" || failed[3].Content != "done" {
		t.Fatalf("the failed step's short messages changed: %+v", failed)
	}
	for _, text := range []string{failed[1].Content, failed[2].ToolCalls[0].Arguments} {
		if len(text) > failedKeep+100 || !strings.HasPrefix(long, strings.SplitN(text, "…", 2)[0]) ||
			!utf8.ValidString(text) || !strings.Contains(text, "more bytes not kept: the call failed]") {
			t.Errorf("the failed step kept %d bytes: %.80q ... %q", len(text), text, text[max(0, len(text)-60):])
		}
	}
	if good[1].Content != long+"again" || good[2].ToolCalls[0].Arguments != long+"again" {
		t.Errorf("the good call's step lost text: %d bytes of %d", len(good[1].Content), len(long)+5)
	}
}

// TestUpstreamErrors: a non-2xx reply is forwarded verbatim and recorded;
// a mid-stream error is forwarded and recorded.
func TestUpstreamErrors(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Status: 429, ErrorBody: `{"error":{"message":"slow down","type":"rate_limit","code":"rate_limit"}}`},
		{Text: "abcdef", StreamErrorAfter: 2},
		{Text: "abcdef", StreamErrorAfter: 2, DoneAfterError: true},
	}}, nil)
	st, _, b := post(t, e.url+"/v1/chat/completions", chatBody, nil)
	if st != 429 || string(b) != `{"error":{"message":"slow down","type":"rate_limit","code":"rate_limit"}}` {
		t.Errorf("429 not forwarded verbatim: %d %s", st, b)
	}
	st, _, b = post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	if st != 200 || !strings.Contains(string(b), "scripted mid-stream failure") {
		t.Errorf("mid-stream error not forwarded: %s", b)
	}
	// vLLM's [DONE] after the error reaches the client too.
	st, _, b = post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"y"}]}`, nil)
	if st != 200 || !strings.Contains(string(b), "scripted mid-stream failure") || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Errorf("error then [DONE] not forwarded: %q", b)
	}
	steps := e.mem.all(t)
	if len(steps) != 3 {
		t.Fatalf("%d steps", len(steps))
	}
	if steps[0].Response.Status != 429 || steps[0].Response.Error == nil || steps[0].State != core.StateFailed {
		t.Errorf("429 step %+v", steps[0].Response)
	}
	if steps[1].Response.Error == nil || steps[1].Action().Content != "abcd" || steps[1].State != core.StateFailed {
		t.Errorf("mid-stream error step %s %+v", steps[1].State, steps[1].Response)
	}
}

// TestStreamWithoutDone: a chat stream that ends after its finish reason
// with no [DONE] (some servers omit it) is a complete reply that chains and
// gets its next state; one that ends before its finish reason is cut.
func TestStreamWithoutDone(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Text: "first", NoDone: true},
		{Text: "second", NoDone: true},
		{Text: "abcdef", StreamErrorAfter: 2},
	}}, nil)
	h := map[string]string{"X-Session-Id": "nd"}
	st, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a"}]}`, h)
	if st != 200 || strings.Contains(string(b), "[DONE]") || !strings.Contains(string(b), `"finish_reason":"stop"`) {
		t.Fatalf("stream without [DONE] not relayed as it was: %d %q", st, b)
	}
	post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"first"},{"role":"user","content":"b"}]}`, h)
	post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"c"}]}`, nil)
	steps := e.mem.all(t)
	if len(steps) != 3 {
		t.Fatalf("%d steps", len(steps))
	}
	if r := steps[0].Response; r.Error != nil || steps[0].Action().Content != "first" || r.Choices[0].FinishReason != "stop" {
		t.Errorf("first step: error %s, action %+v", r.Error, steps[0].Action())
	}
	if ns := steps[0].NextState; ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Content != "b" || ns.StepID != steps[1].ID {
		t.Errorf("first step's next state %+v, want the user's b", ns)
	}
	if steps[1].State != core.StateOpen {
		t.Errorf("second step: state %s, want open (its chain goes on)", steps[1].State)
	}
	if r := steps[2].Response; r.Error == nil || steps[2].State != core.StateFailed {
		t.Errorf("stream cut before its finish reason: error %s, state %s", r.Error, steps[2].State)
	}
}

// TestStreamCut: an upstream that dies in the middle of a streamed reply
// breaks the client's stream too (a truncated transfer, or first the error
// event where the API has one), and the step keeps what arrived, failed.
func TestStreamCut(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Chunks: 6, Turns: []fakeupstream.Turn{{Text: "abcdef", CutAfter: 3}}}, nil)
	for _, c := range []struct{ path, body, wantInBody string }{
		{"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, `"content":"c"`},
		{"/v1/messages", `{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"x"}]}`, "event: error\ndata: {\"error\":{"},
		{"/v1/responses", `{"model":"m","stream":true,"input":"x"}`, `"delta":"c"`},
	} {
		resp, err := http.Post(e.url+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: reading a cut stream ended with %v, want a truncated transfer; body %q", c.path, err, b)
		}
		if !strings.Contains(string(b), c.wantInBody) || strings.Contains(string(b), "[DONE]") {
			t.Errorf("%s: the client got %q", c.path, b)
		}
	}
	steps := e.mem.all(t)
	if len(steps) != 3 {
		t.Fatalf("%d steps", len(steps))
	}
	for _, s := range steps {
		if s.State != core.StateFailed || s.Response.Error == nil || !strings.Contains(string(s.Response.Error), "upstream_cut") || s.Action().Content != "abc" {
			t.Errorf("%s step: state %s, error %s, action %q; want failed, upstream_cut, what arrived", s.API, s.State, s.Response.Error, s.Action().Content)
		}
	}
}

func TestSafety(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Token = "gw-secret"
		c.UpstreamToken = "up-secret"
		c.MaxBodyBytes = 1000
		// The admin API (a pool import) streams bodies of any size.
		c.Admin = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d %v", n, err)
		})
	})
	u := e.url + "/v1/chat/completions"
	if st, _, b := post(t, e.url+"/clawmesh/v1/pool/import", strings.Repeat("x", 5000), map[string]string{"Authorization": "Bearer gw-secret"}); st != 200 || string(b) != "5000 <nil>" {
		t.Errorf("admin body over MaxBodyBytes: %d %s", st, b)
	}
	if st, _, _ := post(t, e.url+"/clawmesh/v1/pool/import", "x", nil); st != 401 {
		t.Errorf("admin without token: %d", st)
	}
	if st, _, _ := post(t, u, chatBody, nil); st != 401 {
		t.Errorf("no token: %d", st)
	}
	if st, _, _ := post(t, u, chatBody, map[string]string{"Authorization": "Bearer wrong"}); st != 401 {
		t.Errorf("wrong token: %d", st)
	}
	if st, _, b := post(t, u, chatBody, map[string]string{"Authorization": "Bearer gw-secret"}); st != 200 {
		t.Errorf("right token: %d %s", st, b)
	}
	if a := lastRequest(t, e.up).Header.Get("Authorization"); a != "Bearer up-secret" {
		t.Errorf("upstream Authorization %q", a)
	}
	if st, _, b := post(t, e.url+"/v1/messages", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, map[string]string{"X-Api-Key": "gw-secret"}); st != 200 {
		t.Errorf("x-api-key: %d %s", st, b)
	}
	if k := lastRequest(t, e.up).Header.Get("X-Api-Key"); k != "" {
		t.Errorf("gateway token leaked upstream as x-api-key %q", k)
	}
	auth := map[string]string{"Authorization": "Bearer gw-secret"}
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`
	st, _, b := post(t, u, big, auth)
	var oe struct {
		Error struct{ Message string } `json:"error"`
	}
	if st != 413 || json.Unmarshal(b, &oe) != nil || oe.Error.Message == "" {
		t.Errorf("big body: %d %s", st, b)
	}
	// Chunked (no Content-Length) big body.
	req, _ := http.NewRequest(http.MethodPost, u, io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Authorization", "Bearer gw-secret")
	req.ContentLength = -1
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 413 {
		t.Errorf("chunked big body: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	for _, h := range []map[string]string{
		{"Origin": "http://evil.example"},
		{"Origin": "http://localhost:1"},
		{"Sec-Fetch-Site": "cross-site"},
	} {
		h["Authorization"] = "Bearer gw-secret"
		if st, _, _ := post(t, u, chatBody, h); st != 403 {
			t.Errorf("%v: %d", h, st)
		}
	}
	if st, _, b := post(t, u, chatBody, map[string]string{"Authorization": "Bearer gw-secret", "Origin": e.url}); st != 200 {
		t.Errorf("same origin: %d %s", st, b)
	}
	req, _ = http.NewRequest(http.MethodOptions, u, nil)
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if st, _, _ := post(t, e.url+"/v2/chat/completions", chatBody, auth); st != 404 {
		t.Errorf("unknown route: %d", st)
	}
}

func TestPassThroughModels(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{Model: "tiny"}, nil)
	get := func(base string) (int, []byte) {
		resp, err := http.Get(base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	s1, b1 := get(e.url)
	s2, b2 := get(e.directURL)
	if s1 != 200 || s1 != s2 || string(b1) != string(b2) {
		t.Errorf("models: %d %s vs %d %s", s1, b1, s2, b2)
	}
	if len(e.mem.all(t)) != 0 {
		t.Errorf("pass-through was recorded")
	}
	req, _ := http.NewRequest(http.MethodGet, e.url+"/s/x/v1/models?limit=2", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if up := lastRequest(t, e.up); resp.StatusCode != 200 || up.Path != "/v1/models" {
		t.Errorf("session-prefixed models: %d %s", resp.StatusCode, up.Path)
	}
}

func TestAdminMount(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Admin = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "admin:"+r.URL.Path) })
	})
	resp, err := http.Get(e.url + "/clawmesh/v1/pool/export")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "admin:/clawmesh/v1/pool/export" {
		t.Errorf("admin got %q", b)
	}
}

// TestRecordFailureDoesNotBreakAgent: a Store that fails still lets the
// client's call complete; the failure is counted.
func TestRecordFailureDoesNotBreakAgent(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, nil)
	e.mem.mu.Lock()
	e.mem.fail = errors.New("disk full")
	e.mem.mu.Unlock()
	st, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	if st != 200 || !strings.Contains(string(b), "data: [DONE]") {
		t.Errorf("stream with failing store: %d %s", st, b)
	}
	if s := e.gw.Stats(); s.RecordFailures != 1 || s.Recorded != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestGracefulShutdown: cancelling Run's context while a stream is in
// flight lets it finish, records it, then Run returns.
func TestGracefulShutdown(t *testing.T) {
	hold := make(chan struct{})
	e := newEnv(t, fakeupstream.Script{Chunks: 4, Hold: hold, Turns: []fakeupstream.Turn{{Text: "abcdefgh", HoldAfter: 2}}}, nil)
	resp, err := http.Post(e.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil { // the stream is under way
		t.Fatal(err)
	}
	e.stop() // SIGTERM
	// New connections are refused once shutdown began.
	eventually(t, "listener closed", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-e.done:
		t.Fatalf("Run returned (%v) while a stream was in flight", err)
	default:
	}
	close(hold)
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream did not finish: %v %q", err, rest)
	}
	waitRun(t, e)
	steps := e.mem.all(t)
	if len(steps) != 1 || steps[0].Action().Content != "abcdefgh" || steps[0].ClientDisconnected {
		t.Fatalf("recorded %+v", steps)
	}
	// The chain stays open on disk for the next run to resume.
	if steps[0].State != core.StateOpen || steps[0].NextState != nil {
		t.Errorf("after shutdown: state %v next %+v", steps[0].State, steps[0].NextState)
	}
}

// TestRealPool runs a chain against the Pebble pool on disk.
func TestRealPool(t *testing.T) {
	p, err := pool.Open(t.TempDir(), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "one"}, {Text: "two"}}}, func(c *Config) { c.Store = p })
	post(t, e.url+"/s/disk/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"a"}]}`, nil)
	post(t, e.url+"/s/disk/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"one"},{"role":"user","content":"b"}]}`, nil)
	st, _, b := post(t, e.url+"/clawmesh/v1/feedback", `{"session_id":"disk","score":0.5}`, nil)
	if st != 200 {
		t.Fatalf("feedback: %d %s", st, b)
	}
	// The session's last step is open: the answer says when the feedback
	// will count.
	var fr FeedbackReply
	if err := json.Unmarshal([]byte(b), &fr); err != nil || fr.StepID == "" || fr.State != core.StateOpen ||
		!strings.Contains(fr.Scoring, "X-Session-Done") || !strings.Contains(fr.Scoring, "30m0s") {
		t.Errorf("feedback answer %s: %v", b, err)
	}
	if st, _, _ := post(t, e.url+"/clawmesh/v1/feedback", `{"step_id":"unknown","score":0.5}`, nil); st != 404 {
		t.Errorf("unknown step: %d", st)
	}
	steps, err := p.List(context.Background(), pool.Filter{Session: "disk"})
	if err != nil || len(steps) != 2 {
		t.Fatalf("list: %d %v", len(steps), err)
	}
	first, second := steps[0], steps[1]
	if first.Action().Content != "one" || first.State != core.StateClosed || first.NextState == nil || first.NextState.Messages[0].Content != "b" {
		t.Errorf("first step: %+v next %+v", first.State, first.NextState)
	}
	if second.ParentID != first.ID || len(second.Feedback) != 1 || *second.Feedback[0].Score != 0.5 {
		t.Errorf("second step: parent %q feedback %+v", second.ParentID, second.Feedback)
	}
}

// TestReplyTimeout: a non-streaming reply may be silent longer than
// StreamIdleTimeout (the upstream is generating it whole) and is cut only
// by ReplyTimeout.
func TestReplyTimeout(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		wait := release
		if strings.Contains(string(body), "again") {
			wait = nil // never released
		}
		select {
		case <-wait:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}`)
	}))
	defer slow.Close()
	edit := func(reply time.Duration) func(*Config) {
		return func(c *Config) {
			c.Upstream = slow.URL + "/v1"
			c.StreamIdleTimeout = 50 * time.Millisecond
			c.ReplyTimeout = reply
		}
	}
	// Silent for several idle timeouts, then the reply: it arrives.
	e := newEnv(t, fakeupstream.Script{}, edit(time.Minute))
	go func() { time.Sleep(300 * time.Millisecond); close(release) }()
	if st, _, b := post(t, e.url+"/v1/chat/completions", chatBody, nil); st != 200 || !strings.Contains(string(b), "done") {
		t.Fatalf("slow non-streaming reply: %d %s", st, b)
	}
	// Silent past ReplyTimeout: 502, and the step says why.
	e = newEnv(t, fakeupstream.Script{}, edit(100*time.Millisecond))
	st, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"again"}]}`, nil)
	if st != 502 || !strings.Contains(string(b), "sent nothing for 100ms") {
		t.Fatalf("reply past ReplyTimeout: %d %s", st, b)
	}
}

// TestSlowHeaders: a client that never finishes its headers (slowloris) is
// cut off after ReadHeaderTimeout.
func TestSlowHeaders(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.ReadHeaderTimeout = 100 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the gateway kept a connection with unfinished headers open")
	}
}

// TestDNSRebinding: with no token, a request that names the gateway by
// anything but a loopback name, an IP address or an allowed host is refused,
// whether or not it carries an Origin (a rebound page's GET often has none),
// on the API and the admin routes alike.
func TestDNSRebinding(t *testing.T) {
	admin := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pool") })
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Admin = admin
		c.AllowedHosts = []string{"macmini.lan"}
	})
	get := func(url, host string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Host = host
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		host string
		want int
	}{
		{"attacker.example:8400", 403},
		{"attacker.example", 403},
		{"127.0.0.1.attacker.example:80", 403},
		{"localhost.attacker.example:8400", 403},
		{"localhost:8400", 200},
		{"app.localhost:8400", 200},
		{"127.0.0.1:8400", 200},
		{"[::1]:8400", 200},
		{"192.168.1.5:8400", 200},
		{"MacMini.lan:8400", 200},
	} {
		if st := get(e.url+"/clawmesh/v1/pool/stats", c.host); st != c.want {
			t.Errorf("admin, Host %s: %d, want %d", c.host, st, c.want)
		}
		if st := get(e.url+"/v1/models", c.host); st != c.want {
			t.Errorf("models, Host %s: %d, want %d", c.host, st, c.want)
		}
	}
	if st, _, b := post(t, e.url+"/v1/chat/completions", chatBody, map[string]string{"Host": "attacker.example:8400"}); st != 403 || !strings.Contains(string(b), "--allow-host") {
		t.Errorf("chat by a foreign name: %d %s", st, b)
	}
	if n := len(e.mem.all(t)); n != 0 {
		t.Errorf("a refused call was recorded: %d steps", n)
	}

	// With a token, any name passes the host check; the token still decides.
	tok := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.Token = "s"; c.Admin = admin })
	if st, _, _ := post(t, tok.url+"/v1/chat/completions", chatBody, map[string]string{"Host": "macmini.example:8400", "Authorization": "Bearer s"}); st != 200 {
		t.Errorf("token, foreign name: %d", st)
	}
	if st, _, _ := post(t, tok.url+"/v1/chat/completions", chatBody, map[string]string{"Host": "macmini.example:8400"}); st != 401 {
		t.Errorf("no token, foreign name: %d", st)
	}
}

// With an admin token, the admin paths open to it alone: not to the
// gateway's token, and the admin token does not open the model routes.
func TestAdminToken(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Token = "gw-secret"
		c.AdminAuth = adminapi.NewSessions("owner-secret", nil).Authorized
		c.Admin = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "admin") })
	})
	admin := e.url + "/clawmesh/v1/pool/import"
	for _, c := range []struct {
		url, auth string
		want      int
	}{
		{admin, "", 401},
		{admin, "Bearer gw-secret", 401},
		{admin, "Bearer owner-secret", 200},
		{e.url + "/v1/chat/completions", "Bearer owner-secret", 401},
		{e.url + "/v1/chat/completions", "Bearer gw-secret", 200},
	} {
		h := map[string]string{}
		if c.auth != "" {
			h["Authorization"] = c.auth
		}
		if st, _, b := post(t, c.url, chatBody, h); st != c.want {
			t.Errorf("%s with %q: %d %s, want %d", c.url, c.auth, st, b, c.want)
		}
	}
}

// A node says what it does: one line per call, off when asked.
func TestLogCalls(t *testing.T) {
	for _, on := range []bool{true, false} {
		var mu sync.Mutex
		var buf bytes.Buffer
		w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
		e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "hi"}, {Text: "there"}}}, func(c *Config) {
			c.LogCalls = on
			c.Logger = slog.New(slog.NewTextHandler(w, nil))
		})
		if st, _, b := post(t, e.url+"/v1/chat/completions", chatBody, nil); st != 200 {
			t.Fatalf("call: %d %s", st, b)
		}
		if st, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`, nil); st != 200 {
			t.Fatalf("streamed call: %d %s", st, b)
		}
		e.stop()
		<-e.done
		e.done <- nil // for the cleanup
		mu.Lock()
		logs := buf.String()
		mu.Unlock()
		n := strings.Count(logs, "msg=call ")
		switch {
		case on && n != 2:
			t.Errorf("%d call lines:\n%s", n, logs)
		case on && (!strings.Contains(logs, "api=chat.completions model=m") || !strings.Contains(logs, "status=200 stream=false") || !strings.Contains(logs, "stream=true") || !strings.Contains(logs, "step=")):
			t.Errorf("call lines:\n%s", logs)
		case !on && n != 0:
			t.Errorf("calls logged with LogCalls off:\n%s", logs)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestFavicon: a browser's request for the site's icon gets no content,
// not a 404 that its console reports as an error, and nothing reaches the
// upstream.
func TestFavicon(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, nil)
	resp, err := http.Get(e.url + "/favicon.ico")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("/favicon.ico: %s", resp.Status)
	}
	if n := len(e.up.Requests()); n != 0 {
		t.Fatalf("%d requests reached the upstream", n)
	}
}
