package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/setup"
	"github.com/clawmesh/clawmesh/node/share"
)

// runBriefly runs the CLI for at most d: a command that should refuse to
// start and starts instead returns when d is up, as a stopped node does.
func runBriefly(t *testing.T, d time.Duration, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out, errb syncBuffer
	code := run(ctx, args, &out, &errb)
	return out.String(), errb.String(), code
}

// TestOneProcessPerDataDir: while `clawmesh node` runs on a data
// directory, a second node and a trainer on it are refused, told which
// command holds it, its pid and what to do, before they open anything;
// the commands that go through the running node still work; and once it
// stops, the directory is free again.
func TestOneProcessPerDataDir(t *testing.T) {
	up := scriptedUpstream(t, "hi")
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"node", "--data", data, "--listen", "127.0.0.1:0", "--upstream", up, "--no-mdns", "--no-scoring"}, &logs, &logs)
	}()
	waitFor(t, "the node's address file", func() bool { _, err := node.ReadAddr(data); return err == nil })
	if h, err := datadir.ReadHolder(data); err != nil || h.Command != "node" || h.PID != os.Getpid() || h.Started.IsZero() {
		t.Errorf("the running node's lock.json: %+v, %v", h, err)
	}

	held := fmt.Sprintf("data directory %s is in use by 'clawmesh node' (pid %d, since ", data, os.Getpid())
	for _, args := range [][]string{
		{"node", "--data", data, "--listen", "127.0.0.1:0", "--upstream", up, "--no-mdns", "--no-scoring"},
		{"trainer", "--data", data, "--no-mdns", "--weights", "off", "--p2p-listen", "/ip4/127.0.0.1/tcp/0"},
	} {
		_, errs, code := runBriefly(t, 20*time.Second, args...)
		if code != 1 || !strings.Contains(errs, "clawmesh "+args[0]+": "+held) || !strings.HasSuffix(errs, ")\nStop it first, or give 'clawmesh "+args[0]+"' another --data.\n") {
			t.Errorf("%s on a node's directory: code %d, %q; want %q", args[0], code, errs, held)
		}
	}
	for _, name := range []string{"identity.key", "batches"} {
		if _, err := os.Stat(filepath.Join(data, name)); err == nil {
			t.Errorf("the refused commands made %s", name)
		}
	}
	// Through the running node: reading, and an import.
	if out, errs, code := runCLI(t, "pool", "stats", "--data", data); code != 0 || !strings.Contains(out, "steps") {
		t.Errorf("pool stats while the node runs: %d %s %q", code, errs, out)
	}
	file := filepath.Join(t.TempDir(), "none.jsonl")
	os.WriteFile(file, nil, 0o600)
	if out, errs, code := runCLI(t, "pool", "import", file, "--data", data); code != 0 || !strings.Contains(out, "imported 0") {
		t.Errorf("pool import while the node runs: %d %s %q", code, errs, out)
	}

	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("node: code %d\n%s", code, logs.String())
	}
	if _, err := os.Stat(filepath.Join(data, datadir.HolderFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock.json outlived the node: %v", err)
	}
	l, err := lockData(data, "pool import", false)
	if err != nil {
		t.Fatalf("the stopped node's directory: %v", err)
	}
	l.Release()
}

