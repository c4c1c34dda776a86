package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node/gateway/sse"
	"github.com/clawmesh/clawmesh/node/gateway/wire"
	"github.com/clawmesh/clawmesh/node/session"
	"github.com/clawmesh/clawmesh/pool"
)

// errClientGone is the cancel cause when the client went away.
var errClientGone = errors.New("gateway: client disconnected")

// record forwards a chat completions, responses or messages call and
// records it as a step.
func (g *Gateway) record(w http.ResponseWriter, r *http.Request, rt route) {
	anthropic := rt.api == core.APIMessages
	start := g.cfg.Now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, anthropic, http.StatusRequestEntityTooLarge, "request_too_large", "request_too_large", "request body too large")
			return
		}
		writeError(w, anthropic, http.StatusBadRequest, "invalid_request_error", "bad_request", "reading the request body: "+err.Error())
		return
	}
	req, err := wire.ParseRequest(rt.api, body)
	if err != nil {
		writeError(w, anthropic, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	who, err := callIdentity(rt, r.Header, req)
	if err != nil {
		writeError(w, anthropic, http.StatusBadRequest, "invalid_request_error", "invalid_session_header",
			"X-Turn-Type must be main or side, X-Session-Done true or false, X-Session-Id printable")
		return
	}

	if req.PreviousResponseID != "" {
		g.mu.Lock()
		msgs, ok := g.convs.join(req.PreviousResponseID, req.Normalized.Messages)
		g.mu.Unlock()
		if ok {
			req.Normalized.Messages = msgs
		} else {
			g.log.Debug("previous_response_id not known (too old, or from before a restart): recording the call's own input only",
				"previous_response_id", req.PreviousResponseID)
		}
	}
	route := g.cfg.Route()
	if route.Model != "" && route.Model != req.Model {
		if b, err := wire.WithModel(body, route.Model); err == nil {
			body = b
		} else {
			g.log.Warn("could not route the call to the adapter's model; sending it as the client did", "err", err)
			route.Adapter = ""
		}
	}
	if route.Fields != "" {
		var fields map[string]json.RawMessage
		b, err := body, json.Unmarshal([]byte(route.Fields), &fields)
		if err == nil {
			b, err = wire.WithFields(body, fields)
		}
		if err == nil {
			body = b
		} else {
			g.log.Warn("could not set the route's fields in the call; sending it as the client did", "err", err)
			route.Adapter = ""
		}
	}
	step := &core.Step{
		ID:       g.cfg.NewID(),
		Turn:     who.turn,
		API:      rt.api,
		State:    core.StateOpen,
		Request:  req.Normalized,
		Upstream: cmp.Or(route.Upstream, g.cfg.Upstream),
		Model:    req.Model,
		Adapter:  route.Adapter,
		TraceID:  who.trace,
		Source:   "gateway",
		Timings:  core.Timings{Start: start},
	}
	g.mu.Lock()
	asg := g.tr.Begin(session.Call{Now: start, StepID: step.ID, Session: who.session, Source: who.source, Turn: who.turn,
		Done: who.done, TraceID: who.trace, Messages: req.Normalized.Messages})
	g.mu.Unlock()
	step.SessionID, step.ChainID, step.ParentID = asg.Session, asg.Chain, asg.Parent

	// The parent's next state is stored with this call's step, in one
	// commit, before the client's reply completes. Steps that closed for
	// other reasons (idle, evicted, superseded) are written in the
	// background: if the node dies first they are still open on disk, and
	// the next run resumes (and closes) them.
	chain, others := splitClosures(asg.Closures, asg.Parent)
	g.closeLater(others)
	storeCtx := context.WithoutCancel(r.Context())
	commit := func(ok bool) {
		g.commit(storeCtx, step, ok, who.done, chain)
		g.logCall(step, req.Stream)
	}

	caps := g.cfg.Caps
	upBody, err := wire.UpstreamBody(req, body, caps)
	if err != nil {
		g.log.Warn("could not add fields to the upstream request; forwarding it unchanged", "err", err)
		upBody = body
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	silence := g.cfg.StreamIdleTimeout
	if !req.Stream {
		silence = g.cfg.ReplyTimeout
	}
	idle := newIdleTimer(silence, cancel)
	defer idle.stop()
	u := g.base(route) + strings.TrimPrefix(rt.rest, "/v1")
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	upHeader := g.upstreamHeader(r.Header, true)
	newUpReq := func(b []byte) (*http.Request, error) {
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
		if err == nil {
			hr.Header = upHeader.Clone()
		}
		return hr, err
	}
	upReq, err := newUpReq(upBody)
	if err != nil {
		writeError(w, anthropic, http.StatusBadRequest, "invalid_request_error", "bad_request", err.Error())
		g.mu.Lock()
		g.tr.Abort(step.ID)
		g.mu.Unlock()
		g.closeLater(chain)
		return
	}

	resp, err := g.client.Do(upReq)
	if err == nil && wire.Refused(req, caps, resp.StatusCode) {
		// The upstream may refuse what the gateway asked for (vLLM refuses
		// Responses log-probs for gpt-oss models): ask again as the client
		// did, so that the client gets what it would have got without the
		// gateway, and record the call without log-probs.
		g.log.Debug("upstream refused the call with the fields the gateway added; sending it again as the client sent it",
			"step", step.ID, "status", resp.StatusCode)
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		caps = wire.Caps{}
		idle.reset()
		if upReq, err = newUpReq(body); err == nil { // cannot fail: the URL was good a moment ago
			resp, err = g.client.Do(upReq)
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			step.ClientDisconnected = true
			commit(false)
			return
		}
		g.upstreamFailures.Add(1)
		msg := "upstream unreachable: " + err.Error()
		if idle.fired.Load() {
			msg = "upstream sent nothing for " + silence.String()
		}
		g.log.Warn("upstream call failed", "step", step.ID, "err", err)
		step.Response = core.Response{Status: http.StatusBadGateway, Error: errorJSON("upstream_unreachable", msg)}
		commit(false)
		writeError(w, anthropic, http.StatusBadGateway, "api_error", "upstream_unreachable", msg)
		return
	}
	defer resp.Body.Close()
	if loopRefusal(resp) {
		// The call came round a loop of gateways (loop.go): a
		// misconfiguration, not a call of the agent's; nothing is recorded.
		g.mu.Lock()
		g.tr.Abort(step.ID)
		g.mu.Unlock()
		g.closeLater(chain)
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, io.LimitReader(resp.Body, 64<<10))
		return
	}
	// An upstream that names the adapter version that served the call
	// (clawmesh serve) is more exact than the node's notion of it.
	if v := resp.Header.Get(serveapi.AdapterHeader); v != "" {
		step.Adapter = v
	}
	br := &bodyReader{r: resp.Body, idle: idle, now: g.cfg.Now}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") && resp.StatusCode/100 == 2 {
		g.stream(w, r, req, caps, step, resp, br, idle, cancel, commit)
		return
	}

	raw, err := readAll(br)
	if !br.first.IsZero() {
		// A reply that is not streamed arrives whole: its first byte is
		// as near as the gateway sees to its first token.
		step.Timings.TTFT = br.first.Sub(start)
	}
	if err != nil {
		if r.Context().Err() != nil {
			step.ClientDisconnected = true
			step.Response = core.Response{Status: resp.StatusCode}
			commit(false)
			return
		}
		g.upstreamFailures.Add(1)
		msg := "upstream reply cut: " + err.Error()
		step.Response = core.Response{Status: http.StatusBadGateway, Error: errorJSON("upstream_cut", msg)}
		commit(false)
		writeError(w, anthropic, http.StatusBadGateway, "api_error", "upstream_cut", msg)
		return
	}
	cr, clientBody, err := wire.ParseResponse(req, resp.StatusCode, raw, caps)
	if err != nil {
		g.log.Warn("could not parse the upstream reply; forwarding it unchanged", "step", step.ID, "status", resp.StatusCode, "err", err)
	}
	if clientBody == nil {
		clientBody = raw
	}
	cr.Status = resp.StatusCode
	if cr.Error == nil && resp.StatusCode/100 != 2 {
		cr.Error = errorJSON("upstream_status", string(raw))
	}
	step.Response = cr
	if cr.Model != "" {
		step.Model = cr.Model
	}
	ok := resp.StatusCode/100 == 2 && cr.Error == nil && len(cr.Choices) > 0
	if r.Context().Err() != nil {
		step.ClientDisconnected = true
		ok = false
	}
	commit(ok)
	if step.ClientDisconnected {
		return
	}
	copyHeader(w.Header(), resp.Header)
	w.Header().Set("Content-Length", itoa(len(clientBody)))
	w.WriteHeader(resp.StatusCode)
	w.Write(clientBody)
}

