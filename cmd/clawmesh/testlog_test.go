package main

import (
	"log/slog"
	"testing"
)

// failureLog returns a debug logger for the parts a test runs (nodes,
// trainers); what they logged is printed, its last 256 KiB, only if the test
// fails, so a failure that happens on a loaded machine says what the mesh
// was doing.
func failureLog(t *testing.T, name string) *slog.Logger {
	t.Helper()
	var w syncBuffer
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b := w.String()
		if len(b) > 256<<10 {
			b = b[len(b)-256<<10:]
		}
		t.Logf("%s logged (last %d bytes):\n%s", name, len(b), b)
	})
	return slog.New(slog.NewTextHandler(&w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
