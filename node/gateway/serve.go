package gateway

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/httpguard"
	"github.com/clawmesh/clawmesh/node/gateway/wire"
	"github.com/clawmesh/clawmesh/node/session"
)

// route is what a request path means.
type route struct {
	session  core.SessionID // from /s/{session}/v1/...
	rest     string         // the path from /v1 on
	api      core.APIKind   // recorded API, "" for pass-through
	feedback bool
	health   bool
	admin    bool
	page     bool // an owner's page (Config.Pages)
	metrics  bool
	favicon  bool
}

// parseRoute maps a path to a route; ok is false for paths the gateway does
// not serve.
func parseRoute(p string) (route, bool) {
	var rt route
	if strings.HasPrefix(p, "/clawmesh/v1/") {
		switch p {
		case "/clawmesh/v1/feedback":
			rt.feedback = true
		case "/clawmesh/v1/health":
			rt.health = true
		default:
			rt.admin = true
		}
		return rt, true
	}
	if p == "/clawmesh" || strings.HasPrefix(p, "/clawmesh/") {
		rt.admin, rt.page = true, true
		return rt, true
	}
	if p == "/metrics" {
		rt.metrics = true
		return rt, true
	}
	// A browser asks for the site's icon on pages that name none (the
	// batch preview is plain text): no content, rather than a 404 in its
	// console.
	if p == "/favicon.ico" {
		rt.favicon = true
		return rt, true
	}
	if rest, ok := strings.CutPrefix(p, "/s/"); ok {
		id, tail, found := strings.Cut(rest, "/")
		if !found || !validSessionID(id) {
			return rt, false
		}
		rt.session = core.SessionID(id)
		p = "/" + tail
	}
	if p != "/v1" && !strings.HasPrefix(p, "/v1/") {
		return rt, false
	}
	rt.rest = p
	switch p {
	case "/v1/chat/completions":
		rt.api = core.APIChat
	case "/v1/responses":
		rt.api = core.APIResponses
	case "/v1/messages":
		rt.api = core.APIMessages
	}
	return rt, true
}

func validSessionID(id string) bool {
	if id == "" || len(id) > 200 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// ServeHTTP answers one request: routes, safety checks, then a recorded
// call, a pass-through, feedback or the admin handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.wg.Add(1)
	defer g.wg.Done()
	g.requests.Add(1)

	rt, ok := parseRoute(r.URL.Path)
	anthropic := rt.api == core.APIMessages
	// A web page must not reach the gateway: neither by a cross-origin
	// request nor, without a token (which a page cannot know), by a name
	// re-pointed at 127.0.0.1 (DNS rebinding). See httpguard.
	switch err := (httpguard.Guard{AllowedHosts: g.cfg.AllowedHosts, AnyHost: g.cfg.Token != ""}).Check(r); {
	case errors.Is(err, httpguard.ErrCrossOrigin):
		writeError(w, anthropic, http.StatusForbidden, "permission_error", "forbidden", "cross-origin requests are refused")
		return
	case err != nil:
		writeError(w, anthropic, http.StatusForbidden, "permission_error", "forbidden",
			"the gateway answers to loopback names and IP addresses only; name this host with --allow-host, or set a --token")
		return
	}
	if !ok {
		writeError(w, false, http.StatusNotFound, "not_found_error", "not_found", "no route for "+r.URL.Path)
		return
	}
	if rt.rest != "" && g.looped(r.Header) {
		g.refuseLoop(w, anthropic, rt)
		return
	}
	if rt.admin && g.cfg.AdminAuth != nil {
		// The recorded data is the owner's: the gateway's own token, which
		// agents and other accounts may hold, does not open it.
		if r.URL.Path != adminapi.LoginPath && !g.cfg.AdminAuth(r) {
			if g.cfg.AdminDenied != nil && g.cfg.AdminDenied(w, r) {
				return
			}
			writeError(w, false, http.StatusUnauthorized, "authentication_error", "invalid_api_key", adminapi.ErrNoToken.Error())
			return
		}
	} else {
		via, authed := g.authorized(r)
		if !authed {
			writeError(w, anthropic, http.StatusUnauthorized, "authentication_error", "invalid_api_key", "missing or wrong gateway token")
			return
		}
		if via != "" {
			r.Header.Del(via) // the gateway's token is not the upstream's
		}
	}
	// The admin API streams what it reads (a pool import is a JSONL file of
	// any length, bounded per line); the other routes hold a body whole.
	if !rt.admin {
		if r.ContentLength > g.cfg.MaxBodyBytes {
			writeError(w, anthropic, http.StatusRequestEntityTooLarge, "request_too_large", "request_too_large", "request body too large")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes)
	}

	switch {
	case rt.feedback:
		g.feedback(w, r)
	case rt.health:
		b, _ := json.Marshal(g.Health())
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	case rt.page:
		if g.cfg.Pages == nil {
			writeError(w, false, http.StatusNotFound, "not_found_error", "not_found", "no route for "+r.URL.Path)
			return
		}
		g.cfg.Pages.ServeHTTP(w, r)
	case rt.favicon:
		w.WriteHeader(http.StatusNoContent)
	case rt.metrics:
		if g.cfg.Metrics == nil || r.Method != http.MethodGet {
			writeError(w, false, http.StatusNotFound, "not_found_error", "not_found", "no route for "+r.Method+" "+r.URL.Path)
			return
		}
		g.cfg.Metrics.ServeHTTP(w, r)
	case rt.admin:
		if g.cfg.Admin == nil {
			writeError(w, false, http.StatusNotFound, "not_found_error", "not_found", "no route for "+r.URL.Path)
			return
		}
		g.cfg.Admin.ServeHTTP(w, r)
	case rt.api != "" && r.Method == http.MethodPost:
		if g.cfg.OnCall == nil {
			g.record(w, r, rt)
			break
		}
		// The monotonic clock: a measurement, not a time recorded.
		start := time.Now()
		g.record(w, r, rt)
		g.cfg.OnCall(rt.api, time.Since(start))
	default:
		g.passThrough(w, r, rt)
	}
}

