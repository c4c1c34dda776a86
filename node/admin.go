package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
)

// The admin API lets `clawmesh pool ...` read and feed a pool that a running
// node holds open (Pebble allows one process per directory). It is the data
// directory owner's: served on the owner-only socket DATA/admin.sock, and by
// the gateway under /clawmesh/v1/pool/ on its loopback listener only to the
// owner's token (DATA/admin.token), not to the gateway's.
//
//	GET  /clawmesh/v1/pool/stats                 Stats as JSON
//	GET  /clawmesh/v1/pool/scorer                the scorer's counters (ScorerStats)
//	GET  /clawmesh/v1/pool/steps?session=&state=&since=&until=&after=&limit=
//	                                             a JSON array of steps
//	GET  /clawmesh/v1/pool/steps/{id}            one step
//	GET  /clawmesh/v1/pool/export?<same filter>  JSONL, as `pool export`
//	POST /clawmesh/v1/pool/import                JSONL body → ImportReport
//	GET  /clawmesh/v1/pool/preview?limit=        the next batch to leave (share.Preview)
const adminPrefix = "/clawmesh/v1/pool/"

func (n *Node) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminPrefix+"stats", func(w http.ResponseWriter, r *http.Request) {
		st, err := n.pool.Stats(r.Context())
		if errors.Is(err, pool.ErrPaused) {
			// The store cannot be read now: say why, which is what the
			// owner needs to know.
			h := n.pool.Health()
			st, err = pool.Stats{ByState: map[core.State]int{}, Health: &h}, nil
		}
		writeJSON(w, st, err)
	})
	mux.HandleFunc("GET "+adminPrefix+"scorer", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, n.Scorer(), nil)
	})
	mux.HandleFunc("GET "+adminPrefix+"steps", func(w http.ResponseWriter, r *http.Request) {
		f, err := ParseFilter(r.URL.Query())
		if err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		steps, err := n.pool.List(r.Context(), f)
		writeJSON(w, steps, err)
	})
	mux.HandleFunc("GET "+adminPrefix+"steps/{id}", func(w http.ResponseWriter, r *http.Request) {
		s, err := n.pool.Get(r.Context(), core.StepID(r.PathValue("id")))
		writeJSON(w, s, err)
	})
	mux.HandleFunc("GET "+adminPrefix+"export", func(w http.ResponseWriter, r *http.Request) {
		f, err := ParseFilter(r.URL.Query())
		if err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		bw := bufio.NewWriterSize(w, 64<<10)
		if _, err := n.pool.Export(r.Context(), bw, f); err != nil {
			// Headers are gone; a truncated body is all that can signal it.
			n.log.Warn("export over http", "err", err)
			return
		}
		bw.Flush()
	})
	mux.HandleFunc("POST "+adminPrefix+"import", func(w http.ResponseWriter, r *http.Request) {
		rep, err := n.pool.Import(r.Context(), r.Body)
		writeJSON(w, rep, err)
	})
	mux.HandleFunc(peer.AdminPrefix, func(w http.ResponseWriter, r *http.Request) {
		if n.peer == nil {
			writeErr(w, http.StatusNotFound, mesh.ErrNotJoined)
			return
		}
		n.meshAdmin.Do(func() { n.meshHandler = peer.Handler(n.peer, Batches{n.pool}) })
		n.meshHandler.ServeHTTP(w, r)
	})
	// A single-use login URL for a browser (the owner asks for it through
	// the socket or with the token; see adminapi.Sessions).
	mux.HandleFunc("POST /clawmesh/v1/login-url", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, LoginURL{URL: "http://" + n.loginHost() + adminapi.LoginPath + "?code=" + n.sessions.NewCode(), Expires: time.Now().Add(adminapi.LoginTTL).UTC()}, nil)
	})
	mux.HandleFunc("GET "+adminapi.LoginPath, n.sessions.Login)
	n.handleWeights(mux)
	n.handlePersonal(mux)
	mux.HandleFunc("GET "+adminPrefix+"preview", func(w http.ResponseWriter, r *http.Request) {
		limit := 0
		if s := r.URL.Query().Get("limit"); s != "" {
			l, err := strconv.Atoi(s)
			if err != nil || l < 0 {
				writeErr(w, http.StatusBadRequest, fmt.Errorf("limit: want a count, got %q", s))
				return
			}
			limit = l
		}
		pv, err := n.outbox.Preview(r.Context(), limit)
		writeJSON(w, pv, err)
	})
	return mux
}

// LoginURL is a single-use URL that logs a browser in to the node's admin
// pages.
type LoginURL struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires"`
}

// loginHost is the gateway's address as a browser on this machine reaches
// it.
func (n *Node) loginHost() string {
	if a := n.Addr(); a != nil {
		return browserHost(a.String())
	}
	return browserHost(n.cfg.Listen)
}

