// Package httpguard keeps web pages away from clawmesh's local HTTP
// servers. A page open in a browser can send requests to 127.0.0.1 (a
// "simple" POST with a text/plain body needs no preflight), and a page
// whose DNS name the attacker re-points at 127.0.0.1 (DNS rebinding)
// passes as same-origin. Check refuses both: a browser's cross-origin
// request (its Origin or Sec-Fetch-Site says so) and a Host header that
// names the server by anything but an IP literal, localhost, *.localhost or
// an allowed name. Clients that are not browsers send neither header and
// name the server as they reached it, so they pass.
package httpguard

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Errors returned by Check; match them with errors.Is.
var (
	ErrCrossOrigin = errors.New("httpguard: cross-origin request")
	ErrHost        = errors.New("httpguard: host name not allowed")
)

// Guard holds what Check allows. The zero value allows loopback names and
// IP literals only.
type Guard struct {
	// AllowedHosts are host names, beyond localhost, *.localhost and IP
	// literals, that clients may reach the server by.
	AllowedHosts []string
	// AnyHost skips the Host check: for a server that requires a secret
	// (a bearer token), which a rebound page cannot know.
	AnyHost bool
}

// Check returns ErrCrossOrigin for a browser's cross-origin request (and
// for every preflight, OPTIONS), and ErrHost for a Host that is not allowed
// (see SameOrigin and HostAllowed); nil otherwise.
func (g Guard) Check(r *http.Request) error {
	if r.Method == http.MethodOptions || !SameOrigin(r) {
		return ErrCrossOrigin
	}
	if !g.AnyHost && !HostAllowed(r.Host, g.AllowedHosts) {
		return ErrHost
	}
	return nil
}

// SameOrigin reports whether r is not a browser's cross-origin request: a
// Sec-Fetch-Site other than same-origin or none is refused, and an Origin
// passes only when it is the server's own (same host and port as Host,
// scheme http or https) and names it by localhost or a loopback IP, so that
// a DNS-rebound name does not pass. A request with neither header passes.
func SameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// HostAllowed reports whether hostport (a Host header, with or without a
// port) names the server by an IP literal (no DNS answer can stand for
// one), localhost, *.localhost, or a name in allowed (case-insensitive, a
// trailing dot ignored). An empty Host (HTTP/1.0) passes.
func HostAllowed(hostport string, allowed []string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" || host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(strings.TrimSuffix(a, "."), host) {
			return true
		}
	}
	return false
}
