package peer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
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

// logBuffer is a log a test reads while peers write it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startLogged is start with the peer's log written to the returned
// buffer, and a stop function (the test's cleanup calls it if the test
// did not).
func startLogged(t *testing.T, data string) (*peer.Peer, *logBuffer, func()) {
	t.Helper()
	var log logBuffer
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: data, Listen: loopback, AdmitTimeout: 3 * time.Second, RefuseFor: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done; p.Close() }) }
	t.Cleanup(stop)
	return p, &log, stop
}

// TestRevokeChecksThePeer: revoke takes only a peer id, of a peer this
// device knows (it admitted it or issued its certificate) unless forced,
// and does not revoke a peer twice.
func TestRevokeChecksThePeer(t *testing.T) {
	ctx := context.Background()
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1)) // invited, never started
	_, bID, _ := peer.Identity(bData)

	for _, bad := range []string{"12D3KooWbogus", "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'peer'", ""} {
		if _, err := a.Mesh.Revoke(ctx, mesh.PeerID(bad), mesh.RevokeOptions{}); !errors.Is(err, mesh.ErrBadPeerID) || strings.Contains(err.Error(), "\n") {
			t.Errorf("revoking %q: %v", bad, err)
		}
	}
	_, stranger, err := peer.Identity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Mesh.Revoke(ctx, stranger, mesh.RevokeOptions{}); !errors.Is(err, mesh.ErrUnknownPeer) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("revoking a peer never seen: %v", err)
	}
	if n := len(a.Mesh.Revocations()); n != 0 {
		t.Fatalf("%d revocations after refusals", n)
	}
	if _, err := a.Mesh.Revoke(ctx, stranger, mesh.RevokeOptions{Force: true}); err != nil {
		t.Errorf("revoking a peer never seen, forced: %v", err)
	}
	// The invited peer is known from the record of the certificates issued.
	known, err := mesh.LoadKnown(adminData)
	if k, ok := known[bID]; err != nil || !ok || !k.Issued || k.Role != "member" {
		t.Errorf("the known members: %+v, %v", known, err)
	}
	if _, err := a.Mesh.Revoke(ctx, bID, mesh.RevokeOptions{Reason: "sold"}); err != nil {
		t.Fatalf("revoking an invited peer: %v", err)
	}
	r, err := a.Mesh.Revoke(ctx, bID, mesh.RevokeOptions{Reason: "again"})
	if !errors.Is(err, mesh.ErrAlreadyRevoked) || r == nil || r.Reason() != "sold" || !strings.Contains(err.Error(), "sold") {
		t.Errorf("revoking twice: %v, %v", r, err)
	}
	if n := len(a.Mesh.Revocations()); n != 2 {
		t.Errorf("%d revocations, want 2", n)
	}
	// The same checks offline, from the data directory's records.
	offData := newMesh(t, "offline")
	key, _, _ := peer.Identity(offData)
	if _, err := mesh.RevokeOffline(offData, key, p2p.PublicKey, stranger, mesh.RevokeOptions{}, time.Now()); !errors.Is(err, mesh.ErrUnknownPeer) {
		t.Errorf("offline, a peer never seen: %v", err)
	}
	if _, err := mesh.RevokeOffline(offData, key, p2p.PublicKey, stranger, mesh.RevokeOptions{Force: true}, time.Now()); err != nil {
		t.Errorf("offline, forced: %v", err)
	}
	if _, err := mesh.RevokeOffline(offData, key, p2p.PublicKey, stranger, mesh.RevokeOptions{Force: true}, time.Now()); !errors.Is(err, mesh.ErrAlreadyRevoked) {
		t.Errorf("offline, twice: %v", err)
	}
}