// stream relays an SSE reply event by event, flushing each at once. The
// terminal event is held back until the step is recorded.
func (g *Gateway) stream(w http.ResponseWriter, r *http.Request, req *wire.Request, caps wire.Caps, step *core.Step, resp *http.Response,
	br *bodyReader, idle *idleTimer, cancel context.CancelCauseFunc, commit func(ok bool)) {
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	fw.write(nil)

	rd := sse.NewReader(br, maxEventBytes)
	st := wire.NewStream(req, caps)
	var tail []byte
	var readErr error
	for {
		ev, err := rd.Next()
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
		out, err := st.Event(ev)
		if err != nil {
			g.log.Debug("upstream event not understood; forwarded as is", "step", step.ID, "err", err)
			out = ev.Raw
		}
		if step.Timings.TTFT == 0 && st.Produced() {
			// The first token: the first event with some of the reply
			// (not the role-only chunk or message_start before it).
			step.Timings.TTFT = g.cfg.Now().Sub(step.Timings.Start)
		}
		if st.Done() {
			tail = out
			break
		}
		if out != nil && !fw.write(out) {
			cancel(errClientGone)
			break
		}
	}
	step.ClientDisconnected = fw.err != nil || r.Context().Err() != nil
	complete := st.Done() || (readErr == nil && !step.ClientDisconnected && st.End())
	cr := st.Response()
	cr.Status = resp.StatusCode
	if cr.Model != "" {
		step.Model = cr.Model
	}
	// An error event of the upstream's own reached the client already; a
	// stream that broke without one did not tell the client anything.
	toldClient := cr.Error != nil
	if !step.ClientDisconnected && (readErr != nil || !complete) {
		g.upstreamFailures.Add(1)
		msg := "upstream stream ended without its terminal event"
		if idle.fired.Load() {
			msg = "upstream stream idle for " + g.cfg.StreamIdleTimeout.String()
		} else if readErr != nil {
			msg = "upstream stream cut: " + readErr.Error()
		}
		g.log.Warn("upstream stream incomplete", "step", step.ID, "err", msg)
		if cr.Error == nil {
			cr.Error = errorJSON("upstream_cut", msg)
		}
	}
	step.Response = cr
	ok := !step.ClientDisconnected && complete && readErr == nil && cr.Error == nil && len(cr.Choices) > 0
	commit(ok)
	if !step.ClientDisconnected && (readErr != nil || !complete) && (readErr != nil || !toldClient) {
		// The upstream's stream broke: so does the client's, as it would
		// talking to the upstream directly, so that a cut reply never reads
		// as a finished one. Anthropic's API defines an error event: the
		// client gets it first.
		if req.API == core.APIMessages {
			fw.write(anthropicErrorEvent(step.Response.Error))
		}
		panic(http.ErrAbortHandler)
	}
	if tail != nil && !step.ClientDisconnected && fw.write(tail) {
		// What the upstream sends after its terminal event (vLLM's [DONE]
		// after an error event) goes on to the client as it is, until the
		// upstream ends the body (or the idle timer cuts it).
		for {
			ev, err := rd.Next()
			if err != nil || !fw.write(ev.Raw) {
				break
			}
		}
	}
}

