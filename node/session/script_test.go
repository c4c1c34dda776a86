package session

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata scripts")

// The scripts in testdata/ drive a Tracker command by command and compare
// what it answers with the expected output written under each command.
//
//	# comment
//	new idle=30m max-sessions=2 max-steps=3 markers=A,B
//	call id=a session=S turn=side done trace=T at=+1m
//	s: system text
//	u: user text
//	a: reply text => tool(args)#call_1 => other({})#call_2
//	a: reply ~~ reasoning (ignored by matching)
//	t#call_1: tool result
//	----
//	expected output
//
// Commands: new, call, complete id= (one "a:" line per choice), abort id=,
// tick DURATION, end session=, last session=, stats. Each command may carry
// at=+DURATION to advance the script clock first. After every command the
// Tracker's invariants are checked.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptCmd struct {
	line   int
	cmd    string
	args   map[string]string
	pos    []string
	input  []string
	output []string
}

func parseScript(t *testing.T, path string) (cmds []*scriptCmd, lines []string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		c := &scriptCmd{line: i + 1, args: map[string]string{}}
		f := strings.Fields(l)
		c.cmd = f[0]
		for _, a := range f[1:] {
			if k, v, ok := strings.Cut(a, "="); ok {
				c.args[k] = v
			} else {
				c.pos = append(c.pos, a)
			}
		}
		i++
		for ; i < len(lines) && lines[i] != "----"; i++ {
			if strings.TrimSpace(lines[i]) == "" {
				t.Fatalf("%s:%d: blank line before ----", path, i+1)
			}
			c.input = append(c.input, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: missing ----", path, c.line)
		}
		i++
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			c.output = append(c.output, lines[i])
		}
		cmds = append(cmds, c)
	}
	return cmds, lines
}

var scriptEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func runScript(t *testing.T, path string) {
	cmds, _ := parseScript(t, path)
	var tr *Tracker
	now := scriptEpoch
	var got [][]string
	for _, c := range cmds {
		if at, ok := c.args["at"]; ok {
			now = now.Add(parseDur(t, c, at))
		}
		var out []string
		if c.cmd != "new" && tr == nil {
			var err error
			if tr, err = New(Options{}); err != nil {
				t.Fatal(err)
			}
		}
		switch c.cmd {
		case "new":
			var o Options
			for k, v := range c.args {
				switch k {
				case "idle":
					o.IdleTimeout = parseDur(t, c, v)
				case "max-sessions":
					o.MaxSessions = atoi(t, c, v)
				case "max-steps":
					o.MaxSteps = atoi(t, c, v)
				case "markers":
					o.VolatileMarkers = strings.Split(v, ",")
				default:
					t.Fatalf("line %d: unknown option %s", c.line, k)
				}
			}
			var err error
			if tr, err = New(o); err != nil {
				t.Fatalf("line %d: %v", c.line, err)
			}
			out = []string{"ok"}
		case "call":
			call := Call{Now: now, StepID: core.StepID(c.args["id"]), Session: core.SessionID(c.args["session"]),
				Turn: core.TurnMain, TraceID: c.args["trace"], Messages: parseMsgs(t, c)}
			if call.Session != "" {
				call.Source = SourceHeader
			}
			for _, p := range c.pos {
				switch p {
				case "done":
					call.Done = true
				default:
					t.Fatalf("line %d: unknown flag %s", c.line, p)
				}
			}
			if turn, ok := c.args["turn"]; ok {
				call.Turn = core.TurnType(turn)
			}
			a := tr.Begin(call)
			parent := string(a.Parent)
			if parent == "" {
				parent = "-"
			}
			l := fmt.Sprintf("-> session=%s chain=%s parent=%s segment=%d", a.Session, a.Chain, parent, a.Segment)
			if a.Sibling {
				l += " sibling"
			}
			out = append([]string{l}, fmtClosures(a.Closures)...)
		case "complete":
			out = okOr(fmtClosures(tr.Complete(core.StepID(c.args["id"]), parseMsgs(t, c), now)))
		case "abort":
			tr.Abort(core.StepID(c.args["id"]))
			out = []string{"ok"}
		case "tick":
			if len(c.pos) == 1 {
				now = now.Add(parseDur(t, c, c.pos[0]))
			}
			out = okOr(fmtClosures(tr.Tick(now)))
		case "end":
			out = okOr(fmtClosures(tr.End(core.SessionID(c.args["session"]), now)))
		case "last":
			l := string(tr.Last(core.SessionID(c.args["session"])))
			if l == "" {
				l = "-"
			}
			out = []string{l}
		case "stats":
			s := tr.Stats()
			out = []string{fmt.Sprintf("sessions=%d steps=%d inflight=%d open=%d nodes=%d", s.Sessions, s.Steps, s.InFlight, s.Open, s.Nodes)}
		default:
			t.Fatalf("line %d: unknown command %q", c.line, c.cmd)
		}
		if tr != nil {
			if err := tr.check(); err != nil {
				t.Fatalf("line %d: %s: invariant: %v", c.line, c.cmd, err)
			}
		}
		got = append(got, out)
		if !*rewrite && strings.Join(out, "\n") != strings.Join(c.output, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, c.line, c.cmd, strings.Join(out, "\n"), strings.Join(c.output, "\n"))
		}
	}
	if *rewrite {
		rewriteScript(t, path, cmds, got)
	}
}

