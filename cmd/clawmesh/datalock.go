package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/node/share"
)

// One process at a time has a data directory: node and trainer take its
// lock before anything else (identity, host, pool, plugins) and hold it
// while they run; the commands that write it while nothing runs (pool
// import and repair, mesh init and revoke, invite, join, setup openclaw)
// hold it while they do. The commands that only read it, or go through the
// running node's or trainer's admin API, take nothing; scrub --steps and
// an offline pool preview read the device's id key (share.key), and take
// the lock only while they make it, when it is missing (lockKey).

// lockData takes data's lock for command ("node", "pool import"). With
// create the directory is made if missing; without, a missing one is an
// error wrapping fs.ErrNotExist.
func lockData(data, command string, create bool) (*datadir.Lock, error) {
	return datadir.Acquire(data, datadir.Holder{Command: command, PID: os.Getpid(), Started: time.Now()}, create)
}

// runners are the commands that hold a data directory while they run.
var runners = map[string]bool{"node": true, "trainer": true}

// lockOffline takes data's lock for an offline command that writes it, so
// that no node or trainer starts there meanwhile. With a node or trainer
// running there it takes nothing and the command goes on as it would
// have: through that process's admin API, or beside it (invite, join).
// Another offline command holding it is an error naming it. A missing
// directory is made with create, else left alone (nothing runs there).
func lockOffline(data, command string, create bool) (release func(), err error) {
	l, err := lockData(data, command, create)
	var held *datadir.HeldError
	switch {
	case err == nil:
		return func() { l.Release() }, nil
	case !create && errors.Is(err, fs.ErrNotExist):
		return func() {}, nil
	case errors.As(err, &held) && (held.Holder.Command == "" || runners[held.Holder.Command]):
		return func() {}, nil
	}
	return nil, err
}

// lockKey holds data, for command, while the device's id key
// (DATA/share.key) is made: a command that reads the key writes nothing
// when it is there, and takes nothing; one that would make it holds the
// directory meanwhile, and is refused, naming the holder, when another
// process holds it (a node makes the key as it starts, so a running node's
// directory has one; a trainer's directory is no place for it). A missing
// directory takes nothing (the caller says what is wrong).
func lockKey(data, command string) (release func(), err error) {
	if _, err := os.Stat(filepath.Join(data, share.KeyFile)); err == nil {
		return func() {}, nil
	}
	l, err := lockData(data, command, false)
	switch {
	case err == nil:
		return func() { l.Release() }, nil
	case errors.Is(err, fs.ErrNotExist):
		return func() {}, nil
	}
	return nil, err
}
