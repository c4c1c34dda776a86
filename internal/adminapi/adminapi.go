// Package adminapi holds what the admin APIs of a node and a trainer share:
// how they write errors and how their clients read them, the file in a data
// directory that says where a running one listens, the owner-only socket
// they serve on, and the owner's token they demand over TCP.
package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// WriteError answers err as JSON, OpenAI-style, with status code.
func WriteError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": err.Error(), "type": "clawmesh_error"}})
}

// StatusError is an answer other than 2xx, with the message WriteError put
// in it (or the body, if it was not such JSON).
type StatusError struct {
	Code    int
	Status  string
	Message string
	// Path is the path asked for; Plain is set when the body was not an
	// error WriteError wrote (another server, or no such route).
	Path  string
	Plain bool
}

// Error says what went wrong in the user's terms, on one line: the message
// a clawmesh server wrote, as it wrote it (it names the problem; the HTTP
// status adds nothing); for a path the server has no route for, that the
// process on the data directory is not the one the command talks to; for
// another answer that is not a clawmesh server's, its start.
func (e *StatusError) Error() string {
	switch {
	case !e.Plain:
		return strings.Join(strings.Fields(e.Message), " ")
	case e.Code == http.StatusNotFound:
		return "the process running on this data directory does not answer " + e.Path +
			": is it a node's directory where a trainer's was expected, or the other way round? ('clawmesh mesh status --data DIR' shows the peer's role)"
	}
	msg := oneLine(e.Message)
	if msg == "" {
		msg = strings.ToLower(http.StatusText(e.Code))
	}
	return "the process running on this data directory answered " + e.Path + " with an error: " + msg
}

// oneLine is s on one line: its lines joined, spaces folded, and cut at
// 200 bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "..."
	}
	return s
}

// NoAnswerError is a request that got no answer: nothing listens at the
// address (a process that stopped without removing its address file), the
// connection broke, or the answer did not come in time.
type NoAnswerError struct {
	// Addr is the host:port asked, or SocketFile for the admin socket.
	Addr string
	Err  error
}

// Error says why in a few words, without the URL and the dialer's
// internals.
func (e *NoAnswerError) Error() string {
	return "no answer at " + e.Addr + ": " + e.Reason()
}

// Reason is why there was no answer, in a few words.
func (e *NoAnswerError) Reason() string {
	var ne net.Error
	switch {
	case errors.Is(e.Err, syscall.ECONNREFUSED), errors.Is(e.Err, fs.ErrNotExist):
		return "nothing listens there"
	case errors.Is(e.Err, context.DeadlineExceeded), errors.As(e.Err, &ne) && ne.Timeout():
		return "it did not answer in time"
	case errors.Is(e.Err, context.Canceled):
		return "interrupted"
	case errors.Is(e.Err, io.EOF), errors.Is(e.Err, io.ErrUnexpectedEOF), errors.Is(e.Err, syscall.ECONNRESET), errors.Is(e.Err, syscall.EPIPE):
		return "it closed the connection without answering"
	}
	var op *net.OpError
	if errors.As(e.Err, &op) && op.Err != nil {
		return oneLine(op.Err.Error())
	}
	return oneLine(e.Err.Error())
}

func (e *NoAnswerError) Unwrap() error { return e.Err }

// Do sends a request with a bearer token (if any) and returns the response
// if it is 2xx, else a *StatusError, or a *NoAnswerError when no answer
// came.
func Do(ctx context.Context, hc *http.Client, method, rawURL, token string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, rawURL, body)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		addr := req.URL.Host
		if req.URL.Scheme+"://"+addr == SocketBase {
			addr = SocketFile
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, &NoAnswerError{Addr: addr, Err: err}
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	se := &StatusError{Code: resp.StatusCode, Status: resp.Status, Message: strings.TrimSpace(string(raw)), Path: req.URL.Path, Plain: true}
	if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
		se.Message, se.Plain = e.Error.Message, false
	}
	return nil, se
}

// WriteAddr writes addr to the file name in dir (atomically), for the
// commands that look for a running node or trainer there.
func WriteAddr(dir, name, addr string) error {
	return atomicfile.Write(filepath.Join(dir, name), []byte(addr+"\n"), 0o600)
}

// ReadAddr reads what WriteAddr wrote.
func ReadAddr(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", err
	}
	a := strings.TrimSpace(string(b))
	if a == "" {
		return "", errors.New("adminapi: empty address file")
	}
	return a, nil
}
