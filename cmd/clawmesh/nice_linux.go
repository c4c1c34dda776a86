package main

import (
	"os/exec"
	"runtime"
	"syscall"
)

// startNice starts cmd with the nice value nice. On Linux a nice value
// belongs to a thread, and a new thread or process takes its creator's: the
// worker is forked from a thread of ours whose value was set first, so
// that every thread the worker's runtime makes has it from the start. That
// thread ends with the goroutine that locked it, its value never going
// back to ours. niceErr says why the value could not be set (the worker
// then runs at ours).
func startNice(cmd *exec.Cmd, nice int) (niceErr, err error) {
	type started struct{ niceErr, err error }
	done := make(chan started, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine.
		runtime.LockOSThread()
		ne := syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), nice)
		done <- started{ne, cmd.Start()}
	}()
	s := <-done
	return s.niceErr, s.err
}