// TestOfflineWriterHoldsTheDirectory: a command that writes the directory
// while nothing runs holds it: a node, and another writer, are refused,
// naming it; a reader is not.
func TestOfflineWriterHoldsTheDirectory(t *testing.T) {
	data := t.TempDir()
	l, err := lockData(data, "pool import", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	held := "is in use by 'clawmesh pool import' (pid "
	for _, args := range [][]string{
		{"node", "--data", data, "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9/v1", "--no-mdns", "--no-scoring"},
		{"mesh", "init", "--data", data},
		{"pool", "repair", "--data", data},
	} {
		_, errs, code := runBriefly(t, 20*time.Second, args...)
		if code != 1 || !strings.Contains(errs, held) {
			t.Errorf("%q while a pool import runs: code %d, %q", args, code, errs)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "pool")); err == nil {
		t.Error("the refused node made a pool")
	}
	if _, errs, code := runCLI(t, "pool", "stats", "--data", data); strings.Contains(errs, held) {
		t.Errorf("a reader was refused: %d %q", code, errs)
	}
}

// TestNodeAndTrainerDirectories: a node refuses a trainer's directory and
// a trainer a node's, naming both, and neither writes in the other's.
func TestNodeAndTrainerDirectories(t *testing.T) {
	tdir := t.TempDir()
	os.Mkdir(filepath.Join(tdir, datadir.TrainerMark), 0o700)
	_, errs, code := runBriefly(t, 20*time.Second, "node", "--data", tdir, "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9/v1", "--no-mdns", "--no-scoring")
	want := "clawmesh node: " + tdir + " is a trainer's data directory (it holds a trainer's batch store, batches/), not a node's\n" +
		"A node and a trainer each need their own: run 'clawmesh trainer --data " + tdir + "' there, and give 'clawmesh node' another --data.\n"
	if code != 1 || !strings.HasSuffix(errs, want) {
		t.Errorf("node on a trainer's directory: code %d, %q; want %q", code, errs, want)
	}
	for _, name := range []string{"pool", "share.key", "admin.token", "identity.key"} {
		if _, err := os.Stat(filepath.Join(tdir, name)); err == nil {
			t.Errorf("the refused node wrote %s in the trainer's directory", name)
		}
	}

	ndir := t.TempDir()
	os.Mkdir(filepath.Join(ndir, datadir.NodeMark), 0o700)
	_, errs, code = runBriefly(t, 20*time.Second, "trainer", "--data", ndir, "--no-mdns", "--weights", "off", "--p2p-listen", "/ip4/127.0.0.1/tcp/0")
	want = "clawmesh trainer: " + ndir + " is a node's data directory (it holds a device's DataPool, pool/), not a trainer's\n" +
		"A node and a trainer each need their own: run 'clawmesh node --data " + ndir + "' there, and give 'clawmesh trainer' another --data.\n"
	if code != 1 || !strings.HasSuffix(errs, want) {
		t.Errorf("trainer on a node's directory: code %d, %q; want %q", code, errs, want)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, errs, code = runBriefly(t, 20*time.Second, "trainer", "--data", tdir, "--admin", ln.Addr().String(), "--no-mdns", "--weights", "off")
	want = "clawmesh trainer: the admin API address " + ln.Addr().String() + " is in use by another process (another trainer?)\nStop it, or give 'clawmesh trainer' another --admin.\n"
	if code != 1 || errs != want {
		t.Errorf("trainer on a taken --admin: code %d, %q; want %q", code, errs, want)
	}
	_, errs, code = runCLI(t, "pool", "import", os.DevNull, "--data", tdir)
	if code != 1 || !strings.Contains(errs, "is a trainer's data directory") {
		t.Errorf("pool import into a trainer's directory: code %d, %q", code, errs)
	}
}

// TestNodeChecksBeforeWork: an upstream that is the gateway itself, a
// --listen address in use and a plugin file that is missing are each
// refused in one line before the data directory is made.
func TestNodeChecksBeforeWork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	self := fmt.Sprintf("127.0.0.1:%d", port)
	plugins := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(plugins, []byte("[[plugins]]\npath = \"gone.wasm\"\n"), 0o600)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--upstream", "http://localhost:" + fmt.Sprint(port) + "/v1", "--listen", self}, 2,
			"clawmesh node: upstream http://localhost:" + fmt.Sprint(port) + "/v1 is this node's own gateway (listen " + self + "): every call would come back to it; point the upstream at the LLM server\n"},
		{[]string{"--upstream", "http://127.0.0.1:9/v1", "--listen", ln.Addr().String()}, 1,
			"clawmesh node: the gateway address " + ln.Addr().String() + " is in use by another process (another node?)\nStop it, or give 'clawmesh node' another --listen.\n"},
		{[]string{"--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0", "--config", plugins}, 1, "gone.wasm"},
	} {
		data := filepath.Join(t.TempDir(), "new")
		_, errs, code := runBriefly(t, 20*time.Second, append([]string{"node", "--data", data, "--no-mdns"}, c.args...)...)
		if code != c.code || !strings.HasSuffix(errs, c.want) && !strings.Contains(errs, c.want) || strings.Count(errs, "\n") > 2 {
			t.Errorf("node %q: code %d, %q; want %d, %q", c.args, code, errs, c.code, c.want)
		}
		if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("node %q made the data directory: %v", c.args, err)
		}
	}
}

