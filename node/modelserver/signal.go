package modelserver

import "syscall"

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) {
	if pid > 0 {
		syscall.Kill(-pid, sig)
	}
}