// browserHost is listen (host:port) as a browser on this machine opens it:
// a gateway listening on every address (0.0.0.0, [::], or no host) is
// reached on loopback, 127.0.0.1 (localhost for [::], which a browser tries
// on IPv6 and IPv4 both); any other host is kept.
func browserHost(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	switch ip := net.ParseIP(host); {
	case host == "" || ip != nil && ip.Equal(net.IPv4zero):
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// ParseFilter reads a pool.Filter from query parameters: session, state
// (open|closed|scored|batched|shipped|dropped), since and until (RFC 3339),
// after (a step id cursor) and limit.
func ParseFilter(q url.Values) (pool.Filter, error) {
	var f pool.Filter
	f.Session = core.SessionID(q.Get("session"))
	f.After = core.StepID(q.Get("after"))
	if s := q.Get("state"); s != "" {
		st, err := core.ParseState(s)
		if err != nil {
			return f, err
		}
		f.State = st
	}
	for _, p := range []struct {
		key string
		dst *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if s := q.Get(p.key); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				return f, fmt.Errorf("%s: want RFC 3339 time, got %q", p.key, s)
			}
			*p.dst = t
		}
	}
	if s := q.Get("limit"); s != "" {
		l, err := strconv.Atoi(s)
		if err != nil || l < 0 {
			return f, fmt.Errorf("limit: want a count, got %q", s)
		}
		f.Limit = l
	}
	return f, nil
}

// FilterQuery is the inverse of ParseFilter.
func FilterQuery(f pool.Filter) url.Values {
	q := url.Values{}
	if f.Session != "" {
		q.Set("session", string(f.Session))
	}
	if f.State != core.StateUnknown {
		q.Set("state", f.State.String())
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		q.Set("until", f.Until.Format(time.RFC3339))
	}
	if f.After != "" {
		q.Set("after", string(f.After))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

func writeJSON(w http.ResponseWriter, v any, err error) {
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, pool.ErrNotFound) {
			code = http.StatusNotFound
		}
		writeErr(w, code, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) { adminapi.WriteError(w, code, err) }

// Client reads a running node's pool over its admin API.
type Client struct {
	Base  string // e.g. http://127.0.0.1:8400
	Token string
	HTTP  *http.Client
}

// ErrRemote wraps an error the node answered with.
var ErrRemote = errors.New("node: remote")

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	u := strings.TrimSuffix(c.Base, "/") + adminPrefix + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	resp, err := adminapi.Do(ctx, c.HTTP, method, u, c.Token, body)
	var se *adminapi.StatusError
	if errors.As(err, &se) {
		if se.Code == http.StatusNotFound && strings.Contains(se.Message, "not found") {
			// The node's message already says it (pool.ErrNotFound's).
			return nil, remoteError{se.Message, []error{ErrRemote, pool.ErrNotFound}}
		}
		return nil, remoteError{se.Error(), []error{ErrRemote}}
	}
	return resp, err
}

// remoteError is what the node answered, as it said it, matching the
// sentinels it stands for.
type remoteError struct {
	msg string
	is  []error
}

func (e remoteError) Error() string   { return e.msg }
func (e remoteError) Unwrap() []error { return e.is }

func (c *Client) getJSON(ctx context.Context, path string, q url.Values, v any) error {
	resp, err := c.do(ctx, http.MethodGet, path, q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// Stats returns the node's pool statistics.
func (c *Client) Stats(ctx context.Context) (pool.Stats, error) {
	var st pool.Stats
	err := c.getJSON(ctx, "stats", nil, &st)
	return st, err
}

// Scorer returns the running node's scorer counters.
func (c *Client) Scorer(ctx context.Context) (ScorerStats, error) {
	var st ScorerStats
	err := c.getJSON(ctx, "scorer", nil, &st)
	return st, err
}

// List returns the steps matching f.
func (c *Client) List(ctx context.Context, f pool.Filter) ([]*core.Step, error) {
	var steps []*core.Step
	err := c.getJSON(ctx, "steps", FilterQuery(f), &steps)
	return steps, err
}

// Get returns one step.
func (c *Client) Get(ctx context.Context, id core.StepID) (*core.Step, error) {
	var s core.Step
	if err := c.getJSON(ctx, "steps/"+url.PathEscape(string(id)), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Export copies the node's JSONL export of f to w.
func (c *Client) Export(ctx context.Context, w io.Writer, f pool.Filter) (int, error) {
	resp, err := c.do(ctx, http.MethodGet, "export", FilterQuery(f), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	cw := &lineCounter{w: w}
	_, err = io.Copy(cw, resp.Body)
	return cw.lines, err
}

// Import sends JSONL to the node's pool.
func (c *Client) Import(ctx context.Context, r io.Reader) (pool.ImportReport, error) {
	var rep pool.ImportReport
	resp, err := c.do(ctx, http.MethodPost, "import", nil, r)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&rep)
	return rep, err
}

// LoginURL asks the node for a single-use login URL for a browser.
func (c *Client) LoginURL(ctx context.Context) (LoginURL, error) {
	var l LoginURL
	resp, err := adminapi.Do(ctx, c.HTTP, http.MethodPost, strings.TrimSuffix(c.Base, "/")+"/clawmesh/v1/login-url", c.Token, nil)
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&l)
	return l, err
}

// Preview returns the next batch to leave the node's device (at most limit
// of its steps; 0: all).
func (c *Client) Preview(ctx context.Context, limit int) (*share.Preview, error) {
	var pv share.Preview
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if err := c.getJSON(ctx, "preview", q, &pv); err != nil {
		return nil, err
	}
	return &pv, nil
}

type lineCounter struct {
	w     io.Writer
	lines int
}

func (l *lineCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			l.lines++
		}
	}
	return l.w.Write(p)
}
