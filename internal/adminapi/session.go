package adminapi

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"sync"
	"time"
)

// Browser sessions: a browser cannot send the owner's token, so the owner
// asks the running node (through its socket, or with the token) for a
// login URL; opening it once sets an HttpOnly, SameSite=Strict cookie that
// stands for the token until it expires or the node restarts. The model
// Jupyter's token URL made familiar, made single-use.
const (
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
		WriteError(w, http.StatusUnauthorized, errLogin)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: "/clawmesh/", MaxAge: int(SessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write([]byte("Logged in: this browser may read this clawmesh node's admin pages for 12 hours.\n" +
		"The node's dashboard: http://" + r.Host + "/clawmesh/\n"))
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
