package main

import (
	"context"
	"fmt"
	"io"

	"github.com/clawmesh/clawmesh/node"
)

const loginHelp = `Usage: clawmesh login [--json] --data DIR

Prints a URL that logs a browser in to the admin pages of the node running
on DIR: open it once (it is single-use, and expires in 10 minutes) and the
browser goes to the node's dashboard and holds a session for 12 hours, in
an HttpOnly, SameSite=Strict cookie for the host the URL names; the node
sends a browser that comes by the other loopback name (localhost for
127.0.0.1, or back) to that host. Only the data directory's owner can get one: the command asks the
node through its socket (DIR/admin.sock), else with the owner's token
(DIR/admin.token). The node's dashboard is then at /clawmesh/ on its
address (http://127.0.0.1:8400/clawmesh/ by default).
`

func runLogin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := newFlags("login", loginHelp, stderr)
	s.bindClient(fs)
	asJSON := fs.Bool("json", false, "print JSON (a stable format: url, expires)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("login takes no arguments")
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	c, err := runningNode(&s)
	if err != nil {
		return err
	}
	l, err := c.LoginURL(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, l)
	}
	fmt.Fprintln(stdout, l.URL)
	return nil
}

// runningNode returns the owner's client of the node running on the data
// directory: through its socket, else over TCP with the owner's token.
func runningNode(s *settings) (*node.Client, error) {
	r, err := reachRunning(s, "node", node.AddrFile)
	if err != nil {
		return nil, err
	}
	return &node.Client{Base: r.Base, HTTP: r.HTTP, Token: r.Token}, nil
}
