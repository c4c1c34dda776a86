package main

import (
	"os/exec"
	"syscall"
)

// startNice starts cmd and gives it the nice value nice (on macOS a nice
// value belongs to the whole process). niceErr says why the value could not
// be set (the worker then runs at ours).
func startNice(cmd *exec.Cmd, nice int) (niceErr, err error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, nice), nil
}