// TestRevokedPeerIsTold: a device revoked while it runs, and one revoked
// while it is stopped (told when it next connects), each learn that they
// were removed: their status says by whom and why, their log says so
// once, and their batches say they will not ship.
func TestRevokedPeerIsTold(t *testing.T) {
	ctx := context.Background()
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	cData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	b, blog, _ := startLogged(t, bData)
	c, _, stopC := startLogged(t, cData)
	waitFor(t, "the members admitted", func() bool { return admitted(a, b) && admitted(a, c) })
	payload, id := testBatch(t, 1, "from b")
	runShip(t, b, &memOutbox{payloads: map[core.BatchID][]byte{id: payload}, shipped: map[core.BatchID]int{}})
	waitFor(t, "b's batch scheduled", func() bool { _, ok := b.Mesh.NextAnnounce(id); return ok })

	// Revoked while it runs.
	if _, err := a.Mesh.Revoke(ctx, b.Mesh.ID(), mesh.RevokeOptions{Reason: "sold"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the running device told", func() bool { return b.Mesh.Revoked() != nil })
	st := peer.StatusOf(b)
	if !st.Revoked || st.RevokedBy != "the mesh admin" || st.RevokedReason != "sold" || st.RevokedAt.IsZero() {
		t.Errorf("the revoked device's status: %+v", st)
	}
	if off, err := peer.OfflineStatus(bData); err != nil || !off.Revoked || off.RevokedReason != "sold" {
		t.Errorf("the revoked device's status from its data directory: %+v, %v", off, err)
	}
	waitFor(t, "the admin to refuse the revoked device", func() bool { return a.Mesh.Blocked(b.Mesh.ID()) && !a.Mesh.Admitted(b.Mesh.ID()) })
	time.Sleep(500 * time.Millisecond)
	if n := strings.Count(blog.String(), "this device was removed from the mesh"); n != 1 {
		t.Errorf("the revoked device logged its removal %d times:\n%s", n, blog)
	}
	if _, ok := b.Mesh.NextAnnounce(id); ok {
		t.Error("a revoked device still schedules its batch")
	}
	l := []peer.BatchInfo{{ID: id, Steps: 1}}
	peer.Annotate(l, st, b.Mesh.NextAnnounce)
	if !strings.Contains(l[0].Blocked, "removed from the mesh") || !l[0].NextAnnounce.IsZero() {
		t.Errorf("the revoked device's batch: %+v", l[0])
	}

	// Revoked while it is stopped: told when it next connects.
	cID := c.Mesh.ID()
	stopC()
	waitFor(t, "the admin to see the device go", func() bool { return !a.Mesh.Admitted(cID) })
	if _, err := a.Mesh.Revoke(ctx, cID, mesh.RevokeOptions{Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
	c2, clog, _ := startLogged(t, cData)
	waitFor(t, "the device revoked while stopped told when it connects", func() bool { return c2.Mesh.Revoked() != nil })
	if st := peer.StatusOf(c2); !st.Revoked || st.RevokedReason != "lost" {
		t.Errorf("status: %+v", st)
	}
	waitFor(t, "the admin to refuse it again", func() bool { return a.Mesh.Blocked(cID) && !a.Mesh.Admitted(cID) })
	if !strings.Contains(clog.String(), "ask the mesh admin for a new invite") {
		t.Errorf("the log does not say what to do:\n%s", clog)
	}
	if c2.Mesh.Admitted(a.Mesh.ID()) {
		t.Error("a revoked device admitted a peer")
	}
}

// TestRevokedPeerRejoining: a revoked device that redeems a new token
// under its old peer id is told it was removed, not that the inviter is
// unreachable.
func TestRevokedPeerRejoining(t *testing.T) {
	ctx := context.Background()
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	_, bID, _ := peer.Identity(bData)
	if _, err := a.Mesh.Revoke(ctx, bID, mesh.RevokeOptions{Reason: "sold"}); err != nil {
		t.Fatal(err)
	}
	again := t.TempDir()
	id, err := os.ReadFile(filepath.Join(bData, p2p.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(again, p2p.IdentityFile), id, 0o600)
	_, err = peer.Join(ctx, again, invite(t, adminData, a, member.RoleMember, 1), loopback, nil)
	var refused *mesh.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "removed from the mesh") || !strings.Contains(err.Error(), "sold") ||
		!strings.Contains(err.Error(), "fresh data directory") {
		t.Errorf("a revoked device joining again: %v", err)
	}
	// A stranger still joins.
	if _, err := peer.Join(ctx, t.TempDir(), invite(t, adminData, a, member.RoleMember, 1), loopback, nil); err != nil {
		t.Errorf("a new device joining: %v", err)
	}
}

// TestTrainerArrivalAnnounces: a batch sealed while no trainer is in the
// mesh is announced again as soon as one is admitted, not at its next
// backoff, and its next announcement's time is known meanwhile.
func TestTrainerArrivalAnnounces(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	payload, id := testBatch(t, 2, "sealed before any trainer")
	out := &memOutbox{payloads: map[core.BatchID][]byte{id: payload}, shipped: map[core.BatchID]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		a.Mesh.Ship(ctx, out, mesh.ShipOptions{Retry: 5 * time.Minute, MaxRetry: 5 * time.Minute, Poll: 50 * time.Millisecond})
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	var next time.Time
	waitFor(t, "the first announcement", func() bool { var ok bool; next, ok = a.Mesh.NextAnnounce(id); return ok })
	if d := time.Until(next); d < 4*time.Minute {
		t.Errorf("next announcement in %s, want the 5m backoff", d)
	}
	// The admin API lists it with its next announcement.
	rec := httptest.NewRecorder()
	peer.Handler(a, listedBatches{{ID: id, Steps: 2}}).ServeHTTP(rec, httptest.NewRequest("GET", peer.AdminPrefix+"batches", nil))
	var listed []peer.BatchInfo
	if err := json.Unmarshal(rec.Body.Bytes(), &listed); err != nil || len(listed) != 1 || !listed[0].NextAnnounce.Equal(next) || listed[0].Blocked != "" {
		t.Errorf("the admin API's batches: %s %v", rec.Body, err)
	}

	tData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	tr := start(t, tData)
	st, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	runCollect(t, tr, st)
	waitFor(t, "the batch shipped to the trainer that arrived", func() bool { return out.count(id) == 1 })
	if _, ok := a.Mesh.NextAnnounce(id); ok {
		t.Error("a shipped batch is still scheduled")
	}
}

// listedBatches lists fixed batches for the admin API.
type listedBatches []peer.BatchInfo

func (l listedBatches) List(context.Context) ([]peer.BatchInfo, error) { return slices.Clone(l), nil }
func (l listedBatches) Get(context.Context, core.BatchID) (*batch.Batch, error) {
	return nil, mesh.ErrNoBatch
}
