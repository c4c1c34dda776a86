package peer_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/trainer/store"
)

var loopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// waitFor polls cond until it holds or 20 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// start runs the peer of data until the test ends.
func start(t *testing.T, data string, bootstrap ...string) *peer.Peer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: data, Listen: loopback, Bootstrap: bootstrap, AdmitTimeout: 3 * time.Second, RefuseFor: time.Minute, Stall: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
	return p
}

// newMesh makes a mesh whose admin's device is a fresh data dir.
func newMesh(t *testing.T, name string) string {
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

func invite(t *testing.T, data string, p *peer.Peer, role member.Role, uses int) string {
	t.Helper()
	key, _, _ := peer.Identity(data)
	tok, err := mesh.Invite(data, key, role, time.Hour, uses, p.Host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func join(t *testing.T, token string) string {
	t.Helper()
	data := t.TempDir()
	if _, err := peer.Join(context.Background(), data, token, loopback, nil); err != nil {
		t.Fatalf("join: %v", err)
	}
	return data
}

func admitted(a, b *peer.Peer) bool {
	return a.Mesh.Admitted(b.Mesh.ID()) && b.Mesh.Admitted(a.Mesh.ID())
}

// TestInviteJoinAdmit: a mesh made, a member and a trainer invited and
// joined, each admitted by the others; a stranger gets nothing; every
// refusal of a token says which it is.
func TestInviteJoinAdmit(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	if c := a.Mesh.Cert(); c.Role() != member.RoleMember || !c.MayInvite() || !a.Mesh.IsAdmin() {
		t.Fatalf("the admin's certificate: %v", a.Mesh.Cert())
	}
	memberTok := invite(t, adminData, a, member.RoleMember, 1)
	bData := join(t, memberTok)
	trainerTok := invite(t, adminData, a, member.RoleTrainer, 2)
	tData := join(t, trainerTok)

	b := start(t, bData)
	tr := start(t, tData)
	waitFor(t, "the member and the admin to admit each other", func() bool { return admitted(a, b) })
	waitFor(t, "the trainer and the admin to admit each other", func() bool { return admitted(a, tr) })
	if pe, _ := a.Mesh.Peer(tr.Mesh.ID()); pe.Cert.Role() != member.RoleTrainer {
		t.Errorf("the trainer's role: %v", pe.Cert.Role())
	}
	if b.Mesh.MeshID() != a.Mesh.MeshID() || b.Mesh.State().Name != "home" {
		t.Errorf("member's mesh %s %q", b.Mesh.MeshID(), b.Mesh.State().Name)
	}

	// Refusals.
	ctx := context.Background()
	_, err := peer.Join(ctx, t.TempDir(), memberTok, loopback, nil)
	var refused *mesh.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "already redeemed") {
		t.Errorf("a replayed token: %v", err)
	}
	// The trainer token had two uses: one left.
	if _, err := peer.Join(ctx, t.TempDir(), trainerTok, loopback, nil); err != nil {
		t.Errorf("the second use of a two-use token: %v", err)
	}
	if _, err := peer.Join(ctx, t.TempDir(), trainerTok, loopback, nil); err == nil || !strings.Contains(err.Error(), "already redeemed") {
		t.Errorf("a third use: %v", err)
	}
	key, _, _ := peer.Identity(adminData)
	old, err := mesh.Invite(adminData, key, member.RoleMember, time.Hour, 1, a.Host.Addrs(), time.Now().Add(-2*time.Hour), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Join(ctx, t.TempDir(), old.String(), loopback, nil); !errors.Is(err, member.ErrExpired) {
		t.Errorf("an expired token: %v", err)
	}
	bad := []byte(invite(t, adminData, a, member.RoleMember, 1))
	bad[len(bad)-5] ^= 1
	if _, err := peer.Join(ctx, t.TempDir(), string(bad), loopback, nil); !errors.Is(err, member.ErrTampered) {
		t.Errorf("a tampered token: %v", err)
	}
	// A token of another mesh that names this mesh's admin device as the
	// inviter: the admin refuses it.
	otherAdmin, err := member.NewKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := member.NewToken(otherAdmin, nil, member.TokenSpec{Inviter: string(a.Mesh.ID()), Addrs: a.Host.Addrs(), TTL: time.Hour}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Join(ctx, t.TempDir(), foreign.String(), loopback, nil); !errors.As(err, &refused) || !strings.Contains(err.Error(), "another mesh") {
		t.Errorf("another mesh's token: %v", err)
	}
	// A token whose address leads to another peer than its inviter.
	otherData := newMesh(t, "other")
	okey, _, _ := peer.Identity(otherData)
	astray, err := mesh.Invite(otherData, okey, member.RoleMember, time.Hour, 1, a.Host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Join(ctx, t.TempDir(), astray.String(), loopback, nil); !errors.Is(err, member.ErrTampered) || !strings.Contains(err.Error(), "not the inviter") {
		t.Errorf("a token whose address is another peer's: %v", err)
	}
	// A revoked peer cannot come back with a new token.
	if _, err := a.Mesh.Revoke(ctx, b.Mesh.ID(), mesh.RevokeOptions{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	again := t.TempDir()
	id, err := os.ReadFile(filepath.Join(bData, p2p.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(again, p2p.IdentityFile), id, 0o600)
	_, err = peer.Join(ctx, again, invite(t, adminData, a, member.RoleMember, 1), loopback, nil)
	if !errors.Is(err, mesh.ErrUnreachable) && !strings.Contains(fmt.Sprint(err), "removed") {
		t.Errorf("a revoked peer joining again: %v", err)
	}
	if _, err := peer.Join(ctx, bData, invite(t, adminData, a, member.RoleMember, 1), loopback, nil); !errors.Is(err, mesh.ErrJoined) {
		t.Errorf("joining twice: %v", err)
	}
	// The inviter offline.
	gone, err := mesh.Invite(adminData, key, member.RoleMember, time.Hour, 1, []string{"/ip4/127.0.0.1/tcp/9/p2p/" + string(a.Mesh.ID())}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Join(ctx, t.TempDir(), gone.String(), loopback, nil); !errors.Is(err, mesh.ErrUnreachable) || !strings.Contains(err.Error(), "online") {
		t.Errorf("an unreachable inviter: %v", err)
	}
}

// TestStranger: a peer of another mesh, or a host with no certificate,
// may open the redeem protocol but nothing else, gets no gossip, and is
// disconnected (the host without a certificate refused for a while once
// the admission time is up).
func TestStranger(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	tData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	tr := start(t, tData, a.Host.Addrs()...)
	waitFor(t, "the trainer admitted", func() bool { return admitted(a, tr) })
	payload, id := testBatch(t, 1, "for trainers only")
	out := &memOutbox{payloads: map[core.BatchID][]byte{id: payload}, shipped: map[core.BatchID]int{}}
	runShip(t, a, out)

	connected := func(h interface{ Connected() []mesh.PeerID }, p mesh.PeerID) bool {
		for _, c := range h.Connected() {
			if c == p {
				return true
			}
		}
		return false
	}

	// A member of another mesh dials the admin.
	otherData := newMesh(t, "other")
	x := start(t, otherData)
	if _, err := x.Host.Connect(context.Background(), a.Host.Addrs()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s, err := x.Host.NewStream(ctx, a.Mesh.ID(), mesh.ProtoPull); err == nil {
		s.Close()
		t.Error("a peer of another mesh opened the pull protocol")
	}
	waitFor(t, "the other mesh's peer disconnected", func() bool { return !connected(a.Host, x.Mesh.ID()) })
	if a.Mesh.Admitted(x.Mesh.ID()) {
		t.Error("a peer of another mesh was admitted")
	}

	// A host with no certificate at all, listening to the batch topic.
	y, err := p2p.New(context.Background(), p2p.Options{DataDir: t.TempDir(), Listen: loopback, Gate: openGate{}, Open: mesh.OpenProtocols})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	topic, err := y.Join(mesh.TopicName(a.Mesh.MeshID(), "batches/1"))
	if err != nil {
		t.Fatal(err)
	}
	defer topic.Close()
	if _, err := y.Connect(context.Background(), a.Host.Addrs()); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{mesh.ProtoRenew, mesh.ProtoPull} {
		if s, err := y.NewStream(ctx, a.Mesh.ID(), proto); err == nil {
			// The stream may open; the peer resets it before any handler
			// sees it.
			s.Write([]byte{2, '{', '}'})
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := s.Read(make([]byte, 1)); err == nil || n > 0 {
				t.Errorf("a host without a certificate got an answer on %s", proto)
			}
			s.Close()
		}
	}
	gctx, gcancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	if msg, err := topic.Next(gctx); err == nil {
		t.Errorf("a host without a certificate got gossip: %q", msg.Data)
	}
	gcancel()
	waitFor(t, "the host without a certificate refused", func() bool { return a.Mesh.Blocked(y.ID()) && !connected(a.Host, y.ID()) })
	if _, err := y.Connect(ctx, a.Host.Addrs()); err == nil {
		time.Sleep(300 * time.Millisecond)
		if connected(a.Host, y.ID()) {
			t.Error("a refused host is connected again")
		}
	}
}

// openGate admits everyone: the gate of a host outside any mesh.
type openGate struct{}

func (openGate) Blocked(mesh.PeerID) bool  { return false }
func (openGate) Admitted(mesh.PeerID) bool { return true }

// memOutbox is a node's outbox in memory: sealed batches, and the acks
// that shipped them.
type memOutbox struct {
	mu       sync.Mutex
	payloads map[core.BatchID][]byte
	shipped  map[core.BatchID]int
	// block, if set, stalls serving after the first half of a batch until
	// it is closed.
	block chan struct{}
}

func (o *memOutbox) Payload(ctx context.Context, id core.BatchID) ([]byte, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, ok := o.payloads[id]
	if !ok {
		return nil, mesh.ErrNoBatch
	}
	return b, nil
}

func (o *memOutbox) Unshipped(ctx context.Context) ([]core.BatchID, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []core.BatchID
	for id := range o.payloads {
		if o.shipped[id] == 0 {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (o *memOutbox) Shipped(ctx context.Context, id core.BatchID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.shipped[id]++
	return nil
}

func (o *memOutbox) count(id core.BatchID) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.shipped[id]
}

func testBatch(t *testing.T, n int, text string) ([]byte, core.BatchID) {
	t.Helper()
	var steps []*core.Step
	for i := 0; i < n; i++ {
		v := 1.0
		steps = append(steps, &core.Step{
			ID: core.StepID(fmt.Sprintf("%s-%d", text, i)), SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: core.StateBatched,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprintf("%s %d", text, i)}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
			Reward:   &core.Reward{Value: &v, Scores: []core.Score{}},
		})
	}
	b, err := batch.Encode(batch.Meta{Created: time.Now().UTC().Truncate(time.Hour)}, steps)
	if err != nil {
		t.Fatal(err)
	}
	return b, batch.ID(b)
}

func runShip(t *testing.T, p *peer.Peer, out mesh.Outbox) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		p.Mesh.Ship(ctx, out, mesh.ShipOptions{Retry: 300 * time.Millisecond, MaxRetry: time.Second, Poll: 50 * time.Millisecond})
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func runCollect(t *testing.T, p *peer.Peer, st *store.Store) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Mesh.Collect(ctx, st, mesh.PullOptions{}) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestBatchesReachTrainer: a batch a member announces reaches the trainer,
// verified and stored; its ack ships it, once; a revoked member's batches
// are not pulled.
func TestBatchesReachTrainer(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	tData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	b := start(t, bData)
	tr := start(t, tData)
	waitFor(t, "the member and the trainer admitted", func() bool { return admitted(a, b) && admitted(a, tr) })
	// The member and the trainer know only the admin's address; they find
	// each other through it.
	waitFor(t, "the member and the trainer to find and admit each other", func() bool { return admitted(b, tr) })

	st, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	runCollect(t, tr, st)
	payload, id := testBatch(t, 3, "hello")
	out := &memOutbox{payloads: map[core.BatchID][]byte{id: payload}, shipped: map[core.BatchID]int{}}
	runShip(t, b, out)
	waitFor(t, "the batch shipped", func() bool { return out.count(id) > 0 })
	got, err := st.Batch(context.Background(), id)
	if err != nil || len(got.Steps) != 3 || got.Steps[2].Request.Messages[0].Content != "hello 2" {
		t.Fatalf("the stored batch: %v, %v", got, err)
	}
	time.Sleep(time.Second) // several re-announcement periods
	if n := out.count(id); n != 1 {
		t.Errorf("shipped %d times", n)
	}

	// A member cannot pull.
	if err := b.Mesh.Collect(context.Background(), st, mesh.PullOptions{}); !errors.Is(err, member.ErrNotAllowed) {
		t.Errorf("a member collecting: %v", err)
	}

	// Revoke the member: it is disconnected everywhere, and its later
	// batches are not pulled.
	if _, err := a.Mesh.Revoke(context.Background(), b.Mesh.ID(), mesh.RevokeOptions{Reason: "lost device"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the trainer to drop the revoked member", func() bool { return !tr.Mesh.Admitted(b.Mesh.ID()) && tr.Mesh.Blocked(b.Mesh.ID()) })
	later, lid := testBatch(t, 2, "after")
	out.mu.Lock()
	out.payloads[lid] = later
	out.mu.Unlock()
	time.Sleep(2 * time.Second)
	if has, _ := st.Has(context.Background(), lid); has {
		t.Error("the trainer pulled a revoked member's batch")
	}
}

// TestTrainerRestartsMidPull: a trainer stopped in the middle of a pull
// gets the batch after it restarts, and the node ships it exactly once.
func TestTrainerRestartsMidPull(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	tData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	payload, id := testBatch(t, 400, "a long batch of steps")
	stalled := make(chan struct{})
	out := &memOutbox{payloads: map[core.BatchID][]byte{id: payload}, shipped: map[core.BatchID]int{}}
	slow := &stallingOutbox{memOutbox: out, stalled: stalled, free: make(chan struct{})}
	runShip(t, a, slow)

	ctx, cancel := context.WithCancel(context.Background())
	tr, err := peer.Start(ctx, peer.Options{DataDir: tData, Listen: loopback, Stall: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go tr.Run(ctx)
	st, err := store.Open(tData+"/batches", nil)
	if err != nil {
		t.Fatal(err)
	}
	collected := make(chan error, 1)
	go func() { collected <- tr.Mesh.Collect(ctx, st, mesh.PullOptions{}) }()
	select {
	case <-stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("the pull never started")
	}
	// Kill the trainer mid-pull.
	cancel()
	tr.Close()
	<-collected
	st.Close()
	if out.count(id) != 0 {
		t.Fatal("shipped before any trainer stored it")
	}
	slow.release()

	tr2 := start(t, tData)
	st2, err := store.Open(tData+"/batches", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	runCollect(t, tr2, st2)
	waitFor(t, "the batch shipped after the restart", func() bool { return out.count(id) > 0 })
	if has, _ := st2.Has(context.Background(), id); !has {
		t.Fatal("shipped, but not stored")
	}
	time.Sleep(time.Second)
	if n := out.count(id); n != 1 {
		t.Errorf("shipped %d times", n)
	}
}

// stallingOutbox serves the first pull of each batch only in part, then
// stalls until released.
type stallingOutbox struct {
	*memOutbox
	stalled chan struct{}
	once    sync.Once
	free    chan struct{}
}

func (s *stallingOutbox) OpenPayload(ctx context.Context, id core.BatchID) (io.ReadCloser, int64, error) {
	b, err := s.memOutbox.Payload(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	select {
	case <-s.free:
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	default:
	}
	half := len(b) / 2
	return io.NopCloser(io.MultiReader(bytes.NewReader(b[:half]), &stallReader{s: s, rest: b[half:]})), int64(len(b)), nil
}

type stallReader struct {
	s    *stallingOutbox
	rest []byte
	r    io.Reader
}

func (r *stallReader) Read(p []byte) (int, error) {
	if r.r == nil {
		r.s.once.Do(func() { close(r.s.stalled) })
		select {
		case <-r.s.free:
		case <-time.After(30 * time.Second):
		}
		r.r = bytes.NewReader(r.rest)
	}
	return r.r.Read(p)
}

func (s *stallingOutbox) release() { close(s.free) }

// TestCertificateRenewal: a certificate is renewed by the admin's device
// before it expires, while the peer is online.
func TestCertificateRenewal(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	// Give the member a certificate that lives six seconds.
	adminKey, err := mesh.LoadAdminKey(adminData)
	if err != nil {
		t.Fatal(err)
	}
	bKey, bID, _ := peer.Identity(bData)
	short, err := member.IssueCertificate(adminKey, nil, member.CertSpec{Subject: string(bID), SubjectKey: bKey.Public().(ed25519.PublicKey), TTL: 6 * time.Second}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := mesh.LoadState(bData)
	st.Cert = hex.EncodeToString(short.Marshal())
	if err := mesh.SaveState(bData, st); err != nil {
		t.Fatal(err)
	}
	b := start(t, bData)
	waitFor(t, "the member admitted", func() bool { return admitted(a, b) })
	waitFor(t, "the certificate renewed", func() bool { return b.Mesh.Cert().Expires().After(short.Expires()) })
	time.Sleep(time.Until(short.Expires()) + time.Second)
	if !admitted(a, b) {
		t.Error("the member is not admitted after its first certificate expired")
	}
	if saved, _ := mesh.LoadState(bData); saved.Cert == st.Cert {
		t.Error("the renewed certificate was not saved")
	}
}

// TestMalformedMessages: junk on a protocol or on gossip costs its sender
// the stream and nothing else: the peers go on serving.
func TestMalformedMessages(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	tData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	b := start(t, bData)
	tr := start(t, tData)
	waitFor(t, "everyone admitted", func() bool { return admitted(a, b) && admitted(a, tr) && admitted(b, tr) })
	ctx := context.Background()
	st, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	runCollect(t, tr, st)
	out := &memOutbox{payloads: map[core.BatchID][]byte{}, shipped: map[core.BatchID]int{}}
	runShip(t, b, out)
	waitFor(t, "the member serving pulls", func() bool {
		s, err := tr.Host.NewStream(ctx, b.Mesh.ID(), mesh.ProtoPull)
		if err == nil {
			s.Close()
		}
		return err == nil
	})
	for _, proto := range []string{mesh.ProtoPull, mesh.ProtoAdmit, mesh.ProtoRenew, mesh.ProtoRedeem} {
		for _, junk := range [][]byte{{0xff, 0xff, 0xff, 0xff, 0x0f}, append([]byte{20}, "not json at all....."...), {3, '{', '}', '}'}} {
			s, err := tr.Host.NewStream(ctx, b.Mesh.ID(), proto)
			if err != nil {
				t.Fatal(err)
			}
			s.Write(junk)
			s.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.ReadAll(s)
			s.Close()
		}
	}
	// Junk announcements and acks from an admitted member.
	for _, topic := range []string{"batches", "acks"} {
		tp, err := a.Host.Join("clawmesh/" + a.Mesh.MeshID() + "/" + topic + "/1")
		if err != nil {
			t.Fatal(err)
		}
		for _, junk := range []string{"{", `{"id":"` + strings.Repeat("z", 64) + `"}`, `{"id":"00","trainer":"x","at":1,"cert":"00","sig":"00"}`} {
			tp.Publish(ctx, []byte(junk))
		}
		tp.Close()
	}
	// Everyone still works: a batch goes from the member to the trainer.
	payload, id := testBatch(t, 2, "still fine")
	out.mu.Lock()
	out.payloads[id] = payload
	out.mu.Unlock()
	waitFor(t, "the batch shipped after the junk", func() bool { return out.count(id) == 1 })
	if !admitted(b, tr) {
		t.Error("the junk cost a peer its admission")
	}
}

// TestStalledPullTriedAgain: a pull that stalls is given up after the
// stall timeout, and the batch comes at a later announcement from the
// member that announced it (never from another peer: its credit is bound
// to its device), credited to the member.
func TestStalledPullTriedAgain(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	trData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	b, tr := start(t, bData), start(t, trData)
	waitFor(t, "everyone admitted", func() bool { return admitted(b, tr) && admitted(a, tr) })

	payload, id := testBatch(t, 300, "stalled first")
	st, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var stats mesh.PullStats
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Mesh.Collect(ctx, st, mesh.PullOptions{Stats: &stats}); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(time.Second) // the trainer's subscription reaches the member

	// The member serves half of the batch, then stalls until released.
	out := &memOutbox{payloads: map[core.BatchID][]byte{id: payload}, shipped: map[core.BatchID]int{}}
	slow := &stallingOutbox{memOutbox: out, stalled: make(chan struct{}), free: make(chan struct{})}
	runShip(t, b, slow)
	select {
	case <-slow.stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("the pull never started")
	}
	waitFor(t, "the stalled pull given up", func() bool { return stats.Failed.Load() > 0 })
	if has, _ := st.Has(context.Background(), id); has {
		t.Fatal("stored while the member stalled")
	}
	slow.release()
	waitFor(t, "the batch shipped", func() bool { return out.count(id) > 0 })
	e, err := st.Entry(context.Background(), id)
	if err != nil || e.From != b.Mesh.ID() {
		t.Errorf("the stored batch is credited to %q (%v), want the member %s", e.From, err, b.Mesh.ID())
	}
}
