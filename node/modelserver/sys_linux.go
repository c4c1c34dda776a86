package modelserver

import "syscall"

// sysProcAttr puts the server in a process group of its own (so that a
// stop reaches what it spawned too) and has Linux send it SIGTERM if the
// node dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
