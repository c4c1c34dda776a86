package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// probeTimeout bounds the start-up check of the upstream.
const probeTimeout = 5 * time.Second

// ProbeUpstream asks the upstream for its models once (GET base/models) and
// returns what a user should be warned of, "" when it answers: an upstream
// that is not reachable (it may come up later), or one that answers 404
// there, most often a URL without its /v1.
func ProbeUpstream(ctx context.Context, base, token string) string {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	u := strings.TrimSuffix(base, "/") + "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Sprintf("the upstream URL %q is not usable: %v", base, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Sprintf("the upstream %s does not answer (%v); calls fail with 502 until it does", base, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		if p, err := url.Parse(base); err == nil && !strings.HasSuffix(strings.TrimSuffix(p.Path, "/"), "/v1") {
			return fmt.Sprintf("the upstream answers 404 at %s: its OpenAI-compatible API is usually under /v1 (--upstream %s/v1?)", u, strings.TrimSuffix(base, "/"))
		}
		return fmt.Sprintf("the upstream answers 404 at %s: is %s an OpenAI-compatible API?", u, base)
	}
	return ""
}