// commit records a finished call: the step, with chain (the closure of the
// step it continues) in the same durable write; then the tracker learns the
// reply (ok) or forgets the call (failed, cut or abandoned: nothing will
// continue them). A call the upstream refused, could not be reached for or
// cut is stored failed, out of training, with only the start of its long
// texts (keptOfFailed); one the client abandoned is stored closed. A step that ends its chain
// (done) is stored closed at once. Closures of other steps that completing
// the call brings are written in the background. Store failures are logged
// and counted, never returned: recording must not break the agent.
func (g *Gateway) commit(ctx context.Context, step *core.Step, ok, done bool, chain []session.Closure) {
	now := g.cfg.Now()
	step.Timings.Total = now.Sub(step.Timings.Start)
	switch {
	case failed(step):
		step.State = core.StateFailed
		step.Request.Messages = keptOfFailed(step.Request.Messages)
	case !ok || done:
		step.State = core.StateClosed
	}
	if step.ClientDisconnected {
		g.disconnected.Add(1)
	}
	if cause := g.pausedCause(); cause != "" {
		g.noteUnrecorded(step, cause)
	} else if err := g.storeCall(ctx, func(ctx context.Context) error { return g.store(ctx, step, chain) }); err != nil {
		g.recordFailures.Add(1)
		cause := err.Error()
		if errors.Is(err, pool.ErrPaused) {
			cause = strings.TrimPrefix(cause, pool.ErrPaused.Error()+": ")
		}
		g.noteUnrecorded(step, cause)
	} else {
		g.noteRecorded()
	}
	var cl []session.Closure
	g.mu.Lock()
	if ok {
		g.convs.add(step)
		actions := make([]core.Message, len(step.Response.Choices))
		for i, c := range step.Response.Choices {
			actions[i] = c.Message
		}
		cl = g.tr.Complete(step.ID, actions, now)
	} else {
		g.tr.Abort(step.ID)
	}
	g.mu.Unlock()
	own, others := splitClosures(cl, step.ID)
	if len(own) > 0 && (own[0].NextState != nil || step.State != core.StateClosed) {
		// The step closed as it completed for a reason it was not stored
		// with: a continuation of its reply already began (rare: the client
		// did not wait for the end of the reply), or its session was
		// evicted while it ran.
		g.applyClosures(ctx, own)
	}
	g.closeLater(others)
}

