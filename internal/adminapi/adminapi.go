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
	"net/http"
	"os"
	"path/filepath"
	"strings"

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

// Error says what went wrong in the user's terms: the message a clawmesh
// server wrote, as it wrote it (it names the problem; the HTTP status adds
// nothing), and for a path the server has no route for, that the process
// on the data directory is not the one the command talks to.
func (e *StatusError) Error() string {
	switch {
	case !e.Plain:
		return e.Message
	case e.Code == http.StatusNotFound:
		return "the process running on this data directory does not answer " + e.Path +
			": is it a node's directory where a trainer's was expected, or the other way round? ('clawmesh mesh status --data DIR' shows the peer's role)"
	}
	return e.Status + ": " + e.Message
}

// Do sends a request with a bearer token (if any) and returns the response
// if it is 2xx, else a *StatusError.
func Do(ctx context.Context, hc *http.Client, method, url, token string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
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
		return nil, err
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
