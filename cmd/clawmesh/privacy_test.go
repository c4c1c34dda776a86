package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/clawmesh/clawmesh/internal/private"
	"github.com/clawmesh/clawmesh/node"
)

// otherAccount returns a second local account to act as, making it if
// needed; the test is skipped where that cannot be done.
func otherAccount(t *testing.T) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("acting as another account needs root (the CI machine runs tests as root)")
	}
	const name = "clawmesh-other"
	u, err := user.Lookup(name)
	if err != nil {
		if out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
			t.Skipf("cannot make a second account: %v %s", err, out)
		}
		if u, err = user.Lookup(name); err != nil {
			t.Skipf("no second account: %v", err)
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// TestAnotherAccountCannotReadThePool: another account on the machine can
// use the node as its model endpoint, but cannot read or change a recorded
// step through any listener of the node, nor read its files.
func TestAnotherAccountCannotReadThePool(t *testing.T) {
	other := otherAccount(t)
	// The system's python3 (another account cannot run one under /root).
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("/usr/bin/python3 acts as the other account's client")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	upstream := scriptedUpstream(t, "Hello.")
	// The data directory where an owner keeps it: under a directory others
	// may traverse, itself owner-only.
	parent := t.TempDir()
	os.Chmod(parent, 0o755)
	data := filepath.Join(parent, "data")
	n, err := node.New(ctx, node.Config{DataDir: data, Upstream: upstream})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go n.Serve(ctx, ln)
	base := "http://" + ln.Addr().String()

	// As the other account: method, path, body → status (or an error).
	as := func(method, path, body string) string {
		t.Helper()
		script := `import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[2], data=sys.argv[3].encode() if sys.argv[3] else None, method=sys.argv[1], headers={"Content-Type": "application/json"})
try:
    r = urllib.request.urlopen(req, timeout=20); print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
`
		cmd := exec.Command(py, "-c", script, method, base+path, body)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: other}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s as the other account: %v %s", method, path, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := as("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); got != "200" {
		t.Fatalf("the other account's model call: %s", got)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/clawmesh/v1/pool/export", ""},
		{"GET", "/clawmesh/v1/pool/steps", ""},
		{"GET", "/clawmesh/v1/pool/stats", ""},
		{"POST", "/clawmesh/v1/pool/import", `{"id":"x"}`},
		{"GET", "/clawmesh/v1/mesh/status", ""},
	} {
		if got := as(c.method, c.path, c.body); got != "401" {
			t.Errorf("%s %s as the other account: %s, want 401", c.method, c.path, got)
		}
	}
	// Nor the admin socket, nor the files.
	sock := exec.Command(py, "-c", "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])", filepath.Join(data, "admin.sock"))
	sock.SysProcAttr = &syscall.SysProcAttr{Credential: other}
	sock.Dir = "/"
	if out, err := sock.CombinedOutput(); err == nil {
		t.Errorf("the other account connected to the admin socket: %s", out)
	}
	cat := exec.Command("cat", filepath.Join(data, "admin.token"))
	cat.SysProcAttr = &syscall.SysProcAttr{Credential: other}
	if out, err := cat.CombinedOutput(); err == nil {
		t.Errorf("the other account read the admin token: %s", out)
	}
	// The owner's CLI needs no flag: through the socket, and over TCP
	// with the token it reads by itself.
	waitFor(t, "the node's address file", func() bool { _, err := node.ReadAddr(data); return err == nil })
	steps := func() int {
		var st struct {
			Steps int `json:"steps"`
		}
		if err := json.Unmarshal([]byte(cli(t, "pool", "stats", "--json", "--data", data)), &st); err != nil {
			t.Fatal(err)
		}
		return st.Steps
	}
	if n := steps(); n != 1 {
		t.Errorf("the owner's pool stats through the socket: %d steps", n)
	}
	// A browser gets in only through a single-use login URL.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	get := func(c *http.Client, u string) int {
		t.Helper()
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get(browser, base+"/clawmesh/v1/pool/stats"); st != 401 {
		t.Errorf("a browser before login: %d", st)
	}
	if st := get(browser, base+"/clawmesh/"); st != 401 {
		t.Errorf("the dashboard before login: %d", st)
	}
	login := strings.TrimSpace(cli(t, "login", "--data", data))
	if !strings.HasPrefix(login, base+"/clawmesh/v1/login?code=") {
		t.Fatalf("login URL %q", login)
	}
	if st := get(browser, login); st != 200 {
		t.Fatalf("opening the login URL: %d", st)
	}
	u, _ := url.Parse(base)
	for _, c := range jar.Cookies(u) {
		if c.Name == "clawmesh_session" && c.Value == "" {
			t.Error("an empty session cookie")
		}
	}
	if st := get(browser, base+"/clawmesh/v1/pool/stats"); st != 200 {
		t.Errorf("a browser after login: %d", st)
	}
	if st := get(browser, base+"/clawmesh/"); st != 200 {
		t.Errorf("the dashboard after login: %d", st)
	}
	if st := get(&http.Client{}, login); st != 401 {
		t.Errorf("a login URL used twice: %d", st)
	}
	if got := as("GET", strings.TrimPrefix(login, base), ""); got != "401" {
		t.Errorf("the other account with a spent login URL: %s", got)
	}
	os.Rename(filepath.Join(data, "admin.sock"), filepath.Join(data, "admin.sock.away"))
	if n := steps(); n != 1 {
		t.Errorf("the owner's pool stats over TCP: %d steps", n)
	}
}

// A node refuses to start when a secret in its data directory is open to
// other accounts, and says how to fix it.
func TestExposedSecretStopsTheNode(t *testing.T) {
	data := t.TempDir()
	key := filepath.Join(data, "share.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("ab", 32)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := node.New(context.Background(), node.Config{DataDir: data, Upstream: "http://127.0.0.1:9/v1"})
	if !errors.Is(err, private.ErrExposed) || !strings.Contains(err.Error(), "chmod 600 "+key) {
		t.Fatalf("a world-readable key: %v", err)
	}
	_, errs, code := runCLI(t, "node", "--data", data, "--upstream", "http://127.0.0.1:9/v1")
	if code == 0 || !strings.Contains(errs, "chmod 600") {
		t.Errorf("clawmesh node with a readable key: %d %s", code, errs)
	}
}