func rewriteScript(t *testing.T, path string, cmds []*scriptCmd, got [][]string) {
	_, lines := parseScript(t, path)
	var b strings.Builder
	ci := 0
	for i := 0; i < len(lines); i++ {
		if ci < len(cmds) && i+1 == cmds[ci].line {
			c := cmds[ci]
			b.WriteString(lines[i] + "\n")
			for _, in := range c.input {
				b.WriteString(in + "\n")
			}
			b.WriteString("----\n")
			for _, o := range got[ci] {
				b.WriteString(o + "\n")
			}
			i += len(c.input) + 1 + len(c.output)
			ci++
			continue
		}
		b.WriteString(lines[i] + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func okOr(l []string) []string {
	if len(l) == 0 {
		return []string{"ok"}
	}
	return l
}

func fmtClosures(cl []Closure) []string {
	var out []string
	for _, c := range cl {
		if c.NextState == nil {
			out = append(out, fmt.Sprintf("close %s -", c.StepID))
			continue
		}
		ms := make([]string, len(c.NextState.Messages))
		for i := range c.NextState.Messages {
			ms[i] = fmtMsg(&c.NextState.Messages[i])
		}
		out = append(out, fmt.Sprintf("close %s by=%s next=[%s]", c.StepID, c.NextState.StepID, strings.Join(ms, " | ")))
	}
	return out
}

var roleLetters = map[string]string{"s": core.RoleSystem, "u": core.RoleUser, "a": core.RoleAssistant, "t": core.RoleTool}

func parseMsgs(t *testing.T, c *scriptCmd) []core.Message {
	var ms []core.Message
	for _, l := range c.input {
		head, body, ok := strings.Cut(l, ":")
		if !ok {
			t.Fatalf("line %d: bad message %q", c.line, l)
		}
		body = strings.TrimPrefix(body, " ")
		letter, id, _ := strings.Cut(head, "#")
		role, ok := roleLetters[letter]
		if !ok {
			t.Fatalf("line %d: bad role in %q", c.line, l)
		}
		m := core.Message{Role: role, ToolCallID: id}
		if r, reason, ok := strings.Cut(body, " ~~ "); ok {
			body, m.Reasoning = r, reason
		}
		parts := strings.Split(body, "=>")
		m.Content = strings.TrimSpace(parts[0])
		if len(parts) == 1 {
			m.Content = body // keep white space exactly when no tool calls
		}
		for _, p := range parts[1:] {
			p = strings.TrimSpace(p)
			call, cid, _ := strings.Cut(p, ")#")
			if !strings.HasSuffix(call, ")") && cid != "" {
				call += ")"
			}
			name, args, ok := strings.Cut(call, "(")
			if !ok || !strings.HasSuffix(args, ")") {
				t.Fatalf("line %d: bad tool call %q", c.line, p)
			}
			m.ToolCalls = append(m.ToolCalls, core.ToolCall{ID: cid, Type: "function", Name: name, Arguments: strings.TrimSuffix(args, ")")})
		}
		ms = append(ms, m)
	}
	return ms
}

func fmtMsg(m *core.Message) string {
	var b strings.Builder
	for l, r := range roleLetters {
		if r == m.Role {
			b.WriteString(l)
		}
	}
	if m.ToolCallID != "" {
		b.WriteString("#" + m.ToolCallID)
	}
	b.WriteString(": " + m.Content)
	for _, tc := range m.ToolCalls {
		fmt.Fprintf(&b, " => %s(%s)", tc.Name, tc.Arguments)
		if tc.ID != "" {
			b.WriteString("#" + tc.ID)
		}
	}
	return b.String()
}

func parseDur(t *testing.T, c *scriptCmd, s string) time.Duration {
	d, err := time.ParseDuration(strings.TrimPrefix(s, "+"))
	if err != nil {
		t.Fatalf("line %d: %v", c.line, err)
	}
	return d
}

func atoi(t *testing.T, c *scriptCmd, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("line %d: %v", c.line, err)
	}
	return n
}
