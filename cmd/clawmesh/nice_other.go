//go:build !linux && !darwin

package main

import (
	"errors"
	"os/exec"
)

// startNice starts cmd; this system's priorities are not set here (niceErr
// says so).
func startNice(cmd *exec.Cmd, nice int) (niceErr, err error) {
	return errors.New("no nice values on this system"), cmd.Start()
}
