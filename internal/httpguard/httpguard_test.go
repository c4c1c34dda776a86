package httpguard

import (
	"errors"
	"net/http/httptest"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		method  string
		host    string
		headers map[string]string
		guard   Guard
		want    error
	}{
		{name: "SDK client on loopback IP", host: "127.0.0.1:8401"},
		{name: "IPv6 loopback", host: "[::1]:8401"},
		{name: "localhost", host: "localhost:8401"},
		{name: "sub.localhost", host: "app.localhost:8401"},
		{name: "LAN IP literal", host: "192.168.1.7:8401"},
		{name: "no Host", host: ""},
		{name: "rebound name", host: "evil.example:8401", want: ErrHost},
		{name: "rebound name without port", host: "evil.example", want: ErrHost},
		{name: "allowed name", host: "EVIL.example.:8401", guard: Guard{AllowedHosts: []string{"evil.example"}}},
		{name: "any host with a token", host: "my-box:8401", guard: Guard{AnyHost: true}},
		{name: "cross-origin page", host: "127.0.0.1:8401", headers: map[string]string{"Origin": "http://evil.example"}, want: ErrCrossOrigin},
		{name: "opaque origin", host: "127.0.0.1:8401", headers: map[string]string{"Origin": "null"}, want: ErrCrossOrigin},
		{name: "own origin by IP", host: "127.0.0.1:8401", headers: map[string]string{"Origin": "http://127.0.0.1:8401"}},
		{name: "own origin by localhost", host: "localhost:8401", headers: map[string]string{"Origin": "https://localhost:8401"}},
		{name: "other port", host: "127.0.0.1:8401", headers: map[string]string{"Origin": "http://127.0.0.1:3000"}, want: ErrCrossOrigin},
		{name: "other scheme", host: "127.0.0.1:8401", headers: map[string]string{"Origin": "file://127.0.0.1:8401"}, want: ErrCrossOrigin},
		{name: "rebound page, even with any host", host: "evil.example:8401", headers: map[string]string{"Origin": "http://evil.example:8401"},
			guard: Guard{AnyHost: true}, want: ErrCrossOrigin},
		{name: "Sec-Fetch-Site cross-site", host: "127.0.0.1:8401", headers: map[string]string{"Sec-Fetch-Site": "cross-site"}, want: ErrCrossOrigin},
		{name: "Sec-Fetch-Site same-site", host: "127.0.0.1:8401", headers: map[string]string{"Sec-Fetch-Site": "same-site"}, want: ErrCrossOrigin},
		{name: "Sec-Fetch-Site same-origin", host: "127.0.0.1:8401", headers: map[string]string{"Sec-Fetch-Site": "same-origin"}},
		{name: "Sec-Fetch-Site none (typed in the address bar)", host: "127.0.0.1:8401", headers: map[string]string{"Sec-Fetch-Site": "none"}},
		{name: "preflight", method: "OPTIONS", host: "127.0.0.1:8401", want: ErrCrossOrigin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.method
			if m == "" {
				m = "POST"
			}
			r := httptest.NewRequest(m, "http://127.0.0.1/clawmesh/v1/adapter", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			if err := tc.guard.Check(r); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}
