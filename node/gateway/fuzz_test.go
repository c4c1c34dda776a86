package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/node/gateway/wire"
)

func FuzzParseFeedback(f *testing.F) {
	for _, s := range []string{`{"session_id":"s","score":1}`, `{"step_id":"x","text":"meh"}`, `{"score":NaN}`, `[]`, `{"session_id":"s","score":-1.0000001}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fb, err := ParseFeedback(b)
		if err != nil {
			return
		}
		if fb.SessionID == "" && fb.StepID == "" {
			t.Fatal("accepted feedback naming no step or session")
		}
		if fb.Score != nil && !(*fb.Score >= -1 && *fb.Score <= 1) {
			t.Fatalf("accepted score %v", *fb.Score)
		}
		if fb.Score == nil && fb.Text == "" {
			t.Fatal("accepted empty feedback")
		}
	})
}

// FuzzIdentity covers what the gateway decodes from a client's path and
// headers: the route, the session headers and traceparent.
func FuzzIdentity(f *testing.F) {
	f.Add("/s/abc/v1/chat/completions", "abc", "side", "true", "00-1be91ccc5596bc8940990b686d426835-ea328bf9640005df-01")
	f.Add("/v1/messages", "", "", "", "")
	f.Add("/s//v1/x", "\x00", "MAIN", "1", "00-0-0-0")
	f.Fuzz(func(t *testing.T, path, sess, turn, done, tp string) {
		rt, ok := parseRoute(path)
		if ok && !rt.feedback && !rt.admin && !rt.health && !rt.metrics && rt.rest != "/v1" && !strings.HasPrefix(rt.rest, "/v1/") {
			t.Fatalf("route %q accepted with rest %q", path, rt.rest)
		}
		h := http.Header{}
		h.Set("X-Session-Id", sess)
		h.Set("X-Turn-Type", turn)
		h.Set("X-Session-Done", done)
		h.Set("Traceparent", tp)
		id, err := callIdentity(rt, h, &wire.Request{})
		if err != nil {
			return
		}
		if id.turn != "main" && id.turn != "side" {
			t.Fatalf("turn %q", id.turn)
		}
		if tr := traceID(tp); tr != "" && (len(tr) != 32 || tr != id.trace) {
			t.Fatalf("trace %q", tr)
		}
	})
}
