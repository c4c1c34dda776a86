// Package pebblelock tells a Pebble directory held by another holder from
// other errors of opening it: the one check every store of ours makes.
package pebblelock

import (
	"errors"
	"strings"
	"syscall"
)

// Held reports whether err, from opening or locking a Pebble directory,
// means another holder has it: fcntl answers EAGAIN or EACCES for another
// process, and Pebble refuses a second lock of the same directory within
// one process.
func Held(err error) bool {
	return err != nil && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) ||
		strings.Contains(err.Error(), "lock held by current process"))
}
