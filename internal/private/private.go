// Package private checks that what only a data directory's owner may read
// is kept from everyone else: the directory itself (made owner-only when it
// is not), its keys and tokens, and a config file that holds credentials.
// Like ssh with a private key, a node or trainer refuses to start when a
// secret is open to other accounts, and says how to fix it.
package private

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrExposed reports a private file or directory other accounts can read
// or change.
var ErrExposed = errors.New("readable by other accounts")

// Secrets are the files of a data directory that hold keys or tokens,
// relative to it.
var Secrets = []string{
	"admin.token",                      // the admin API's credential
	"identity.key",                     // the peer's libp2p identity
	"share.key",                        // the key that pseudonymises shared ids
	filepath.Join("mesh", "admin.key"), // the mesh's admin key
	"config.toml",                      // may hold the upstream's and the gateway's tokens
}

// CheckDataDir makes dataDir owner-only (0700) if it is not, saying so
// in tightened, and checks every secret in it that exists: one open to
// other accounts is an error that says how to fix it.
func CheckDataDir(dataDir string) (tightened string, err error) {
	fi, err := os.Stat(dataDir)
	if err != nil {
		return "", err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(dataDir, perm&0o700|0o700); err != nil {
			return "", fmt.Errorf("%w: %s is mode %#o and cannot be made 0700: %v", ErrExposed, dataDir, perm, err)
		}
		tightened = fmt.Sprintf("%s was mode %#o: made 0700, its owner's alone", dataDir, perm)
	}
	var bad []string
	for _, name := range Secrets {
		if msg := check(filepath.Join(dataDir, name)); msg != "" {
			bad = append(bad, msg)
		}
	}
	if len(bad) > 0 {
		return tightened, fmt.Errorf("%w: %s", ErrExposed, strings.Join(bad, "; "))
	}
	return tightened, nil
}

// CheckFile checks one private file; a file that does not exist passes.
func CheckFile(path string) error {
	if msg := check(path); msg != "" {
		return fmt.Errorf("%w: %s", ErrExposed, msg)
	}
	return nil
}

func check(path string) string {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) || err != nil {
		return ""
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Sprintf("%s is mode %#o: chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	return ""
}
