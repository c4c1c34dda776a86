package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestGuardRefusesWebPages checks that a web page cannot drive the server:
// a cross-origin POST (text/plain, which a page may send without a
// preflight) to the adapter endpoint and a request by a DNS-rebound name
// are refused with 403 and change nothing, while the same request from a
// client that is not a browser loads the adapter.
func TestGuardRefusesWebPages(t *testing.T) {
	eng, tok := newTinyEngine(t, 1)
	adir := filepath.Join(t.TempDir(), "v2")
	if err := eng.ExportAdapter(context.Background(), adir); err != nil {
		t.Fatal(err)
	}
	s, base := startServer(t, Config{Model: eng, Tokenizer: tok, Seed: 1})
	_, port, _ := strings.Cut(strings.TrimPrefix(base, "http://"), ":")
	body := fmt.Sprintf(`{"path":%q,"version":"v2"}`, adir)

	do := func(method, path, host string, headers map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		if host != "" {
			req.Host = host
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name    string
		method  string
		host    string
		headers map[string]string
	}{
		{"cross-origin page", "POST", "", map[string]string{"Origin": "http://evil.example"}},
		{"cross-site fetch", "POST", "", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"DNS-rebound name", "POST", "evil.example:" + port, nil},
		{"DNS-rebound page", "POST", "evil.example:" + port, map[string]string{"Origin": "http://evil.example:" + port}},
		{"preflight", "OPTIONS", "", map[string]string{"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}},
	} {
		code, b := do(tc.method, "/clawmesh/v1/adapter", tc.host, tc.headers)
		if code != http.StatusForbidden || !strings.Contains(b, "permission_error") {
			t.Errorf("%s: %d %s, want 403", tc.name, code, b)
		}
		if v := s.Adapter(); v != DefaultAdapter {
			t.Fatalf("%s: the adapter became %q", tc.name, v)
		}
	}
	if code, b := do("GET", "/v1/models", "evil.example:"+port, nil); code != http.StatusForbidden {
		t.Errorf("models by a rebound name: %d %s", code, b)
	}
	// The same request from a client that is not a browser, by the loopback
	// address or by localhost, passes.
	if code, b := do("GET", "/v1/models", "localhost:"+port, nil); code != http.StatusOK {
		t.Errorf("models by localhost: %d %s", code, b)
	}
	if code, b := do("POST", "/clawmesh/v1/adapter", "", map[string]string{"Origin": base}); code != http.StatusOK {
		t.Fatalf("same-origin adapter load: %d %s", code, b)
	}
	if v := s.Adapter(); v != "v2" {
		t.Fatalf("adapter %q after a load", v)
	}
}

// TestGuardNamesAndToken checks the Host rule's exceptions: names in
// AllowedHosts, and any name when a token is required, but only with the
// token.
func TestGuardNamesAndToken(t *testing.T) {
	eng, tok := newTinyEngine(t, 1)
	_, allowed := startServer(t, Config{Model: eng, Tokenizer: tok, AllowedHosts: []string{"trainer.lan"}})
	_, tokened := startServer(t, Config{Model: eng, Tokenizer: tok, Token: "s3cret"})
	get := func(base, host, auth string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+"/v1/models", nil)
		req.Host = host
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		base, host, auth string
		want             int
	}{
		{allowed, "trainer.lan:1", "", http.StatusOK},
		{allowed, "Trainer.LAN.", "", http.StatusOK},
		{allowed, "other.lan", "", http.StatusForbidden},
		{tokened, "any.name:1", "s3cret", http.StatusOK},
		{tokened, "any.name:1", "", http.StatusUnauthorized},
		{tokened, "127.0.0.1", "s3cre", http.StatusUnauthorized},
		{tokened, "127.0.0.1", "s3cret2", http.StatusUnauthorized},
	} {
		if got := get(tc.base, tc.host, tc.auth); got != tc.want {
			t.Errorf("Host %q on %s (token %q): %d, want %d", tc.host, tc.base, tc.auth, got, tc.want)
		}
	}
}
