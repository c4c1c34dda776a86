package raftnet

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// textLogger logs at level and above to buf, without times.
func textLogger(buf *bytes.Buffer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}

func TestHCLogLevels(t *testing.T) {
	for _, tc := range []struct {
		level hclog.Level
		log   func(hclog.Logger, string, ...any)
		want  string // "" for nothing written
	}{
		{hclog.Trace, hclog.Logger.Trace, "level=DEBUG"},
		{hclog.Debug, hclog.Logger.Debug, "level=DEBUG"},
		{hclog.Info, hclog.Logger.Info, "level=INFO"},
		{hclog.Warn, hclog.Logger.Warn, "level=WARN"},
		{hclog.Error, hclog.Logger.Error, "level=ERROR"},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			var buf bytes.Buffer
			l := HCLog(textLogger(&buf, slog.LevelDebug))
			tc.log(l, "hello", "k", 1)
			want := tc.want + " msg=hello k=1\n"
			if got := buf.String(); got != want {
				t.Errorf("method: got %q, want %q", got, want)
			}
			buf.Reset()
			l.Log(tc.level, "hello", "k", 1)
			if got := buf.String(); got != want {
				t.Errorf("Log: got %q, want %q", got, want)
			}
		})
	}
	var buf bytes.Buffer
	HCLog(textLogger(&buf, slog.LevelDebug)).Log(hclog.Off, "never")
	if buf.Len() != 0 {
		t.Errorf("Log at Off wrote %q", buf.String())
	}
}

func TestHCLogHandlerDecides(t *testing.T) {
	var buf bytes.Buffer
	l := HCLog(textLogger(&buf, slog.LevelInfo))
	l.Trace("t")
	l.Debug("d")
	l.Info("i")
	if got, want := buf.String(), "level=INFO msg=i\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if l.IsTrace() || l.IsDebug() || !l.IsInfo() || !l.IsWarn() || !l.IsError() {
		t.Errorf("Is*: trace %v debug %v info %v warn %v error %v, want only info and above",
			l.IsTrace(), l.IsDebug(), l.IsInfo(), l.IsWarn(), l.IsError())
	}
	if got := l.GetLevel(); got != hclog.Info {
		t.Errorf("GetLevel = %v, want info (the handler's)", got)
	}
}

func TestHCLogSetLevel(t *testing.T) {
	var buf bytes.Buffer
	root := HCLog(textLogger(&buf, slog.LevelDebug))
	child := root.Named("raft").With("a", 1)
	root.SetLevel(hclog.Warn) // shared with the child

	child.Info("quiet")
	child.Warn("loud")
	if got, want := buf.String(), "level=WARN msg=loud a=1 logger=raft\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if child.IsInfo() || !child.IsWarn() || child.GetLevel() != hclog.Warn {
		t.Errorf("child: IsInfo %v IsWarn %v GetLevel %v, want false true warn", child.IsInfo(), child.IsWarn(), child.GetLevel())
	}

	// Trace and Debug both map to slog's Debug; the minimum tells them apart.
	buf.Reset()
	root.SetLevel(hclog.Debug)
	root.Trace("t")
	root.Debug("d")
	if got, want := buf.String(), "level=DEBUG msg=d\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if root.IsTrace() || !root.IsDebug() {
		t.Errorf("IsTrace %v IsDebug %v, want false true", root.IsTrace(), root.IsDebug())
	}

	buf.Reset()
	root.SetLevel(hclog.NoLevel)
	root.Trace("t")
	if got, want := buf.String(), "level=DEBUG msg=t\n"; got != want {
		t.Errorf("after NoLevel: got %q, want %q", got, want)
	}
}

func TestHCLogWithNamed(t *testing.T) {
	var buf bytes.Buffer
	root := HCLog(textLogger(&buf, slog.LevelDebug))
	a := root.With("x", 1)
	b := a.Named("raft").Named("net").With("y", 2)

	b.Info("m", "z", 3)
	if got, want := buf.String(), "level=INFO msg=m x=1 y=2 logger=raft.net z=3\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if b.Name() != "raft.net" {
		t.Errorf("Name = %q", b.Name())
	}
	if got := b.ImpliedArgs(); len(got) != 4 || got[0] != "x" || got[2] != "y" {
		t.Errorf("ImpliedArgs = %v, want x 1 y 2", got)
	}

	// Deriving does not change the parents.
	buf.Reset()
	root.Info("r")
	a.Info("a")
	b.ResetNamed("other").Info("b")
	want := "level=INFO msg=r\nlevel=INFO msg=a x=1\nlevel=INFO msg=b x=1 y=2 logger=other\n"
	if got := buf.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if root.Name() != "" || len(root.ImpliedArgs()) != 0 || len(a.ImpliedArgs()) != 2 {
		t.Errorf("parents changed: root %q %v, a %v", root.Name(), root.ImpliedArgs(), a.ImpliedArgs())
	}
}

func TestHCLogStandardLogger(t *testing.T) {
	var buf bytes.Buffer
	l := HCLog(textLogger(&buf, slog.LevelDebug))
	l.StandardLogger(nil).Print("plain")
	l.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}).Print("bad")
	want := "level=INFO msg=plain\nlevel=ERROR msg=bad\n"
	if got := buf.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestHCLogNil(t *testing.T) {
	l := HCLog(nil)
	l.Error("nowhere")
	if l.IsError() {
		t.Error("a nil logger reports that it writes errors")
	}
	if l.GetLevel() != hclog.Off {
		t.Errorf("GetLevel = %v, want off", l.GetLevel())
	}
}

// TestHCLogFormats: raft's hclog.Fmt values and hclog's number and quote
// types are written formatted, not as the format and its arguments.
func TestHCLogFormats(t *testing.T) {
	var buf bytes.Buffer
	l := HCLog(textLogger(&buf, slog.LevelDebug))
	type server struct{ ID string }
	l.Info("initial configuration", "index", 1, "servers", hclog.Fmt("%+v", []server{{ID: "a"}}), "h", hclog.Hex(255), "q", hclog.Quote("x"))
	want := "level=INFO msg=\"initial configuration\" index=1 servers=[{ID:a}] h=0xff q=\"\\\"x\\\"\"\n"
	if got := buf.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestHCLogQuiet: raft's warning that a server with no configuration yet
// has no peers to ask for votes, expected before a bootstrap, is logged at
// Debug.
func TestHCLogQuiet(t *testing.T) {
	var buf bytes.Buffer
	l := HCLog(textLogger(&buf, slog.LevelInfo))
	l.Warn("no known peers, aborting election")
	if buf.Len() != 0 {
		t.Errorf("written at Info: %q", buf.String())
	}
	buf.Reset()
	HCLog(textLogger(&buf, slog.LevelDebug)).Warn("no known peers, aborting election")
	if got := buf.String(); got != "level=DEBUG msg=\"no known peers, aborting election\"\n" {
		t.Errorf("got %q", got)
	}
}
