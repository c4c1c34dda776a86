package peer_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// memPlugins is a PluginSource in memory; lie maps a hash to other bytes
// than its own.
type memPlugins struct {
	mu    sync.Mutex
	mods  map[string][]byte
	asked int
}

func (s *memPlugins) Plugin(ctx context.Context, hash string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked++
	b, ok := s.mods[hash]
	if !ok {
		return nil, fmt.Errorf("%w: %s", mesh.ErrNoPlugin, hash)
	}
	return b, nil
}

func (s *memPlugins) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestFetchPlugin: an admitted peer fetches a plugin module by hash over
// loopback libp2p; a module the source lacks, bytes that do not match the
// hash (from the source, or from a peer that lies), a module over the
// asker's limit and a malformed hash are each refused with their own
// error; a host without a certificate gets nothing.
func TestFetchPlugin(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	tr := start(t, join(t, invite(t, adminData, a, member.RoleTrainer, 1)), a.Host.Addrs()...)
	liar := start(t, join(t, invite(t, adminData, a, member.RoleMember, 1)), a.Host.Addrs()...)
	waitFor(t, "everyone admitted", func() bool { return admitted(a, tr) && admitted(liar, tr) })

	hint, err := builtin.Module("hint")
	if err != nil {
		t.Fatal(err)
	}
	other := []byte("\x00asm not the module asked for")
	src := &memPlugins{mods: map[string][]byte{sha(hint): hint, sha([]byte("x")): other}}
	a.Mesh.ServePlugins(src)
	// The liar answers a request with bytes of another module, or, asked
	// for the hash of "stall", promises bytes and sends none.
	stall := sha([]byte("stall"))
	liar.Host.Handle(mesh.ProtoPlugin, func(s mesh.Stream) {
		defer s.Close()
		br := bufio.NewReader(s)
		n, _ := binary.ReadUvarint(br)
		var req struct{ Hash string }
		b := make([]byte, min(n, 1024))
		io.ReadFull(br, b)
		json.Unmarshal(b, &req)
		rep, _ := json.Marshal(map[string]any{"status": "ok", "size": len(other)})
		s.Write(append(binary.AppendUvarint(nil, uint64(len(rep))), rep...))
		if req.Hash == stall {
			s.SetReadDeadline(time.Now().Add(20 * time.Second))
			io.Copy(io.Discard, s) // until the asker gives up
			return
		}
		s.Write(other)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := tr.Mesh.FetchPlugin(ctx, a.Mesh.ID(), sha(hint), 0)
	if err != nil || !bytes.Equal(got, hint) {
		t.Fatalf("fetch: %d bytes, %v", len(got), err)
	}
	cases := []struct {
		name string
		from mesh.PeerID
		hash string
		max  int64
		want error
	}{
		{"unknown hash", a.Mesh.ID(), sha([]byte("none")), 0, mesh.ErrNoPlugin},
		{"the source's bytes do not match", a.Mesh.ID(), sha([]byte("x")), 0, mesh.ErrNoPlugin},
		{"a peer sends other bytes", liar.Mesh.ID(), sha(hint), 0, mesh.ErrPluginHash},
		{"over the asker's limit", a.Mesh.ID(), sha(hint), int64(len(hint) - 1), mesh.ErrPluginTooLarge},
		{"not a hash", a.Mesh.ID(), "ABC", 0, mesh.ErrMessage},
		{"a peer stalls", liar.Mesh.ID(), stall, 0, mesh.ErrStalled}, // after Stall, 2 s
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := tr.Mesh.FetchPlugin(ctx, c.from, c.hash, c.max)
			if !errors.Is(err, c.want) || b != nil {
				t.Fatalf("%d bytes, %v; want %v", len(b), err, c.want)
			}
		})
	}

	// A host without a certificate may open no stream of the protocol.
	y, err := p2p.New(context.Background(), p2p.Options{DataDir: t.TempDir(), Listen: loopback, Gate: openGate{}, Open: mesh.OpenProtocols})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	if _, err := y.Connect(ctx, a.Host.Addrs()); err != nil {
		t.Fatal(err)
	}
	before := src.count()
	if s, err := y.NewStream(ctx, a.Mesh.ID(), mesh.ProtoPlugin); err == nil {
		req, _ := json.Marshal(map[string]string{"hash": sha(hint)})
		s.Write(append(binary.AppendUvarint(nil, uint64(len(req))), req...))
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := s.Read(make([]byte, 1)); err == nil || n > 0 {
			t.Error("a host without a certificate got an answer")
		}
		s.Close()
	}
	if src.count() != before {
		t.Error("the source was asked for a host without a certificate")
	}
}
