package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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
