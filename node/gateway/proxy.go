package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hopHeaders are connection-scoped and never forwarded (RFC 9110 7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// errIdle is the cancel cause when the upstream was silent too long.
var errIdle = errors.New("gateway: upstream idle timeout")

// upstreamHeader is the header to send upstream: the client's, minus
// hop-by-hop and session headers, with the upstream token if configured
// and this gateway added to HopHeader.
func (g *Gateway) upstreamHeader(in http.Header, recorded bool) http.Header {
	h := in.Clone()
	for _, k := range hopHeaders {
		h.Del(k)
	}
	if c := in.Get("Connection"); c != "" {
		for _, k := range strings.Split(c, ",") {
			h.Del(strings.TrimSpace(k))
		}
	}
	for k := range h {
		if strings.HasPrefix(k, "X-Session-") || k == "X-Turn-Type" {
			delete(h, k)
		}
	}
	h.Del("Content-Length")
	if recorded {
		// The gateway parses the reply: ask for it uncompressed.
		h.Del("Accept-Encoding")
	}
	if g.cfg.UpstreamToken != "" {
		h.Set("Authorization", "Bearer "+g.cfg.UpstreamToken)
	}
	g.addHop(h)
	return h
}

// copyHeader copies a reply's headers to the client, minus hop-by-hop ones
// and Content-Length (set by the caller where known).
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	dst.Del("Content-Length")
}

// idleTimer cancels an upstream call when nothing arrives for a while.
type idleTimer struct {
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newIdleTimer(d time.Duration, cancel context.CancelCauseFunc) *idleTimer {
	it := &idleTimer{d: d}
	it.t = time.AfterFunc(d, func() {
		it.fired.Store(true)
		cancel(errIdle)
	})
	return it
}

func (it *idleTimer) reset() { it.t.Reset(it.d) }
func (it *idleTimer) stop()  { it.t.Stop() }

// bodyReader resets the idle timer on every read and notes the time of the
// first byte.
type bodyReader struct {
	r     io.Reader
	idle  *idleTimer
	now   func() time.Time
	first time.Time
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.idle.reset()
		if b.first.IsZero() {
			b.first = b.now()
		}
	}
	return n, err
}

// flushWriter writes to the client and flushes at once.
type flushWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func (f *flushWriter) write(b []byte) bool {
	if f.err != nil {
		return false
	}
	if len(b) > 0 {
		if _, err := f.w.Write(b); err != nil {
			f.err = err
			return false
		}
	}
	if err := f.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		f.err = err
		return false
	}
	return true
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// passThrough forwards any other /v1/* request unchanged (method, headers,
// body, status, streaming) and records nothing.
func (g *Gateway) passThrough(w http.ResponseWriter, r *http.Request, rt route) {
	const anthropic = false
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	idle := newIdleTimer(g.cfg.StreamIdleTimeout, cancel)
	defer idle.stop()

	var body io.Reader = r.Body
	if r.ContentLength == 0 {
		body = nil
	}
	u := g.base(g.cfg.Route()) + strings.TrimPrefix(rt.rest, "/v1")
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, body)
	if err != nil {
		writeError(w, anthropic, http.StatusBadRequest, "invalid_request_error", "bad_request", err.Error())
		return
	}
	req.ContentLength = r.ContentLength
	req.Header = g.upstreamHeader(r.Header, false)
	resp, err := g.client.Do(req)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			writeError(w, anthropic, http.StatusRequestEntityTooLarge, "request_too_large", "request_too_large", "request body too large")
		case r.Context().Err() != nil:
		default:
			g.upstreamFailures.Add(1)
			g.log.Warn("upstream unreachable", "path", rt.rest, "err", err)
			writeError(w, anthropic, http.StatusBadGateway, "api_error", "upstream_unreachable", "upstream unreachable: "+err.Error())
		}
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	if resp.ContentLength >= 0 && resp.Header.Get("Content-Encoding") == "" {
		w.Header().Set("Content-Length", resp.Header.Get("Content-Length"))
	}
	w.WriteHeader(resp.StatusCode)
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	fw.write(nil)
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	br := &bodyReader{r: resp.Body, idle: idle, now: g.cfg.Now}
	for {
		n, err := br.Read(*bufp)
		if n > 0 && !fw.write((*bufp)[:n]) {
			return
		}
		if err != nil {
			if err != io.EOF {
				g.log.Warn("pass-through reply cut", "path", rt.rest, "err", err)
			}
			return
		}
	}
}

// readAll reads a non-streaming upstream reply, bounded.
func readAll(r io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, maxUpstreamBody+1))
	if err != nil {
		return buf.Bytes(), err
	}
	if n > maxUpstreamBody {
		return nil, errors.New("gateway: upstream reply too large")
	}
	return buf.Bytes(), nil
}
