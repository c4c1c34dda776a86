package weights

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// The child half of TestFetchResumesAfterKill: it fetches the bundle the
// parent serves and dies (exit, no clean-up) once 4 chunks are on disk.
func TestFetchKilledChild(t *testing.T) {
	dir := os.Getenv("CLAWMESH_FETCH_DIR")
	if dir == "" {
		t.Skip("run by TestFetchResumesAfterKill")
	}
	b, err := os.ReadFile(filepath.Join(dir, "manifest"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := chunks.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	me := newTestPeer(t)
	f := newFetcher(t, me, FetcherConfig{Streams: 1, PerRequest: 1})
	src := Source{Peer: mesh.PeerID(os.Getenv("CLAWMESH_FETCH_PEER")), Addrs: []string{os.Getenv("CLAWMESH_FETCH_ADDR")}}
	f.Fetch(context.Background(), m, []Source{src}, filepath.Join(dir, "bundle"), func(p Progress) {
		if p.Bytes >= 4*chunks.ChunkSize {
			os.Exit(3)
		}
	})
	os.Exit(4)
}

// TestFetchResumesAfterKill kills a process in the middle of a fetch and
// checks that the next fetch keeps what it had verified and fetches only
// the rest.
func TestFetchResumesAfterKill(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 10*chunks.ChunkSize+99)
	m := w.manifest(t, b, 1, 1, 10)
	h := &holding{m: m, b: b}
	p := newTestPeer(t)
	s, err := Listen("127.0.0.1:0", ServerConfig{Key: p.key, Gate: admitAll{}, Holdings: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "manifest"), m.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFetchKilledChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CLAWMESH_FETCH_DIR="+dir, "CLAWMESH_FETCH_PEER="+string(p.id), "CLAWMESH_FETCH_ADDR="+s.Addr().String())
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("the child was not killed mid-fetch: %v\n%s", err, out)
	}
	before := h.reads.Load()

	var first *Progress
	f := newFetcher(t, newTestPeer(t), FetcherConfig{})
	src := Source{Peer: p.id, Addrs: []string{s.Addr().String()}}
	if err := f.Fetch(context.Background(), m, []Source{src}, filepath.Join(dir, "bundle"), func(p Progress) {
		if first == nil {
			first = &p
		}
	}); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, filepath.Join(dir, "bundle"), b)
	again := h.reads.Load() - before
	if first == nil || first.Resumed < 4*chunks.ChunkSize || again != int64(len(b))-first.Resumed {
		t.Fatalf("resumed %+v after the kill, then fetched %d bytes of %d", first, again, len(b))
	}
}
