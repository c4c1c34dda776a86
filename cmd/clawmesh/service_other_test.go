//go:build !linux

package main

import "testing"

// privateUserManager: a systemd user manager runs on Linux alone.
func privateUserManager(t *testing.T) string {
	return "systemd runs on Linux alone"
}
