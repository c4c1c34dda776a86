package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/pool"
)

// Every error a command prints is two lines on stderr: what is wrong, in
// the user's terms, on one line ("clawmesh CMD: ..."), then what to do.
// The place that knows what to do says it with withHint; main finds the
// hint of the errors the packages return (a data directory held by
// another process, no mesh joined, a process that does not answer), and
// gives the others a pointer to the command's --help.

// hinted is an error with what to do about it.
type hinted struct {
	err  error
	hint string
}

func (e *hinted) Error() string { return e.err.Error() }
func (e *hinted) Unwrap() error { return e.err }

// withHint adds to err what to do about it: a sentence that names the
// command to run ("start it with 'clawmesh node --data DIR'").
func withHint(err error, format string, a ...any) error {
	if err == nil {
		return nil
	}
	return &hinted{err: err, hint: fmt.Sprintf(format, a...)}
}

// printError writes err of the command name to w: one line saying what is
// wrong, then one saying what to do.
func printError(w io.Writer, name string, err error) {
	line, hint := explain(name, err)
	fmt.Fprintf(w, "clawmesh %s: %s\n%s\n", name, line, hint)
}

// explain is err as printError writes it: the message on one line, and
// the hint.
func explain(name string, err error) (line, hint string) {
	msg := strings.TrimPrefix(userMessage(err.Error()), "remote: ")
	var h *hinted
	var held *datadir.HeldError
	var kind *datadir.KindError
	var noAnswer *adminapi.NoAnswerError
	msg = strings.TrimPrefix(msg, errUsage.Error()+": ")
	switch {
	case errors.As(err, &h):
		hint = h.hint
	case errors.Is(err, errUsage):
		help := "clawmesh " + name
		var fe *flagError
		if errors.As(err, &fe) {
			help = fe.cmd
		}
		hint = "Run '" + help + " --help' for usage."
	case errors.As(err, &kind):
		msg = fmt.Sprintf("%s is a %s's data directory (%s), not a %s's", kind.Dir, kind.Is, kind.Why, kind.Want)
		hint = fmt.Sprintf("A node and a trainer each need their own: run 'clawmesh %s --data %s' there, and give 'clawmesh %s' another --data", kind.Is, kind.Dir, kind.Want)
	case errors.As(err, &held):
		msg = strings.TrimSuffix(msg, ": stop it, or use another --data")
		hint = fmt.Sprintf("Stop it first, or give 'clawmesh %s' another --data.", name)
	case errors.Is(err, mesh.ErrNotJoined):
		long := strings.TrimPrefix(mesh.ErrNotJoined.Error(), "mesh: ")
		short, _, _ := strings.Cut(long, " (")
		msg = strings.Replace(msg, long, short, 1)
		hint = "Make a mesh with 'clawmesh mesh init', or join one with 'clawmesh join TOKEN' (a token from 'clawmesh invite' on a device of the mesh)."
	case strings.Contains(msg, adminapi.ErrNoToken.Error()):
		msg = "the node or trainer on this data directory refused the admin token sent"
		hint = fmt.Sprintf("Run 'clawmesh %s' as the data directory's owner (it reads DATA/%s), or give that token with --token", name, adminapi.TokenFile)
	case errors.Is(err, pool.ErrLocked):
		msg = "the pool is in use by another process: " + strings.TrimPrefix(msg, "directory locked by another process: ")
		hint = fmt.Sprintf("Stop it (a node, or a pool command) first, then run 'clawmesh %s' again", name)
	case errors.Is(err, mesh.ErrJoined):
		if rest := strings.TrimPrefix(msg, "already in a mesh: "); rest != msg {
			msg = rest
		}
		hint = "'clawmesh mesh status' shows which mesh; for another, use a fresh --data"
	case errors.As(err, &noAnswer):
		msg = "the node or trainer on this data directory did not answer: " + noAnswer.Reason()
		hint = "Check that it runs ('clawmesh mesh status' says), or restart it, then try again."
	}
	msg = singleLine(jsonTypeError.ReplaceAllString(msg, "field $2 cannot be a $1"))
	if hint == "" {
		msg, hint = splitHint(msg)
	}
	if hint == "" {
		hint = "Run 'clawmesh " + name + " --help' for what it needs."
	}
	return msg, sentence(singleLine(hint))
}

