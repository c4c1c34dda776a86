package adminapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// SocketFile is the Unix socket in a data directory where a running node
// or trainer serves its admin API to the directory's owner: the socket is
// 0600 in a 0700 directory, so no credential is asked, and it is the
// CLI's first way to reach a running one.
const SocketFile = "admin.sock"

// SocketBase is the base URL of requests sent through the socket.
const SocketBase = "http://clawmesh"

// ListenSocket listens on dataDir's admin socket, owner-only, replacing
// one a process that died left behind (the caller holds the data
// directory's lock, so no live one is there).
func ListenSocket(dataDir string) (net.Listener, error) {
	path := filepath.Join(dataDir, SocketFile)
	if len(path) >= 104 {
		return nil, fmt.Errorf("admin socket: %s is too long a path for a Unix socket", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	return ln, nil
}

// ServeSocket serves h on dataDir's admin socket until ctx is done, then
// removes the socket. A socket that cannot be made is logged by the
// caller through the returned error; it serves nothing then.
func ServeSocket(ctx context.Context, dataDir string, h http.Handler) (done <-chan struct{}, err error) {
	ln, err := ListenSocket(dataDir)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	path := filepath.Join(dataDir, SocketFile)
	c, cleaned := make(chan struct{}), make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cleaned)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		os.Remove(path)
	})
	go func() {
		// done closes once the socket is gone, so that a server started
		// on the same directory after it cannot lose its new socket to
		// this one's removal.
		defer close(c)
		srv.Serve(ln)
		if stop() {
			os.Remove(path)
		} else {
			<-cleaned
		}
	}()
	return c, nil
}

// SocketClient returns a client whose requests (to SocketBase) go through
// dataDir's admin socket, ok=false when nothing listens there.
func SocketClient(dataDir string) (hc *http.Client, ok bool) {
	path := filepath.Join(dataDir, SocketFile)
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, false
	}
	c.Close()
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
	}}, true
}
