package main

import (
	"io"
	"log/slog"
)

// newLogger is the text logger the long-running commands write to w:
// records at level and above, with attributes that hold nothing (an
// empty string, as model="" would be) left out.
func newLogger(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: omitEmpty}))
}

// omitEmpty drops an attribute whose value is the empty string; the
// record's own time, level and message stay whatever they hold.
func omitEmpty(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
		return a
	}
	if a.Value.Kind() == slog.KindString && a.Value.String() == "" {
		return slog.Attr{}
	}
	return a
}
