package modelserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is the stable loopback address in front of one model server
// process: the process may be restarted on another port, the proxy's
// address stays. It counts the calls in flight through it, so that a
// server leaving service is stopped only once they have finished.
type proxy struct {
	ln     net.Listener
	srv    *http.Server
	rp     *httputil.ReverseProxy
	target atomic.Pointer[url.URL]

	mu       sync.Mutex
	inflight int64
	last     time.Time // when a call last began or ended
	closing  bool      // no call begins any more
	done     chan struct{}
}

func newProxy(log *slog.Logger) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, last: time.Now(), done: make(chan struct{})}
	p.target.Store(&url.URL{Scheme: "http", Host: "127.0.0.1:1"})
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(p.target.Load())
		},
		// Streams pass through as they are written.
		FlushInterval: -1,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			// OpenAI's error shape, as the servers behind answer.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
				"message": "the model server is not answering (it may be restarting): " + err.Error(), "type": "upstream_error", "code": http.StatusBadGateway}})
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	go func() { p.srv.Serve(ln); close(p.done) }()
	return p, nil
}

// url is the proxy's base URL (no /v1).
func (p *proxy) url() string { return "http://" + p.ln.Addr().String() }

// retarget sends the calls that begin from now on to base.
func (p *proxy) retarget(base string) {
	u, err := url.Parse(base)
	if err == nil {
		p.target.Store(u)
	}
}

// ServeHTTP forwards one call, counted while it runs.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
			"message": "this model server has left service: send the call again", "type": "unavailable_error", "code": http.StatusServiceUnavailable}})
		return
	}
	p.inflight++
	p.last = time.Now()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight--
		p.last = time.Now()
		p.mu.Unlock()
	}()
	// The body is read whole first: the reply's headers go out as soon as
	// the server sends them, and an HTTP/1.1 server may close the body of
	// a request once its reply has begun, or read the next request from
	// the connection once it has ended, while the forwarded body is still
	// being sent.
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		r.Body.Close()
		switch {
		case err != nil:
			return // the client went away
		case int64(len(b)) > maxBody:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
				"message": fmt.Sprintf("request body over %d bytes", maxBody), "type": "invalid_request_error", "code": http.StatusRequestEntityTooLarge}})
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	}
	p.rp.ServeHTTP(w, r)
}

// maxBody bounds a request body the proxy forwards (the gateway's own
// bound, --max-body, is smaller by default).
const maxBody = 1 << 30

// inFlight is the number of calls being forwarded now.
func (p *proxy) inFlight() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight
}

// drained reports whether no call is in flight and none began or ended in
// the last d; if so, or if force, no call begins any more.
func (p *proxy) drained(d time.Duration, force bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if force || (p.inflight == 0 && time.Since(p.last) >= d) {
		p.closing = true
	}
	return p.closing
}

// close stops accepting calls; those in flight are cut (the caller waits
// for them first).
func (p *proxy) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p.srv.Shutdown(ctx)
	p.srv.Close()
	<-p.done
}
