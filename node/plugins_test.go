package node_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// TestNodeServesPlugins: a node in a mesh serves the modules of its reward
// plugins by hash to an admitted trainer over loopback libp2p (a plugin
// loaded from a file as well as a built-in), and refuses a hash it does
// not know.
func TestNodeServesPlugins(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loopback := []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}
	data := t.TempDir()
	key, id, err := peer.Identity(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(data, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	hint, _ := builtin.Module("hint")
	file := filepath.Join(t.TempDir(), "tool.wasm")
	tool, _ := builtin.Module("toolerror")
	if err := os.WriteFile(file, tool, 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(ctx, node.Config{
		DataDir: data, Upstream: "http://127.0.0.1:9/v1",
		Plugins: []reward.PluginConfig{{Builtin: "hint", Enabled: true}, {Name: "tool", Path: file, Enabled: true}},
		Mesh:    &node.MeshConfig{Listen: loopback},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { n.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; n.Close(context.Background()) })

	tok, err := mesh.Invite(data, key, member.RoleTrainer, time.Hour, 1, n.Peer().Host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	trData := t.TempDir()
	if _, err := peer.Join(ctx, trData, tok.String(), loopback, nil); err != nil {
		t.Fatal(err)
	}
	// A trainer's directory is refused to a node, by its certificate,
	// before the node writes anything there.
	if _, err := node.New(ctx, node.Config{DataDir: trData, Upstream: "http://127.0.0.1:9/v1", NoScoring: true}); !errors.Is(err, datadir.ErrKind) || !strings.Contains(err.Error(), "its mesh certificate is a trainer's") {
		t.Errorf("a node on a trainer's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(trData, datadir.NodeMark)); err == nil {
		t.Error("the refused node made a pool in the trainer's directory")
	}
	tr, err := peer.Start(ctx, peer.Options{DataDir: trData, Listen: loopback, Bootstrap: n.Peer().Host.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	trDone := make(chan struct{})
	go func() { tr.Run(ctx); close(trDone) }()
	t.Cleanup(func() { cancel(); <-trDone; tr.Close() })
	for deadline := time.Now().Add(20 * time.Second); !tr.Mesh.Admitted(n.Peer().Mesh.ID()) || !n.Peer().Mesh.Admitted(tr.Mesh.ID()); {
		if time.Now().After(deadline) {
			t.Fatal("the trainer and the node did not admit each other in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A node serves its modules once its runner has them: at a first start
	// it compiles them first (seconds; longer on a busy machine), and a
	// fetch made before then waits for them and may stall out (the
	// fetcher tries again later).
	for deadline := time.Now().Add(3 * time.Minute); !n.Scorer().Ready; {
		if time.Now().After(deadline) {
			t.Fatal("the node's plugins were not compiled in 3 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	defer fcancel()
	for _, want := range [][]byte{hint, tool} {
		got, err := tr.Mesh.FetchPlugin(fctx, n.Peer().Mesh.ID(), sha(want), 0)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("fetch %s: %d bytes, %v", sha(want)[:12], len(got), err)
		}
	}
	if _, err := tr.Mesh.FetchPlugin(fctx, n.Peer().Mesh.ID(), sha([]byte("no such module")), 0); !errors.Is(err, mesh.ErrNoPlugin) {
		t.Fatalf("an unknown hash: %v", err)
	}
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestPluginCacheLocation: by default the plugins' compilation cache is in
// the user's cache directory, shared by the nodes of the machine; the one
// an earlier version left in the data directory is removed once the new
// one is in use. Without a cache directory, the data directory holds it.
func TestPluginCacheLocation(t *testing.T) {
	ctx := context.Background()
	start := func(t *testing.T, data string) {
		t.Helper()
		n, err := node.New(ctx, node.Config{DataDir: data, Upstream: "http://127.0.0.1:9/v1",
			Plugins: []reward.PluginConfig{{Builtin: "hint", Enabled: true}}})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close(ctx)
		if err := n.PluginsReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	nonEmpty := func(dir string) bool {
		entries, err := os.ReadDir(dir)
		return err == nil && len(entries) > 0
	}
	t.Run("user cache dir", func(t *testing.T) {
		home := t.TempDir()
		t.Setenv("XDG_CACHE_HOME", filepath.Join(home, "cache"))
		data := t.TempDir()
		old := filepath.Join(data, "cache", "wazero")
		if err := os.MkdirAll(filepath.Join(old, "wazero-v0-old"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(old, "wazero-v0-old", "x"), make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		start(t, data)
		if shared := filepath.Join(home, "cache", "clawmesh", "wazero"); !nonEmpty(shared) {
			t.Errorf("nothing compiled into %s", shared)
		}
		if _, err := os.Stat(filepath.Join(data, "cache")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the old cache in the data directory is still there: %v", err)
		}
		// A second node on the machine finds the cache filled.
		start(t, t.TempDir())
	})
	t.Run("no cache dir", func(t *testing.T) {
		t.Setenv("XDG_CACHE_HOME", "")
		t.Setenv("HOME", "")
		data := t.TempDir()
		start(t, data)
		if !nonEmpty(filepath.Join(data, "cache", "wazero")) {
			t.Error("without a user cache directory, nothing compiled into the data directory's cache/wazero")
		}
	})
}
