package adminapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestToken(t *testing.T) {
	dir := t.TempDir()
	if tok, err := ReadToken(dir); tok != "" || err != nil {
		t.Fatalf("no token yet: %q %v", tok, err)
	}
	tok, err := LoadOrCreateToken(dir)
	if err != nil || len(tok) != 64 {
		t.Fatalf("made %q, %v", tok, err)
	}
	fi, err := os.Stat(filepath.Join(dir, TokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi.Mode(), err)
	}
	again, _ := LoadOrCreateToken(dir)
	if again != tok {
		t.Fatal("a second start made another token")
	}
	if ClientToken(dir, "given") != tok || ClientToken(t.TempDir(), "given") != "given" {
		t.Error("ClientToken")
	}
	h := RequireToken(tok, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	for _, c := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer nope", 401}, {"Bearer " + tok, 204}, {tok, 401}} {
		r := httptest.NewRequest("GET", "/x", nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("Authorization %q: %d, want %d", c.auth, w.Code, c.want)
		}
	}
	if Authorized(httptest.NewRequest("GET", "/", nil), "") {
		t.Error("an empty token authorizes")
	}
	os.WriteFile(filepath.Join(dir, TokenFile), []byte("short\n"), 0o600)
	if _, err := ReadToken(dir); err == nil {
		t.Error("a damaged token file is read")
	}
}

func TestSocket(t *testing.T) {
	dir := t.TempDir()
	if _, ok := SocketClient(dir); ok {
		t.Fatal("a client with no socket")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, err := ServeSocket(ctx, dir, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("owner")) }))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, SocketFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}
	hc, ok := SocketClient(dir)
	if !ok {
		t.Fatal("no client")
	}
	resp, err := hc.Get(SocketBase + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "owner" {
		t.Fatalf("got %q", b)
	}
	// A socket left behind by a process that died is replaced.
	cancel()
	<-done
	os.WriteFile(filepath.Join(dir, SocketFile), nil, 0o600)
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if _, err := ServeSocket(ctx2, dir, http.NotFoundHandler()); err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
}

func TestSessions(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	s := NewSessions("owner-token-0123456789abcdef0123456789", func() time.Time { return now })
	login := func(code string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		s.Login(w, httptest.NewRequest("GET", LoginPath+"?code="+code, nil))
		return w
	}
	withCookie := func(w *httptest.ResponseRecorder) *http.Request {
		r := httptest.NewRequest("GET", "/clawmesh/v1/pool/stats", nil)
		for _, c := range w.Result().Cookies() {
			r.AddCookie(c)
		}
		return r
	}
	code := s.NewCode()
	w := login(code)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != Dashboard {
		t.Fatalf("login: %d to %q, want 303 to the dashboard", w.Code, w.Header().Get("Location"))
	}
	c := w.Result().Cookies()
	if len(c) != 1 || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].Name != CookieName {
		t.Fatalf("cookie %+v", c)
	}
	if !s.Authorized(withCookie(w)) {
		t.Fatal("the session is refused")
	}
	if login(code).Code != 401 || login("").Code != 401 || login("made-up").Code != 401 {
		t.Error("a spent, empty or unknown code logs in")
	}
	late := s.NewCode()
	now = now.Add(LoginTTL + time.Second)
	if login(late).Code != 401 {
		t.Error("an expired code logs in")
	}
	now = now.Add(SessionTTL)
	if s.Authorized(withCookie(w)) {
		t.Error("an expired session is accepted")
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer owner-token-0123456789abcdef0123456789")
	if !s.Authorized(r) {
		t.Error("the owner's token is refused")
	}
	for range 2 * maxPending {
		s.NewCode()
	}
	if n := len(s.codes); n > maxPending {
		t.Errorf("%d codes kept", n)
	}
}

// TestSessionsDenied checks what a request without a session gets: an API
// client is left to the caller's JSON error; a browser gets a page that
// says to run 'clawmesh login', or, when it came by the other loopback name
// than the one it logged in on, is sent there, where its cookie is.
func TestSessionsDenied(t *testing.T) {
	s := NewSessions("owner-token-0123456789abcdef0123456789", nil)
	get := func(host string, browser bool) (*httptest.ResponseRecorder, bool) {
		r := httptest.NewRequest("GET", "http://"+host+"/clawmesh/?x=1", nil)
		if browser {
			r.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
		}
		w := httptest.NewRecorder()
		return w, s.Denied(w, r)
	}
	if _, ok := get("127.0.0.1:8400", false); ok {
		t.Fatal("an API client got a page")
	}
	w, ok := get("127.0.0.1:8400", true)
	if !ok || w.Code != http.StatusUnauthorized || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(w.Body.String(), "clawmesh login") || strings.Contains(w.Body.String(), "admin.token") {
		t.Fatalf("browser without a session: %v %d %q\n%s", ok, w.Code, w.Header().Get("Content-Type"), w.Body)
	}

	lw := httptest.NewRecorder()
	lr := httptest.NewRequest("GET", "http://127.0.0.1:8400"+LoginPath+"?code="+s.NewCode(), nil)
	lr.Header.Set("Accept", "text/html")
	s.Login(lw, lr)
	if lw.Code != http.StatusSeeOther {
		t.Fatalf("login: %d", lw.Code)
	}
	for _, c := range []struct {
		host, to string
	}{
		{"localhost:8400", "http://127.0.0.1:8400/clawmesh/?x=1"},
		{"[::1]:8400", "http://127.0.0.1:8400/clawmesh/?x=1"},
		{"127.0.0.1:8400", ""}, // the session's own host: no cookie there either
		{"localhost:8401", ""}, // another port is another server
		{"example.com:8400", ""},
	} {
		w, ok := get(c.host, true)
		if !ok {
			t.Fatalf("%s: not answered", c.host)
		}
		if c.to == "" && w.Code != http.StatusUnauthorized || c.to != "" && (w.Code != http.StatusSeeOther || w.Header().Get("Location") != c.to) {
			t.Errorf("%s: %d to %q, want %q", c.host, w.Code, w.Header().Get("Location"), c.to)
		}
	}

	// A spent code, in a browser, gets the page with why.
	w = httptest.NewRecorder()
	lr = httptest.NewRequest("GET", LoginPath+"?code=spent", nil)
	lr.Header.Set("Accept", "text/html")
	s.Login(w, lr)
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "used already") {
		t.Errorf("spent code in a browser: %d\n%s", w.Code, w.Body)
	}
}
