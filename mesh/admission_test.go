package mesh_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/mesh/raftnet"
)

// These tests run real libp2p hosts on loopback. Every wait is bounded and
// polls; none asserts how long anything took.

var loopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// clock is a mesh's clock, set ahead by the test.
type clock struct {
	mu    sync.Mutex
	ahead time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.ahead)
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.ahead += d
	c.mu.Unlock()
}

// node is a running mesh peer.
type node struct {
	m *mesh.Mesh
	h *p2p.Host
}

// startNode runs the peer of data (a mesh clock of now, if not nil) until
// the test ends.
func startNode(t *testing.T, data string, now func() time.Time, bootstrap ...string) *node {
	t.Helper()
	key, _, err := peer.Identity(data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mesh.New(mesh.Config{DataDir: data, Key: key, KeyOf: p2p.PublicKey, Bootstrap: bootstrap,
		AdmitTimeout: time.Minute, RefuseFor: time.Minute, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h, err := p2p.New(ctx, p2p.Options{DataDir: data, Listen: loopback, Gate: m, Open: mesh.OpenProtocols})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := m.Start(ctx, h); err != nil {
		cancel()
		h.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; h.Close() })
	return &node{m: m, h: h}
}

func newMeshDir(t *testing.T, name string) string {
	t.Helper()
	data := t.TempDir()
	key, id, err := peer.Identity(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(data, name, key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	return data
}

func inviteTo(t *testing.T, data string, n *node) string {
	t.Helper()
	key, _, _ := peer.Identity(data)
	tok, err := mesh.Invite(data, key, member.RoleMember, time.Hour, 1, n.h.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func joinDir(t *testing.T, token string) string {
	t.Helper()
	data := t.TempDir()
	if _, err := peer.Join(context.Background(), data, token, loopback, nil); err != nil {
		t.Fatalf("join: %v", err)
	}
	return data
}

func connected(h *p2p.Host, p mesh.PeerID) bool { return slices.Contains(h.Connected(), p) }

// openGate admits everyone: the gate of a host outside any mesh.
type openGate struct{}

func (openGate) Blocked(mesh.PeerID) bool  { return false }
func (openGate) Admitted(mesh.PeerID) bool { return true }

// frame is one message as the mesh's control protocols frame it: its
// length as a uvarint, then the JSON.
func frame(v any) []byte {
	b, _ := json.Marshal(v)
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

// readFrame reads one message: its bytes, and its JSON decoded.
func readFrame(br *bufio.Reader) (raw []byte, msg map[string]any, ok bool) {
	n, err := binary.ReadUvarint(br)
	if err != nil || n > 1<<20 {
		return nil, nil, false
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, nil, false
	}
	json.Unmarshal(b, &msg)
	return append(binary.AppendUvarint(nil, n), b...), msg, true
}

// readFrames reads the messages of r until it ends or fails.
func readFrames(r io.Reader) (raw []byte, msgs []map[string]any) {
	br := bufio.NewReader(r)
	for range 16 {
		b, m, ok := readFrame(br)
		if !ok {
			break
		}
		raw, msgs = append(raw, b...), append(msgs, m)
	}
	return raw, msgs
}

// TestStrangerLearnsNothing: a host with no certificate that connects to a
// member, or shows another member's certificate, learns nothing about the
// mesh from the admit protocol (the member's own exchange shows it only a
// proof it cannot check), nor from the redeem protocol with another mesh's
// token, and is refused the admitted peers' protocols; a device with a
// valid token still joins.
func TestStrangerLearnsNothing(t *testing.T) {
	adminData := newMeshDir(t, "home")
	a := startNode(t, adminData, nil)
	a.m.ServePlugins(pluginSource{})
	bData := joinDir(t, inviteTo(t, adminData, a)) // a device with a token joins
	b := startNode(t, bData, nil, a.h.Addrs()...)
	waitFor(t, "the member admitted", func() bool { return a.m.Admitted(b.m.ID()) && b.m.Admitted(a.m.ID()) })
	st := a.m.State()
	bState := b.m.State()
	secrets := []string{st.MeshID, st.Admin, st.Cert, string(b.m.ID()), bState.Cert, "home"}
	secrets = append(secrets, b.h.Addrs()...)
	for _, addr := range b.h.Addrs() {
		secrets = append(secrets, strings.Split(addr, "/p2p/")[0]) // the address without the id
	}
	leaks := func(what string, raw []byte) {
		t.Helper()
		for _, s := range secrets {
			if s != "" && strings.Contains(string(raw), s) {
				t.Errorf("%s: the stranger got %q: %q", what, s, raw)
			}
		}
	}

	s, err := p2p.New(context.Background(), p2p.Options{DataDir: t.TempDir(), Listen: loopback, Gate: openGate{}, Open: mesh.OpenProtocols})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// What the member says in the exchange it opens when the stranger
	// connects: the stranger answers with an empty hello, and records it.
	var (
		mu        sync.Mutex
		toldRaw   []byte
		toldMsgs  []map[string]any
		toldCount int
	)
	s.Handle(mesh.ProtoAdmit, func(st mesh.Stream) {
		defer st.Close()
		st.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(st)
		var raw []byte
		var msgs []map[string]any
		for range 4 {
			b, m, ok := readFrame(br)
			if !ok {
				break
			}
			raw, msgs = append(raw, b...), append(msgs, m)
			st.Write(frame(struct{}{})) // an empty hello: it knows nothing
		}
		mu.Lock()
		toldRaw, toldMsgs = append(toldRaw, raw...), append(toldMsgs, msgs...)
		toldCount++
		mu.Unlock()
	})
	if _, err := s.Connect(context.Background(), a.h.Addrs()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the member's own exchange with the stranger", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return toldCount > 0
	})
	mu.Lock()
	leaks("the member's exchange", toldRaw)
	for _, m := range toldMsgs {
		for k := range m {
			if k != "proof" {
				t.Errorf("the member's exchange told the stranger its %s: %v", k, m)
			}
		}
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ask := func(proto string, msg any) []byte {
		t.Helper()
		st, err := s.NewStream(ctx, a.m.ID(), proto)
		if err != nil {
			return nil // refused outright: nothing learnt
		}
		defer st.Close()
		st.SetDeadline(time.Now().Add(10 * time.Second))
		st.Write(frame(msg))
		st.CloseWrite()
		raw, msgs := readFrames(st)
		if proto == mesh.ProtoAdmit && (len(msgs) != 1 || len(msgs[0]) != 0) {
			t.Errorf("the admit protocol answered a stranger's %v with %q, not one empty hello", msg, raw)
		}
		return raw
	}
	// A stranger's hello, empty, and ones showing another member's
	// certificate (certificates travel: anyone may have seen one), as the
	// first message of the protocol before proofs.
	leaks("an empty hello", ask(mesh.ProtoAdmit, map[string]any{}))
	leaks("a hello with another's certificate", ask(mesh.ProtoAdmit, map[string]any{"cert": bState.Cert}))
	leaks("a hello with another's certificate and addresses", ask(mesh.ProtoAdmit, map[string]any{"cert": bState.Cert, "addrs": s.Addrs()}))
	// A token of another mesh, redeemed with this one's member.
	otherData := newMeshDir(t, "other")
	okey, _, _ := peer.Identity(otherData)
	foreign, err := mesh.Invite(otherData, okey, member.RoleMember, time.Hour, 1, a.h.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw := ask(mesh.ProtoRedeem, map[string]string{"token": foreign.String()})
	if !strings.Contains(string(raw), "another mesh") {
		t.Errorf("the refusal of another mesh's token does not say so: %q", raw)
	}
	leaks("a token of another mesh", raw)
	// The admitted peers' protocols answer nothing.
	for _, proto := range []string{mesh.ProtoRenew, mesh.ProtoPull, mesh.ProtoPlugin, raftnet.Protocol} {
		if raw := ask(proto, map[string]string{"hash": strings.Repeat("ab", 32), "id": strings.Repeat("ab", 32)}); len(raw) > 0 {
			t.Errorf("%s answered a stranger: %q", proto, raw)
		}
	}
	if a.m.Admitted(s.ID()) || len(a.m.Peers()) != 1 {
		t.Errorf("a stranger admitted: %v", a.m.Peers())
	}
}

type pluginSource struct{}

func (pluginSource) Plugin(context.Context, string) ([]byte, error) { return []byte("module"), nil }

// TestExpiredCertificateDropped: once an admitted peer's certificate
// expires it is no longer admitted, at once and with no exchange run again,
// and it is disconnected.
func TestExpiredCertificateDropped(t *testing.T) {
	adminData := newMeshDir(t, "home")
	var clk clock
	a := startNode(t, adminData, clk.Now)
	bData := joinDir(t, inviteTo(t, adminData, a))
	b := startNode(t, bData, nil, a.h.Addrs()...)
	bID := b.m.ID()
	waitFor(t, "the member admitted", func() bool { return a.m.Admitted(bID) && b.m.Admitted(a.m.ID()) })
	cert := b.m.Cert()

	clk.Add(time.Until(cert.Expires()) + time.Minute)
	if a.m.Admitted(bID) {
		t.Error("a peer whose certificate expired is still admitted")
	}
	if _, ok := a.m.Peer(bID); ok {
		t.Error("a peer whose certificate expired is still listed")
	}
	waitFor(t, "the peer whose certificate expired disconnected", func() bool { return !connected(a.h, bID) })
	if a.m.Admitted(bID) {
		t.Error("admitted after its disconnection")
	}
}

// TestRevokedDeviceRejoining: a device that was revoked, and told so,
// that tries to join again under its peer id (from a fresh data directory
// with its old identity, or from its own) is told that it was removed, by
// whom, and what to do, in one line: not that the inviter is
// unreachable. A new device still joins.
func TestRevokedDeviceRejoining(t *testing.T) {
	ctx := context.Background()
	adminData := newMeshDir(t, "home")
	a := startNode(t, adminData, nil)
	bData := joinDir(t, inviteTo(t, adminData, a))
	b := startNode(t, bData, nil, a.h.Addrs()...)
	bID := b.m.ID()
	waitFor(t, "the member admitted", func() bool { return a.m.Admitted(bID) })
	if _, err := a.m.Revoke(ctx, bID, mesh.RevokeOptions{Reason: "sold"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the revoked device told and refused", func() bool {
		return b.m.Revoked() != nil && a.m.Blocked(bID) && !connected(a.h, bID)
	})

	check := func(what string, err error) {
		t.Helper()
		var removed *mesh.RemovedError
		if !errors.As(err, &removed) || !errors.Is(err, member.ErrRevoked) {
			t.Fatalf("%s: %v, want a *mesh.RemovedError", what, err)
		}
		msg := err.Error()
		for _, want := range []string{string(bID), "removed from the mesh", "by the mesh admin", "sold", "new identity", "fresh data directory", "new invite"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: %q does not say %q", what, msg, want)
			}
		}
		if strings.Contains(msg, "\n") || strings.Contains(msg, "reach") {
			t.Errorf("%s: %q", what, msg)
		}
		if !removed.NewIdentity() {
			t.Errorf("%s: a peer id the admin removed can come back", what)
		}
	}
	// Under its old identity, from a fresh data directory.
	again := t.TempDir()
	id, err := os.ReadFile(filepath.Join(bData, p2p.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(again, p2p.IdentityFile), id, 0o600)
	_, err = peer.Join(ctx, again, inviteTo(t, adminData, a), loopback, nil)
	check("joining again under the old peer id", err)
	// From its own data directory, which knows it was removed.
	if removed := mesh.Removed(bData); removed == nil {
		t.Error("its data directory does not say it was removed")
	} else {
		check("its data directory", removed)
	}
	_, err = mesh.Join(ctx, nil, bData, inviteTo(t, adminData, a), time.Now())
	check("joining again from its data directory", err)
	// A new device joins.
	if _, err := peer.Join(ctx, t.TempDir(), inviteTo(t, adminData, a), loopback, nil); err != nil {
		t.Errorf("a new device joining: %v", err)
	}
	if mesh.Removed(adminData) != nil {
		t.Error("the admin's data directory says it was removed")
	}
}