// TestKeyAndConfigWritersHoldTheDirectory: scrub --steps and an offline
// pool preview that would make the device's id key, and setup openclaw,
// which writes the node's config, are refused while another command
// writes the directory, naming it, and write nothing; with the key there,
// scrub only reads it and goes on; once the directory is free each does
// its work and lets it go.
func TestKeyAndConfigWritersHoldTheDirectory(t *testing.T) {
	ocPath := openClawHome(t, userOpenClaw)
	data := t.TempDir()
	l, err := lockData(data, "pool import", true)
	if err != nil {
		t.Fatal(err)
	}
	held := fmt.Sprintf("data directory %s is in use by 'clawmesh pool import' (pid %d, since ", data, os.Getpid())
	step := `{"schema":"clawmesh.step/v1","id":"st1","session_id":"A","turn":"main","api":"chat.completions","state":"scored","request":{"messages":[{"role":"user","content":"hi"}]}}` + "\n"
	for _, args := range [][]string{
		{"scrub", "--steps", "--data", data},
		{"pool", "preview", "--data", data},
		{"setup", "openclaw", "--data", data, "--openclaw", "none"},
	} {
		_, errs, code := runStdin(t, step, args...)
		if code != 1 || !strings.HasPrefix(errs, "clawmesh "+args[0]+": "+held) || !strings.HasSuffix(errs, ")\nStop it first, or give 'clawmesh "+args[0]+"' another --data.\n") {
			t.Errorf("%q while a pool import runs: code %d, %q; want %q", args, code, errs, held)
		}
	}
	for _, name := range []string{share.KeyFile, "config.toml", setup.RecordFile} {
		if _, err := os.Stat(filepath.Join(data, name)); err == nil {
			t.Errorf("a refused command wrote %s", name)
		}
	}
	if b, _ := os.ReadFile(ocPath); string(b) != userOpenClaw {
		t.Error("the refused setup changed OpenClaw's config")
	}
	l.Release()

	for _, c := range [][]string{
		{"scrub", "--steps", "--data", data},
		{"setup", "openclaw", "--data", data, "--openclaw", "none"},
	} {
		if _, errs, code := runStdin(t, step, c...); code != 0 {
			t.Errorf("%q on a free directory: code %d, %s", c, code, errs)
		}
		if _, err := os.Stat(filepath.Join(data, datadir.HolderFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q left the directory held: %v", c, err)
		}
	}
	for _, name := range []string{share.KeyFile, "config.toml"} {
		if _, err := os.Stat(filepath.Join(data, name)); err != nil {
			t.Errorf("%s not made on a free directory: %v", name, err)
		}
	}

	// The key there: scrub reads it and writes nothing, held or not.
	l, err = lockData(data, "pool import", false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if _, errs, code := runStdin(t, step, "scrub", "--steps", "--data", data); code != 0 {
		t.Errorf("scrub reading the key while a pool import runs: code %d, %s", code, errs)
	}
}

// runStdin runs the CLI as runCLI does, scrub with stdin as its standard
// input.
func runStdin(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	if args[0] != "scrub" {
		return runCLI(t, args...)
	}
	var out, errb bytes.Buffer
	if err := runScrub(context.Background(), args[1:], strings.NewReader(stdin), &out, &errb); err != nil {
		printError(&errb, "scrub", err)
		return out.String(), errb.String(), 1
	}
	return out.String(), errb.String(), 0
}

// TestTrainerChecksPortsBeforeWork: a trainer told to listen on a libp2p
// address (TCP, or UDP for QUIC) or a weights address that another process
// holds is refused in one line naming it and the flag, before it sets
// anything up: its fresh data directory is not made, and an existing one
// is left as it was.
func TestTrainerChecksPortsBeforeWork(t *testing.T) {
	tr := t.TempDir()
	os.Mkdir(filepath.Join(tr, datadir.TrainerMark), 0o700)
	before := treeOf(t, tr)

	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	tcpAddr := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", tcp.Addr().(*net.TCPAddr).Port)
	quicAddr := fmt.Sprintf("/ip4/127.0.0.1/udp/%d/quic-v1", udp.LocalAddr().(*net.UDPAddr).Port)
	for _, c := range []struct {
		args []string
		what string
		flag string
	}{
		{[]string{"--p2p-listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--p2p-listen", tcpAddr, "--weights", "off"}, "the libp2p address " + tcpAddr, "p2p-listen"},
		{[]string{"--p2p-listen", quicAddr, "--weights", "off"}, "the libp2p address " + quicAddr, "p2p-listen"},
		{[]string{"--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--weights", udp.LocalAddr().String()}, "the weights service address " + udp.LocalAddr().String(), "weights"},
	} {
		want := "clawmesh trainer: " + c.what + " is in use by another process (another trainer?)\nStop it, or give 'clawmesh trainer' another --" + c.flag + ".\n"
		fresh := filepath.Join(t.TempDir(), "new")
		for _, data := range []string{fresh, tr} {
			_, errs, code := runBriefly(t, 20*time.Second, append([]string{"trainer", "--data", data, "--no-mdns", "--join-wait", "100ms"}, c.args...)...)
			if code != 1 || errs != want {
				t.Errorf("trainer %q on %s: code %d, %q; want %q", c.args, data, code, errs, want)
			}
		}
		if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("trainer %q made its data directory: %v", c.args, err)
		}
		if after := treeOf(t, tr); !slices.Equal(after, before) {
			t.Errorf("trainer %q changed its data directory: %v, was %v", c.args, after, before)
		}
	}
}

// treeOf lists the files and directories under dir, but for the lock's
// file (LOCK, which stays once a process has taken the lock: it holds no
// state).
func treeOf(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); rel != datadir.LockFile {
			names = append(names, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
