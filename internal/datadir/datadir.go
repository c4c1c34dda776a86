// Package datadir owns the lock that keeps a data directory to one clawmesh
// process at a time, whatever the command, and the marks that say what a
// data directory is: a device node's, or a trainer's.
//
// The lock is an fcntl lock on DIR/LOCK (Pebble's, which also refuses a
// second holder within one process); who holds it (the command, its pid,
// since when) is written beside it in DIR/lock.json, so that the process
// refused can name the holder. A holder that dies releases the lock with
// its process; the JSON it leaves is overwritten by the next holder.
package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/pebblelock"
)

// Files of the lock, in the data directory.
const (
	// LockFile is the file locked.
	LockFile = "LOCK"
	// HolderFile says who holds the lock (Holder, as JSON).
	HolderFile = "lock.json"
)

// Marks of what a data directory is: the subdirectory that only one kind
// of process makes.
const (
	// NodeMark is a device node's DataPool.
	NodeMark = "pool"
	// TrainerMark is a trainer's batch store.
	TrainerMark = "batches"
)

// ErrHeld reports a data directory another process holds; the error is a
// *HeldError, which names the holder.
var ErrHeld = errors.New("datadir: in use by another process")

// Holder is who holds a data directory's lock.
type Holder struct {
	// Command is the clawmesh command ("node", "trainer", "pool import").
	Command string `json:"command"`
	PID     int    `json:"pid"`
	// Started is when it took the lock.
	Started time.Time `json:"started"`
}

// HeldError is a data directory held by another process.
type HeldError struct {
	Dir string
	// Holder is who holds it; zero when it could not be read (it is
	// being written, or a process other than clawmesh holds the lock).
	Holder Holder
}

func (e *HeldError) Error() string {
	who := "another clawmesh process"
	if h := e.Holder; h.Command != "" {
		who = fmt.Sprintf("'clawmesh %s' (pid %d", h.Command, h.PID)
		if !h.Started.IsZero() {
			who += ", since " + h.Started.Local().Format("2006-01-02 15:04:05")
		}
		who += ")"
	}
	return fmt.Sprintf("data directory %s is in use by %s: stop it, or use another --data", e.Dir, who)
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// Lock is a data directory held by this process.
type Lock struct {
	dir    string
	closer io.Closer
}

// Acquire takes dir's lock for h, or fails at once with a *HeldError when
// another process (or another Lock in this one) holds it. With create, dir
// is made (0700) if missing; without, a missing dir is an error wrapping
// fs.ErrNotExist, and nothing is made.
func Acquire(dir string, h Holder, create bool) (*Lock, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if create {
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return nil, fmt.Errorf("datadir: %w", err)
		}
	} else if fi, err := os.Stat(abs); err != nil {
		return nil, err
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("datadir: %s is not a directory", dir)
	}
	c, err := vfs.Default.Lock(filepath.Join(abs, LockFile))
	if pebblelock.Held(err) {
		held, _ := ReadHolder(abs)
		return nil, &HeldError{Dir: dir, Holder: held}
	}
	if err != nil {
		return nil, fmt.Errorf("datadir: locking %s: %w", dir, err)
	}
	b, _ := json.Marshal(h)
	if err := atomicfile.Write(filepath.Join(abs, HolderFile), append(b, '\n'), 0o600); err != nil {
		c.Close()
		return nil, fmt.Errorf("datadir: %w", err)
	}
	return &Lock{dir: abs, closer: c}, nil
}

// Release removes the holder's note and lets the directory go.
func (l *Lock) Release() error {
	if l == nil || l.closer == nil {
		return nil
	}
	os.Remove(filepath.Join(l.dir, HolderFile))
	err := l.closer.Close()
	l.closer = nil
	return err
}

// ReadHolder reads who holds (or last held) dir's lock.
func ReadHolder(dir string) (Holder, error) {
	var h Holder
	b, err := os.ReadFile(filepath.Join(dir, HolderFile))
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return Holder{}, fmt.Errorf("datadir: %s: %w", HolderFile, err)
	}
	return h, nil
}

// Is reports whether dir holds mark (NodeMark, TrainerMark).
func Is(dir, mark string) bool {
	fi, err := os.Stat(filepath.Join(dir, mark))
	return err == nil && fi.IsDir()
}

// ErrKind reports a data directory of the other kind: a node's given to a
// trainer, or a trainer's to a node. The error is a *KindError.
var ErrKind = errors.New("datadir: a data directory of the other kind")

// KindError is a data directory of kind Is given to a Want.
type KindError struct {
	Dir      string
	Want, Is string // "node", "trainer"
	Why      string // what shows it: "it holds a DataPool, pool/"
}

func (e *KindError) Error() string {
	return fmt.Sprintf("%s is a %s's data directory (%s), not a %s's: a node and a trainer each need their own; run 'clawmesh %s --data %s' there, and give the %s another --data",
		e.Dir, e.Is, e.Why, e.Want, e.Is, e.Dir, e.Want)
}

func (e *KindError) Unwrap() error { return ErrKind }
