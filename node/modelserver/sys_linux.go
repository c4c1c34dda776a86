package modelserver

import "syscall"

// sysProcAttr puts the server in a process group of its own (so that a
// stop reaches what it spawned too) and has Linux send it SIGTERM if the
// node dies without stopping it. Linux sends it when the thread that
// started the server ends: runOnce holds its thread while the server
// runs.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
