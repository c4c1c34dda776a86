package adminapi

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"html/template"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Browser sessions: a browser cannot send the owner's token, so the owner
// asks the running node (through its socket, or with the token) for a
// login URL; opening it once sets an HttpOnly, SameSite=Strict cookie that
// stands for the token until it expires or the node restarts. The model
// Jupyter's token URL made familiar, made single-use.
//
// A cookie belongs to the host name the browser used, and 127.0.0.1 and
// localhost are two names: a session opened on one is not sent to the
// other. Rather than a second cookie (which would take a second code and a
// hop between hosts), the node keeps one canonical host, the one the last
// login was opened on (the login URL names the node's listening address):
// a browser that comes without a session by the other loopback name, on
// the same port, is sent there (see Denied). Both requests still pass
// httpguard's checks; the redirect only ever names a loopback host.
const (
	// Dashboard is where a login sends the browser.
	Dashboard = "/clawmesh/"
	// LoginPath is where a login URL points.
	LoginPath = "/clawmesh/v1/login"
	// CookieName is the session cookie.
	CookieName = "clawmesh_session"
	// LoginTTL bounds how long a login URL may wait to be opened.
	LoginTTL = 10 * time.Minute
	// SessionTTL bounds a browser session.
	SessionTTL = 12 * time.Hour
	// maxPending bounds login codes not yet used, and sessions.
	maxPending = 64
)

// Sessions holds the owner's token, the login codes not yet used and the
// browser sessions opened with them. It is safe for concurrent use.
type Sessions struct {
	token string
	now   func() time.Time

	mu       sync.Mutex
	codes    map[string]time.Time // code → expiry
	sessions map[string]time.Time // session id → expiry
	host     string               // the Host of the last login: where the cookies are
}

// NewSessions returns the sessions of an admin API whose owner's token is
// token.
func NewSessions(token string, now func() time.Time) *Sessions {
	if now == nil {
		now = time.Now
	}
	return &Sessions{token: token, now: now, codes: map[string]time.Time{}, sessions: map[string]time.Time{}}
}

// Authorized reports whether r carries the owner's token or a live
// session cookie.
func (s *Sessions) Authorized(r *http.Request) bool {
	if Authorized(r, s.token) {
		return true
	}
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, exp := range s.sessions {
		if subtle.ConstantTimeCompare([]byte(id), []byte(c.Value)) == 1 {
			return s.now().Before(exp)
		}
	}
	return false
}

// NewCode makes a single-use login code, valid for LoginTTL.
func (s *Sessions) NewCode() string {
	code := random()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	s.codes[code] = s.now().Add(LoginTTL)
	return code
}

// Login serves a login URL (GET LoginPath?code=C): a valid, unused code
// opens a session and sets its cookie; the code is spent either way.
func (s *Sessions) Login(w http.ResponseWriter, r *http.Request) {
	code := r.URL.Query().Get("code")
	s.mu.Lock()
	exp, ok := s.codes[code]
	delete(s.codes, code)
	var id string
	if ok && code != "" && s.now().Before(exp) {
		s.sweepLocked()
		id = random()
		s.sessions[id] = s.now().Add(SessionTTL)
	}
	s.mu.Unlock()
	if id == "" {
		if WantsHTML(r) {
			writePage(w, http.StatusUnauthorized, errLogin.Message)
			return
		}
		WriteError(w, http.StatusUnauthorized, errLogin)
		return
	}
	s.mu.Lock()
	s.host = r.Host
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: "/clawmesh/", MaxAge: int(SessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Cache-Control", "no-store")
	// A relative Location keeps the host the browser came in on, which is
	// the host the cookie belongs to.
	http.Redirect(w, r, Dashboard, http.StatusSeeOther)
}

// Denied answers a browser's request that Authorized refused, and reports
// whether it did; an API client (one that does not ask for text/html) is
// left to its caller, which answers it in JSON. A browser that comes by the
// other loopback name than the one it logged in on (localhost for
// 127.0.0.1, or back) is sent, 303, to that one, where its cookie is;
// otherwise it gets a page that says how to log in.
func (s *Sessions) Denied(w http.ResponseWriter, r *http.Request) bool {
	if !WantsHTML(r) {
		return false
	}
	s.mu.Lock()
	host := s.host
	s.mu.Unlock()
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && host != r.Host && loopbackAliases(host, r.Host) {
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "http://"+host+r.URL.RequestURI(), http.StatusSeeOther)
		return true
	}
	writePage(w, http.StatusUnauthorized, "")
	return true
}

// WantsHTML reports whether r is a browser's: its Accept names text/html.
func WantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// loopbackAliases reports whether a and b (Host headers) name this machine
// by loopback names (localhost or a loopback IP) on the same port.
func loopbackAliases(a, b string) bool {
	ha, pa, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	hb, pb, err := net.SplitHostPort(b)
	if err != nil || pa != pb {
		return false
	}
	return isLoopback(ha) && isLoopback(hb)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>clawmesh: log in</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em}code,pre{background:#f3f3f3;padding:.1em .3em}</style>
</head><body>
<h1>Log in to this clawmesh node</h1>
{{if .}}<p id="why">{{.}}</p>{{else}}<p id="why">This browser holds no session for this node's dashboard, or its session has expired.</p>{{end}}
<p>On the machine the node runs on, as the user who owns its data directory, run:</p>
<pre>clawmesh login</pre>
<p>(with <code>--data DIR</code> if the node's data directory is not ~/.clawmesh) and open the URL it prints, once, in this browser: it logs the browser in for 12 hours and brings it to the dashboard.</p>
</body></html>
`))

// writePage answers a browser with the page that says how to log in, and
// why when why is not empty.
func writePage(w http.ResponseWriter, code int, why string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	loginPage.Execute(w, why)
}

var errLogin = &StatusError{Code: http.StatusUnauthorized, Status: "401 Unauthorized",
	Message: "this login URL was used already, has expired, or is not this node's: ask for a new one with 'clawmesh login'"}

// sweepLocked drops expired codes and sessions, and the oldest beyond
// maxPending.
func (s *Sessions) sweepLocked() {
	now := s.now()
	for _, m := range []map[string]time.Time{s.codes, s.sessions} {
		for k, exp := range m {
			if !now.Before(exp) {
				delete(m, k)
			}
		}
		for len(m) >= maxPending {
			var oldest string
			for k, exp := range m {
				if oldest == "" || exp.Before(m[oldest]) {
					oldest = k
				}
			}
			delete(m, oldest)
		}
	}
}

func random() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}
