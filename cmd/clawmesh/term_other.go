//go:build !darwin && !linux

package main

import "os"

// isTerminal says whether f is a terminal; here, where there is no
// terminal attribute to ask for, by its being a character device that is
// not the null device.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}
