package adminapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestErrorsInUsersTerms: what a clawmesh server said comes through as it
// said it, with no HTTP status in front; a path the server has no route
// for says that the process is not the one the command talks to.
func TestErrorsInUsersTerms(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/admin/conflict", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusConflict, errors.New("task set x is there already with --holdout 0.25"))
	})
	mux.HandleFunc("/admin/plain", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream said no", http.StatusBadGateway)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, c := range []struct {
		path, want string
		not        []string
		code       int
	}{
		{"/admin/conflict", "task set x is there already with --holdout 0.25", []string{"409", "Conflict"}, http.StatusConflict},
		{"/admin/missing", "does not answer /admin/missing: is it a node's directory where a trainer's was expected", []string{"404 page not found", "404 Not Found"}, http.StatusNotFound},
		{"/admin/plain", "answered /admin/plain with an error: upstream said no", []string{"502", "Bad Gateway"}, http.StatusBadGateway},
	} {
		_, err := Do(context.Background(), srv.Client(), http.MethodGet, srv.URL+c.path, "", nil)
		var se *StatusError
		if !errors.As(err, &se) || se.Code != c.code {
			t.Fatalf("%s: %v, want a *StatusError with code %d", c.path, err, c.code)
		}
		msg := err.Error()
		if !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("%s: %q, want one line with %q", c.path, msg, c.want)
		}
		for _, n := range c.not {
			if strings.Contains(msg, n) {
				t.Errorf("%s: %q says %q", c.path, msg, n)
			}
		}
	}
}

// TestNoAnswer: a request nothing answers says so in a few words, without
// the URL or the dialer's internals, and is a *NoAnswerError.
func TestNoAnswer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.Listener.Addr().String()
	srv.Close() // nothing listens there now
	_, err := Do(context.Background(), nil, http.MethodGet, "http://"+addr+"/admin/status", "", nil)
	var na *NoAnswerError
	if !errors.As(err, &na) || na.Addr != addr {
		t.Fatalf("%v, want a *NoAnswerError for %s", err, addr)
	}
	msg := err.Error()
	if msg != "no answer at "+addr+": nothing listens there" {
		t.Errorf("%q", msg)
	}
	for _, n := range []string{"dial tcp", "Get ", "connect:", "/admin/status"} {
		if strings.Contains(msg, n) {
			t.Errorf("%q says %q", msg, n)
		}
	}
}
