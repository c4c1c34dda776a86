package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
)

// TestFeedbackBodyErrors: a feedback body over MaxBodyBytes is refused with
// 413; one that cannot be read for another reason (broken chunked encoding)
// with 400.
func TestFeedbackBodyErrors(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.MaxBodyBytes = 100 })
	fb := e.url + "/clawmesh/v1/feedback"
	if st, _, b := post(t, fb, `{"session_id":"s","text":"`+strings.Repeat("x", 200)+`"}`, nil); st != 413 {
		t.Errorf("oversize feedback: %d %s", st, b)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("POST /clawmesh/v1/feedback HTTP/1.1\r\nHost: " + c.RemoteAddr().String() +
		"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("feedback with a broken chunked body: %d, want 400", resp.StatusCode)
	}
}

// TestParseFeedbackErrorText: a feedback body the client got wrong is told
// by its JSON member and what it should be, not by Go's type names.
func TestParseFeedbackErrorText(t *testing.T) {
	for body, want := range map[string]string{
		`{bad`:                               "body is not valid JSON",
		`{"session_id":"s","score":"good"}`:  "score: want a number, got a string",
		`{"session_id":["s"],"score":1}`:     "session_id: want a string, got an array",
		`{"session_id":"s"}`:                 "score or text is required",
		`{"session_id":"s","score":2}`:       "score must be in [-1, 1]",
		`{"score":1,"text":"thanks"}`:        "session_id or step_id is required",
		`{"step_id":"x","text":{"a":"b"}}`:   "text: want a string, got an object",
		`{"step_id":"x","score":true}`:       "score: want a number, got a boolean",
		`{"step_id":"x","score":1,"text":1}`: "text: want a string, got a number",
	} {
		if _, err := ParseFeedback([]byte(body)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

// TestScoringNote: the feedback's answer says when it counts, by the
// step's state.
func TestScoringNote(t *testing.T) {
	for st, want := range map[core.State]string{
		core.StateOpen:    "when its session ends",
		core.StateClosed:  "within seconds",
		core.StateFailed:  "never scored",
		core.StateBatched: "past scoring (batched)",
		core.StateHeld:    "past scoring (held)",
	} {
		if got := scoringNote(st, 30*time.Minute); !strings.Contains(got, want) {
			t.Errorf("%v: %q, want %q", st, got, want)
		}
	}
}
