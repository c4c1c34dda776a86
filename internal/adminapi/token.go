package adminapi

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// TokenFile is the file in a data directory that holds its owner's admin
// credential: a node or trainer makes it (mode 0600, in a 0700 directory)
// and demands it on every admin request over TCP; the CLI, run by the same
// account, reads it by itself. Another account on the machine can reach
// the loopback listener but not this file.
const TokenFile = "admin.token"

// ErrNoToken is answered to an admin request without the owner's token.
var ErrNoToken = errors.New("the admin API needs the data directory owner's token (DATA/admin.token, which clawmesh commands send by themselves)")

// LoadOrCreateToken returns the admin token of dataDir, making it on
// first use.
func LoadOrCreateToken(dataDir string) (string, error) {
	if t, err := ReadToken(dataDir); err != nil || t != "" {
		return t, err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	err := atomicfile.Create(filepath.Join(dataDir, TokenFile), []byte(tok+"\n"), 0o600)
	if errors.Is(err, fs.ErrExist) {
		return ReadToken(dataDir) // another process made it first
	}
	if err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	return tok, nil
}

// ReadToken reads the admin token of dataDir, "" if there is none.
func ReadToken(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, TokenFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 32 {
		return "", fmt.Errorf("admin token: %s is damaged: remove it and restart", filepath.Join(dataDir, TokenFile))
	}
	return t, nil
}

// Authorized reports whether r carries token as its bearer token
// (compared in constant time). An empty token authorizes nothing.
func Authorized(r *http.Request, token string) bool {
	if token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}

// RequireToken serves h only to requests that carry token.
func RequireToken(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Authorized(r, token) {
			WriteError(w, http.StatusUnauthorized, ErrNoToken)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// ClientToken is the token a command run by the data directory's owner
// sends: the directory's admin token when it has one, else the one given.
func ClientToken(dataDir, given string) string {
	if t, err := ReadToken(dataDir); err == nil && t != "" {
		return t
	}
	return given
}
