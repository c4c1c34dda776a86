package raftnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// HCLog returns an hclog.Logger (what raft.Config.Logger and the transport
// take) that writes to l: Trace and Debug at slog's Debug, Info, Warn and
// Error at theirs. Key-value arguments become slog attributes, With adds
// them to every record, and a name given by Named or ResetNamed is the
// attribute "logger". l's handler decides what is written; SetLevel adds a
// minimum of its own, shared with every logger derived by With and Named,
// which quiets raft (its Info logs every election and every peer it
// replicates to) without quieting the rest of the program. A nil l
// discards everything. Values hclog formats itself (hclog.Fmt, Hex, Quote)
// are written formatted; what raft warns of that is expected (no peers
// before a bootstrap, a command left unhandled by its own transport's
// stop) is logged at Debug.
//
// go-hclog v1.6 has no slog bridge, and none is among our dependencies,
// hence this one.
func HCLog(l *slog.Logger) hclog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &hcLogger{base: l, out: l, min: new(atomic.Int32)}
}

type hcLogger struct {
	base *slog.Logger // l with the implied args
	out  *slog.Logger // base with the name
	args []any        // the implied args
	name string
	min  *atomic.Int32 // hclog.Level set by SetLevel; NoLevel for none
}

var _ hclog.Logger = (*hcLogger)(nil)

// slogLevel maps an hclog level to slog's; NoLevel logs at Info.
func slogLevel(l hclog.Level) slog.Level {
	switch {
	case l == hclog.NoLevel:
		return slog.LevelInfo
	case l <= hclog.Debug:
		return slog.LevelDebug
	case l == hclog.Info:
		return slog.LevelInfo
	case l == hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (h *hcLogger) enabled(l hclog.Level) bool {
	if l >= hclog.Off {
		return false
	}
	if min := hclog.Level(h.min.Load()); min != hclog.NoLevel && l != hclog.NoLevel && l < min {
		return false
	}
	return h.out.Enabled(context.Background(), slogLevel(l))
}

func (h *hcLogger) Log(l hclog.Level, msg string, args ...any) {
	if l > hclog.Debug && (quiet[msg] || shuttingDown(args)) {
		l = hclog.Debug
	}
	if h.enabled(l) {
		h.out.Log(context.Background(), slogLevel(l), msg, hcArgs(args)...)
	}
}

// quiet holds raft's messages that warn of what is expected: a single
// server waiting for its bootstrap has no peers to ask for votes. They are
// logged at Debug.
var quiet = map[string]bool{
	"no known peers, aborting election": true,
}

// shuttingDown reports an error among args that says this server's own
// transport is shutting down: raft's transport logs a command it read but
// could no longer hand over as an error, and a clean stop is no failure.
func shuttingDown(args []any) bool {
	for _, a := range args {
		if err, ok := a.(error); ok && errors.Is(err, raft.ErrTransportShutdown) {
			return true
		}
	}
	return false
}

// hcArgs formats the values hclog formats itself: hclog.Fmt's format and
// arguments, and hclog's Hex, Octal, Binary and Quote. Other values are
// left to slog.
func hcArgs(args []any) []any {
	var out []any
	for i, a := range args {
		var s string
		switch v := a.(type) {
		case hclog.Format:
			if len(v) > 0 {
				if f, ok := v[0].(string); ok {
					s = fmt.Sprintf(f, v[1:]...)
					break
				}
			}
			s = fmt.Sprint(v...)
		case hclog.Hex:
			s = "0x" + strconv.FormatInt(int64(v), 16)
		case hclog.Octal:
			s = "0" + strconv.FormatInt(int64(v), 8)
		case hclog.Binary:
			s = "0b" + strconv.FormatInt(int64(v), 2)
		case hclog.Quote:
			s = strconv.Quote(string(v))
		default:
			if out != nil {
				out = append(out, a)
			}
			continue
		}
		if out == nil {
			out = append(make([]any, 0, len(args)), args[:i]...)
		}
		out = append(out, s)
	}
	if out == nil {
		return args
	}
	return out
}

func (h *hcLogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hcLogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hcLogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hcLogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hcLogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hcLogger) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hcLogger) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hcLogger) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hcLogger) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hcLogger) IsError() bool { return h.enabled(hclog.Error) }

func (h *hcLogger) ImpliedArgs() []any { return h.args }

func (h *hcLogger) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(h.args[:len(h.args):len(h.args)], args...)
	c.base = h.base.With(hcArgs(args)...)
	return c.named(h.name)
}

func (h *hcLogger) Name() string { return h.name }

// Named appends name to the logger's name, hclog's way ("a.b").
func (h *hcLogger) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	c := *h
	return c.named(name)
}

func (h *hcLogger) ResetNamed(name string) hclog.Logger {
	c := *h
	return c.named(name)
}

// named sets the name of a copy.
func (h *hcLogger) named(name string) *hcLogger {
	h.name = name
	h.out = h.base
	if name != "" {
		h.out = h.base.With("logger", name)
	}
	return h
}

// SetLevel sets the minimum level of this logger and of all derived from
// the same HCLog call; NoLevel removes it, leaving the slog handler alone
// to decide.
func (h *hcLogger) SetLevel(l hclog.Level) { h.min.Store(int32(l)) }

// GetLevel is the level set by SetLevel, or else the lowest level the slog
// handler writes (Off if none).
func (h *hcLogger) GetLevel() hclog.Level {
	if l := hclog.Level(h.min.Load()); l != hclog.NoLevel {
		return l
	}
	for l := hclog.Trace; l < hclog.Off; l++ {
		if h.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

// StandardLogger returns a log.Logger whose every line is logged at
// opts.ForceLevel, or Info. InferLevels is not supported.
func (h *hcLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter returns a writer whose every write is logged as one
// message, at opts.ForceLevel, or Info.
func (h *hcLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	l := hclog.Info
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		l = opts.ForceLevel
	}
	return stdWriter{h: h, level: l}
}

type stdWriter struct {
	h     *hcLogger
	level hclog.Level
}

func (w stdWriter) Write(b []byte) (int, error) {
	w.h.Log(w.level, strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
