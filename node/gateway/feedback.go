package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/gateway/wire"
	"github.com/clawmesh/clawmesh/pool"
)

// FeedbackRequest is the body of POST /clawmesh/v1/feedback. StepID names
// the step; without it the session's latest completed main step is meant.
// At least one of Score and Text is required.
type FeedbackRequest struct {
	SessionID string   `json:"session_id,omitempty"`
	StepID    string   `json:"step_id,omitempty"`
	Score     *float64 `json:"score,omitempty"` // in [-1, 1]
	Text      string   `json:"text,omitempty"`
}

var errSessionMismatch = errors.New("gateway: step belongs to another session")

// ParseFeedback decodes and checks a feedback body.
func ParseFeedback(b []byte) (FeedbackRequest, error) {
	var f FeedbackRequest
	if err := json.Unmarshal(b, &f); err != nil {
		if !json.Valid(b) {
			return f, errors.New("body is not valid JSON")
		}
		return f, errors.New(wire.ClientText(err))
	}
	if f.SessionID == "" && f.StepID == "" {
		return f, errors.New("session_id or step_id is required")
	}
	if f.Score == nil && f.Text == "" {
		return f, errors.New("score or text is required")
	}
	if f.Score != nil && (math.IsNaN(*f.Score) || *f.Score < -1 || *f.Score > 1) {
		return f, errors.New("score must be in [-1, 1]")
	}
	return f, nil
}

// feedback appends explicit feedback to a step, and sends a step already
// scored back to be scored again.
func (g *Gateway) feedback(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, false, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use POST")
		return
	}
	b, err := readAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, false, http.StatusRequestEntityTooLarge, "request_too_large", "request_too_large", "request body too large")
			return
		}
		writeError(w, false, http.StatusBadRequest, "invalid_request_error", "bad_request", "reading the request body: "+err.Error())
		return
	}
	f, err := ParseFeedback(b)
	if err != nil {
		writeError(w, false, http.StatusBadRequest, "invalid_request_error", "invalid_feedback", err.Error())
		return
	}
	id := core.StepID(f.StepID)
	if id == "" {
		g.mu.Lock()
		id = g.tr.Last(core.SessionID(f.SessionID))
		g.mu.Unlock()
		if id == "" {
			writeError(w, false, http.StatusNotFound, "not_found_error", "unknown_session", "no completed step in session "+f.SessionID)
			return
		}
	}
	fb := core.Feedback{Score: f.Score, Text: f.Text, At: g.cfg.Now()}
	var state core.State
	err = g.storeCall(r.Context(), func(ctx context.Context) error {
		add := addFeedback(f.SessionID, fb)
		return g.cfg.Store.Update(ctx, id, func(s *core.Step) error {
			err := add(s)
			state = s.State
			return err
		})
	})
	switch {
	case errors.Is(err, pool.ErrNotFound), errors.Is(err, errSessionMismatch):
		writeError(w, false, http.StatusNotFound, "not_found_error", "unknown_step", "no step "+string(id)+" in that session")
		return
	case errors.Is(err, pool.ErrPaused):
		writeError(w, false, http.StatusServiceUnavailable, "api_error", "recording_paused", "feedback not stored: "+strings.TrimPrefix(err.Error(), "pool: "))
		return
	case err != nil:
		g.log.Error("recording feedback failed", "step", id, "err", err)
		writeError(w, false, http.StatusInternalServerError, "api_error", "store_failed", "feedback not stored")
		return
	}
	g.mu.Lock()
	idle := g.tr.IdleTimeout()
	g.mu.Unlock()
	out, _ := json.Marshal(FeedbackReply{StepID: id, State: state, Scoring: scoringNote(state, idle)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

// FeedbackReply is the answer to POST /clawmesh/v1/feedback: the step the
// feedback went to, its state after it, and when the feedback will count.
type FeedbackReply struct {
	StepID core.StepID `json:"step_id"`
	State  core.State  `json:"state"`
	// Scoring says, in words, when the step will be scored with the
	// feedback.
	Scoring string `json:"scoring"`
}

// scoringNote says when a step in state st is scored with its feedback.
func scoringNote(st core.State, idle time.Duration) string {
	switch st {
	case core.StateOpen:
		return "the step is still open: it is scored with this feedback when its session ends (the next call with X-Session-Done: true) or after " +
			idle.String() + " with no continuation, whichever comes first"
	case core.StateClosed:
		return "the step is scored with this feedback within seconds"
	case core.StateFailed:
		return "the call failed: the step is kept for the record and never scored"
	}
	return "the step is past scoring (" + st.String() + "): the feedback is kept with it, and it is not scored again"
}

// addFeedback is the change feedback makes to its step.
func addFeedback(session string, fb core.Feedback) func(*core.Step) error {
	return func(s *core.Step) error {
		if session != "" && s.SessionID != core.SessionID(session) {
			return errSessionMismatch
		}
		s.Feedback = append(s.Feedback, fb)
		if s.State == core.StateScored {
			// Scored before the feedback came: back to closed, so that
			// the scorer scores it again with the feedback. (A step
			// already batched for training keeps its state.)
			s.State = core.StateClosed
		}
		return nil
	}
}