// logCall writes the one line a proxy writes per call (Config.LogCalls).
func (g *Gateway) logCall(step *core.Step, stream bool) {
	if !g.cfg.LogCalls {
		return
	}
	status := step.Response.Status
	if status == 0 && step.Response.Error == nil {
		status = http.StatusOK
	}
	attrs := []any{"api", step.API, "model", step.Model, "session", step.SessionID, "status", status,
		"stream", stream, "duration", step.Timings.Total.Round(time.Millisecond), "step", step.ID}
	if step.ClientDisconnected {
		attrs = append(attrs, "client_gone", true)
	}
	g.log.Info("call", attrs...)
}

// store writes step and the closures in chain, in one commit when the Store
// can (Applier).
func (g *Gateway) store(ctx context.Context, step *core.Step, chain []session.Closure) error {
	if a, ok := g.cfg.Store.(Applier); ok && len(chain) > 0 {
		changes, closed := g.closureChanges(chain)
		err := a.Apply(ctx, []*core.Step{step}, changes)
		if err == nil {
			g.handOver(closed)
			return nil
		}
		// The parent may be missing (its own write failed): store the step
		// on its own, then what of the closures can be.
		g.log.Warn("storing a step with its parent's next state failed; storing them apart", "step", step.ID, "err", err)
	}
	if err := g.cfg.Store.Put(ctx, step); err != nil {
		return err
	}
	g.applyClosures(ctx, chain)
	return nil
}

// failed reports whether step records a call that failed upstream: refused
// (a 4xx or 5xx status), unreachable, or cut (an error object recorded).
// A call the client abandoned is not failed.
func failed(step *core.Step) bool {
	if step.ClientDisconnected {
		return false
	}
	return step.Response.Error != nil || step.Response.Status >= 400
}

// failedKeep is how much of each text (a message's content or reasoning, a
// tool call's arguments) and of each non-text part a failed step keeps: a
// prompt the upstream refused as too long must not stay in the pool at its
// full size, where nothing will train on it; what is kept still shows what
// the call was.
const failedKeep = 16 << 10

// keptOfFailed is what a failed step keeps of its request's messages: each
// text cut to failedKeep bytes, saying how much was left out, and each
// non-text part larger than that dropped (its type stays). msgs itself is
// not changed: the session tracker may hold it.
func keptOfFailed(msgs []core.Message) []core.Message {
	out := make([]core.Message, len(msgs))
	for i, m := range msgs {
		k := m
		k.Content = cutText(m.Content)
		k.Reasoning = cutText(m.Reasoning)
		if len(m.Parts) > 0 {
			k.Parts = make([]core.Part, len(m.Parts))
			for j, p := range m.Parts {
				if len(p.Raw) > failedKeep {
					p.Raw = nil
				}
				k.Parts[j] = p
			}
		}
		if len(m.ToolCalls) > 0 {
			k.ToolCalls = make([]core.ToolCall, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				c.Arguments = cutText(c.Arguments)
				k.ToolCalls[j] = c
			}
		}
		out[i] = k
	}
	return out
}

// cutText is s cut to failedKeep bytes on a character boundary, with a
// note of how many bytes were left out.
func cutText(s string) string {
	if len(s) <= failedKeep {
		return s
	}
	n := failedKeep
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s… [%d more bytes not kept: the call failed]", s[:n], len(s)-n)
}

// anthropicErrorEvent is the error event of Anthropic's streaming API
// carrying the recorded error's message.
func anthropicErrorEvent(recorded json.RawMessage) []byte {
	var e struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(recorded, &e)
	if e.Message == "" {
		e.Message = "upstream stream cut"
	}
	data, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": "api_error", "message": e.Message}})
	return append(append([]byte("event: error\ndata: "), data...), "\n\n"...)
}

// splitClosures separates the closures of step id from the others.
func splitClosures(cl []session.Closure, id core.StepID) (own, others []session.Closure) {
	for _, c := range cl {
		if id != "" && c.StepID == id {
			own = append(own, c)
		} else {
			others = append(others, c)
		}
	}
	return own, others
}

// errorJSON is an error object for Response.Error.
func errorJSON(code, msg string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"code": code, "message": msg})
	return b
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	if n == 0 {
		return "0"
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
