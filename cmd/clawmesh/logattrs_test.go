package main

import (
	"bytes"
	"log/slog"
	"testing"
)

type target struct{ version, model string }

func (t target) LogValue() slog.Value {
	return slog.GroupValue(slog.String("version", t.version), slog.String("model", t.model))
}

// TestLoggerOmitsEmpty: an attribute that holds nothing is not written,
// in a group or not; one that holds something, and an empty message, are.
func TestLoggerOmitsEmpty(t *testing.T) {
	var buf bytes.Buffer
	l := newLogger(&buf, slog.LevelInfo)
	l.Info("version loaded", "version", "v3", "model", "", "target", target{version: "v3"}, "n", 0)
	l.Info("", "k", "v")
	got := buf.String()
	for _, bad := range []string{`model=""`, `target.model`} {
		if bytes.Contains([]byte(got), []byte(bad)) {
			t.Errorf("%s written:\n%s", bad, got)
		}
	}
	for _, want := range []string{"version=v3", "target.version=v3", "n=0", `msg="" k=v`} {
		if !bytes.Contains([]byte(got), []byte(want)) {
			t.Errorf("%s not written:\n%s", want, got)
		}
	}
}
