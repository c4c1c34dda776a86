//go:build !linux

package modelserver

import "syscall"

// sysProcAttr puts the server in a process group of its own, so that a
// stop reaches what it spawned too.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
