package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"

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
	err = g.storeCall(r.Context(), func(ctx context.Context) error {
		return g.cfg.Store.Update(ctx, id, addFeedback(f.SessionID, fb))
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
	out, _ := json.Marshal(map[string]core.StepID{"step_id": id})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(out)
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