// jsonTypeError is encoding/json's report of a value of the wrong type,
// which names Go's types ("json: cannot unmarshal number into Go struct
// field ExportedStep.Step.id of type core.StepID"); explain says it in
// the input's terms.
var jsonTypeError = regexp.MustCompile(`json: cannot unmarshal (\w+) into Go struct field (?:[\w]+\.)*(\w+) of type \S+`)

// singleLine folds a message of several lines (a wrapped chain, another
// program's output) into one: the lines joined with "; ", spaces folded,
// cut at 500 bytes.
func singleLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			parts = append(parts, l)
		}
	}
	s = strings.Join(parts, "; ")
	if len(s) > 500 {
		s = strings.ToValidUTF8(s[:500], "") + "..."
	}
	return s
}

// splitHint splits off a message's closing parenthesis when it names a
// command to run ("... ('clawmesh mesh peers' lists the peers)"): the
// packages' own errors carry their hint so.
func splitHint(msg string) (string, string) {
	if !strings.HasSuffix(msg, ")") {
		return msg, ""
	}
	i := strings.LastIndex(msg, " (")
	if i < 0 || !strings.Contains(msg[i:], "'clawmesh ") && !strings.Contains(msg[i:], "`clawmesh ") || strings.Count(msg[i:], "(") != strings.Count(msg[i:], ")") {
		return msg, ""
	}
	return msg[:i], msg[i+2 : len(msg)-1]
}

// sentence is s with a capital first letter and a full stop.
func sentence(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	s = string(unicode.ToUpper(r)) + s[n:]
	if !strings.HasSuffix(s, ".") && !strings.HasSuffix(s, "?") && !strings.HasSuffix(s, "!") {
		s += "."
	}
	return s
}

// adminReach is how a command reaches the node or trainer running on a
// data directory: its base URL, HTTP client and token.
type adminReach struct {
	Base  string
	HTTP  *http.Client
	Token string
}

// reachRunning finds the kind ("node" or "trainer") of process running
// on s.Data, whose address file is addrFile: through the data directory's
// admin socket, else at the address in the file, with the owner's token.
// It says what is wrong when the directory is the other kind's, when
// nothing runs there, and when the address file is left from a process
// that stopped.
func reachRunning(s *settings, kind, addrFile string) (adminReach, error) {
	other, otherMark, mark := "trainer", datadir.TrainerMark, datadir.NodeMark
	if kind == "trainer" {
		other, otherMark, mark = "node", datadir.NodeMark, datadir.TrainerMark
	}
	if datadir.Is(s.Data, otherMark) && !datadir.Is(s.Data, mark) {
		return adminReach{}, withHint(fmt.Errorf("%s is a %s's data directory, not a %s's", s.Data, other, kind),
			"Give the %s's data directory with --data; 'clawmesh mesh status --data %s' shows this %s", kind, s.Data, other)
	}
	start := withHint(fmt.Errorf("no %s runs on %s", kind, s.Data), "Start one with 'clawmesh %s --data %s'", kind, s.Data)
	if hc, ok := adminapi.SocketClient(s.Data); ok {
		return adminReach{Base: adminapi.SocketBase, HTTP: hc}, nil
	}
	addr, err := adminapi.ReadAddr(s.Data, addrFile)
	if err != nil {
		return adminReach{}, start
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		why := "left by a " + kind + " that stopped"
		if na := (&adminapi.NoAnswerError{Addr: addr, Err: err}); na.Reason() != "nothing listens there" {
			why = na.Reason()
		}
		return adminReach{}, withHint(fmt.Errorf("no %s runs on %s: nothing answers at %s, the address in %s (%s)",
			kind, s.Data, addr, filepath.Join(s.Data, addrFile), why), "Start it again with 'clawmesh %s --data %s'", kind, s.Data)
	}
	c.Close()
	return adminReach{Base: "http://" + addr, Token: adminapi.ClientToken(s.Data, s.Token)}, nil
}

// refused reports whether err is a running node's or trainer's refusal of
// what it was asked (its message says why), rather than no answer.
func refused(err error) bool {
	var se *adminapi.StatusError
	return errors.As(err, &se) && !se.Plain
}

// buildFailed is a reward plugin that did not compile: the go command
// wrote why above.
func buildFailed(dir string, err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	return withHint(fmt.Errorf("%s does not compile (the Go compiler's errors are above)", dir),
		"Fix them, then run 'clawmesh reward build %s' again", dir)
}