// authorized checks the gateway token; via names the header that carried it.
func (g *Gateway) authorized(r *http.Request) (via string, ok bool) {
	if g.cfg.Token == "" {
		return "", true
	}
	if a, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && tokenEqual(a, g.cfg.Token) {
		return "Authorization", true
	}
	if k := r.Header.Get("X-Api-Key"); k != "" && tokenEqual(k, g.cfg.Token) {
		return "X-Api-Key", true
	}
	return "", false
}

func tokenEqual(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// writeError answers with an OpenAI-style error JSON, or the Anthropic shape
// for Anthropic routes.
func writeError(w http.ResponseWriter, anthropic bool, status int, antType, code, msg string) {
	// The client reads what was wrong, not which package found it.
	msg = strings.TrimPrefix(msg, wire.ErrBadRequest.Error()+": ")
	var b []byte
	if anthropic {
		b, _ = json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": antType, "message": msg}})
	} else {
		typ := "invalid_request_error"
		switch {
		case status >= 500:
			typ = "api_error"
		case status == http.StatusUnauthorized:
			typ = "authentication_error"
		case status == http.StatusForbidden:
			typ = "permission_error"
		}
		b = wire.ErrorBody(typ, code, msg)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// identity is who a call says it is.
type identity struct {
	session core.SessionID
	source  session.Source
	turn    core.TurnType
	done    bool
	trace   string
}

var errBadHeader = errors.New("gateway: bad session header")

// callIdentity reads the session identity, most reliable first: the path,
// then X-Session-Id, then the body's metadata.user_id, prompt_cache_key,
// user. With none, the tracker matches by message prefix.
func callIdentity(rt route, h http.Header, req *wire.Request) (identity, error) {
	id := identity{turn: core.TurnMain, trace: traceID(h.Get("Traceparent"))}
	switch t := strings.ToLower(strings.TrimSpace(h.Get("X-Turn-Type"))); t {
	case "", "main":
	case "side":
		id.turn = core.TurnSide
	default:
		return id, errBadHeader
	}
	switch d := strings.ToLower(strings.TrimSpace(h.Get("X-Session-Done"))); d {
	case "", "false", "0":
	case "true", "1":
		id.done = true
	default:
		return id, errBadHeader
	}
	hs := strings.TrimSpace(h.Get("X-Session-Id"))
	if hs != "" && !validSessionID(hs) {
		return id, errBadHeader
	}
	switch {
	case rt.session != "":
		id.session, id.source = rt.session, session.SourcePath
	case hs != "":
		id.session, id.source = core.SessionID(hs), session.SourceHeader
	case req.MetadataUserID != "":
		id.session, id.source = core.SessionID(req.MetadataUserID), session.SourceBody
	case req.PromptCacheKey != "":
		id.session, id.source = core.SessionID(req.PromptCacheKey), session.SourceBody
	case req.User != "":
		id.session, id.source = core.SessionID(req.User), session.SourceBody
	}
	return id, nil
}

// traceID extracts the trace id of a W3C traceparent header
// ("00-<32 hex>-<16 hex>-<2 hex>"), "" if absent or malformed.
func traceID(tp string) string {
	parts := strings.Split(strings.TrimSpace(tp), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || parts[0] == "ff" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return ""
	}
	if parts[0] == "00" && len(parts) != 4 {
		return ""
	}
	for _, p := range parts[:4] {
		if !isLowerHex(p) {
			return ""
		}
	}
	if strings.Trim(parts[1], "0") == "" || strings.Trim(parts[2], "0") == "" {
		return ""
	}
	return parts[1]
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
