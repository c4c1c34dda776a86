//go:build !wasip1

package rewards

import (
	"fmt"
	"os"
)

// Log writes msg to standard error (a native build has no node).
func Log(msg string) { fmt.Fprintln(os.Stderr, msg) }

// Judge returns ErrNoHost: a native build has no node to ask.
func Judge(prompt string) (string, error) { return "", ErrNoHost }
