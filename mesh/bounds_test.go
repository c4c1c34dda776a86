package mesh_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
)

// These tests run real peers (mesh/peer: libp2p on loopback, membership on
// disk). Every wait polls and is bounded; nothing asserts how long anything
// took.

// meshOf makes a mesh whose admin's device runs until the test ends, and
// returns it with its data dir.
func meshOf(t testing.TB) (*peer.Peer, string) {
	t.Helper()
	data := t.TempDir()
	key, id, err := peer.Identity(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(data, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	return run(t, data), data
}

// joined makes a peer of role in the admin's mesh and runs it.
func joined(t testing.TB, admin *peer.Peer, adminData string, role member.Role) *peer.Peer {
	t.Helper()
	key, _, _ := peer.Identity(adminData)
	tok, err := mesh.Invite(adminData, key, role, time.Hour, 1, admin.Host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	if _, err := peer.Join(context.Background(), data, tok.String(), loopback, nil); err != nil {
		t.Fatalf("join: %v", err)
	}
	return run(t, data)
}

func run(t testing.TB, data string) *peer.Peer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: data, Listen: loopback, AdmitTimeout: 3 * time.Second, RefuseFor: time.Minute, Stall: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
	return p
}

func admitted(ps ...*peer.Peer) bool {
	for _, a := range ps {
		for _, b := range ps {
			if a != b && !a.Mesh.Admitted(b.Mesh.ID()) {
				return false
			}
		}
	}
	return true
}

// collect runs p's Collect into st until the test ends.
func collect(t *testing.T, p *peer.Peer, st mesh.Store, o mesh.PullOptions) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Mesh.Collect(ctx, st, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Collect: %v", err)
		}
	})
}

// announcer publishes on p's batch topic, as a device's Ship does.
func announcer(t *testing.T, p *peer.Peer) mesh.Topic {
	t.Helper()
	tp, err := p.Host.Join(mesh.TopicName(p.Mesh.MeshID(), "batches/1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

func announce(t *testing.T, tp mesh.Topic, man mesh.Manifest) {
	t.Helper()
	b, _ := json.Marshal(man)
	if err := tp.Publish(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// writeMsg writes v as the pull protocol frames it: its JSON's length as
// a uvarint, then the JSON.
func writeMsg(w io.Writer, v any) error {
	b, _ := json.Marshal(v)
	_, err := w.Write(append(binary.AppendUvarint(nil, uint64(len(b))), b...))
	return err
}

// skipMsg reads one framed message and discards it.
func skipMsg(r *bufio.Reader) error {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return err
	}
	_, err = r.Discard(int(n))
	return err
}

func randomID() core.BatchID {
	var b [32]byte
	rand.Read(b[:])
	return core.BatchID(hex.EncodeToString(b[:]))
}

func testBatch(t *testing.T, n int, text string) ([]byte, core.BatchID) {
	t.Helper()
	var steps []*core.Step
	for i := range n {
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

// originStore is a mesh.OriginStore in memory that keeps who each batch
// is credited to.
type originStore struct {
	mu      sync.Mutex
	payload map[core.BatchID][]byte
	from    map[core.BatchID]mesh.PeerID
}

func newOriginStore() *originStore {
	return &originStore{payload: map[core.BatchID][]byte{}, from: map[core.BatchID]mesh.PeerID{}}
}

func (s *originStore) Payload(_ context.Context, id core.BatchID) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.payload[id]; ok {
		return b, nil
	}
	return nil, mesh.ErrNoBatch
}

func (s *originStore) Has(_ context.Context, id core.BatchID) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.payload[id]
	return ok, nil
}

func (s *originStore) Put(ctx context.Context, id core.BatchID, payload []byte, b *batch.Batch) error {
	return s.PutFrom(ctx, id, "", payload, b)
}

func (s *originStore) PutFrom(_ context.Context, id core.BatchID, from mesh.PeerID, payload []byte, _ *batch.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.payload[id], s.from[id] = payload, from
	return nil
}

func (s *originStore) credit(id core.BatchID) (mesh.PeerID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.from[id]
	return p, ok
}

// TestLyingAnnouncementsStayInBudget: a member announces batches of 32 MiB
// it answers with a few bytes. The trainer's memory for them grows with
// the bytes that arrive, not with the sizes announced, and never past its
// budget; a flood of announcements is dropped past the member's rate and
// gets it disconnected.
func TestLyingAnnouncementsStayInBudget(t *testing.T) {
	admin, adminData := meshOf(t)
	liar := joined(t, admin, adminData, member.RoleMember)
	flooder := joined(t, admin, adminData, member.RoleMember)
	tr := joined(t, admin, adminData, member.RoleTrainer)
	waitFor(t, "everyone admitted", func() bool { return admitted(admin, liar, flooder, tr) })

	const announced = 32 << 20
	const sent = 1 << 10
	// The liar says yes to every pull, sends a few bytes and ends.
	liar.Host.Handle(mesh.ProtoPull, func(s mesh.Stream) {
		defer s.Close()
		if skipMsg(bufio.NewReader(s)) != nil {
			s.Reset()
			return
		}
		writeMsg(s, map[string]any{"status": "ok", "size": announced})
		s.Write(make([]byte, sent))
	})
	var stats mesh.PullStats
	const budget = 64 << 20
	collect(t, tr, newOriginStore(), mesh.PullOptions{Budget: budget, Stats: &stats})
	tp := announcer(t, liar)
	lie := func() mesh.Manifest {
		return mesh.Manifest{ID: randomID(), Size: announced, Steps: 1, Sessions: 1, Created: time.Now().UTC()}
	}
	// The gossip mesh forms at the routers' heartbeats: announce until the
	// trainer hears one.
	waitFor(t, "the trainer to hear the member", func() bool {
		announce(t, tp, lie())
		time.Sleep(200 * time.Millisecond)
		return stats.Announcements.Load() > 0
	})
	for range 12 {
		announce(t, tp, lie())
	}
	waitFor(t, "the pulls to end", func() bool {
		return stats.Announcements.Load() >= 13 && stats.Pulls.Load() == stats.Failed.Load() && stats.Reserved.Load() == 0 &&
			stats.Pulls.Load()+stats.Dropped.Load() == stats.Announcements.Load()
	})
	pulls := stats.Pulls.Load()
	if pulls == 0 {
		t.Fatal("no pull started")
	}
	// Each pull takes the first 64 KiB buffer, and no more for 1 KiB.
	if got, most := stats.Allocated.Load(), pulls*64<<10; got > most {
		t.Errorf("%d pulls of %d bytes each allocated %d bytes, want at most %d", pulls, sent, got, most)
	}
	if peak := stats.HeldPeak.Load(); peak > budget {
		t.Errorf("held %d bytes at once, over the budget of %d", peak, budget)
	}
	if held := stats.Held.Load(); held != 0 {
		t.Errorf("%d bytes still held after every pull ended", held)
	}

	// A flood from a member that never answers its pulls: past its
	// pulls' queue and its rate, its announcements are dropped, and it is
	// disconnected.
	flooder.Host.Handle(mesh.ProtoPull, func(s mesh.Stream) {
		io.Copy(io.Discard, s) // until the puller gives up
		s.Close()
	})
	fp := announcer(t, flooder)
	dropped, disconnects := stats.Dropped.Load(), stats.Disconnects.Load()
	for i := 0; i < 3*mesh.AnnounceBurst && stats.Disconnects.Load() == disconnects; i++ {
		announce(t, fp, lie())
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, "the flood dropped and its author disconnected", func() bool {
		return stats.Dropped.Load() > dropped && stats.Disconnects.Load() > disconnects
	})
	if peak := stats.HeldPeak.Load(); peak > budget {
		t.Errorf("held %d bytes at once, over the budget of %d", peak, budget)
	}
}

// TestCreditGoesToAuthor: a member that announces another device's batch
// as its own gets nothing: the trainer pulls only from the announcement's
// author, who does not hold it, and does not fetch the batch elsewhere to
// credit it to the thief. The device's own announcement credits the
// device.
func TestCreditGoesToAuthor(t *testing.T) {
	admin, adminData := meshOf(t)
	dev := joined(t, admin, adminData, member.RoleMember)
	thief := joined(t, admin, adminData, member.RoleMember)
	tr := joined(t, admin, adminData, member.RoleTrainer)
	waitFor(t, "everyone admitted", func() bool { return admitted(admin, dev, thief, tr) })

	payload, id := testBatch(t, 3, "mine")
	man, err := mesh.ManifestOf(payload)
	if err != nil {
		t.Fatal(err)
	}
	// The device serves its batch to whoever pulls it, but does not
	// announce it yet.
	dev.Host.Handle(mesh.ProtoPull, func(s mesh.Stream) {
		defer s.Close()
		if skipMsg(bufio.NewReader(s)) != nil {
			s.Reset()
			return
		}
		writeMsg(s, map[string]any{"status": "ok", "size": len(payload)})
		s.Write(payload)
	})
	thief.Host.Handle(mesh.ProtoPull, func(s mesh.Stream) {
		defer s.Close()
		if skipMsg(bufio.NewReader(s)) != nil {
			s.Reset()
			return
		}
		writeMsg(s, map[string]any{"status": "not_found"})
	})
	var stats mesh.PullStats
	st := newOriginStore()
	collect(t, tr, st, mesh.PullOptions{Stats: &stats})

	// The thief announces the device's batch until the trainer has tried
	// to pull it (the gossip mesh forms at the routers' heartbeats).
	tp := announcer(t, thief)
	waitFor(t, "the trainer to pull the thief's announcement", func() bool {
		man.Round++
		announce(t, tp, man)
		time.Sleep(200 * time.Millisecond)
		return stats.Failed.Load() > 0
	})
	if from, ok := st.credit(id); ok {
		t.Fatalf("the batch was stored on the thief's announcement, credited to %q (thief %s, device %s)", from, thief.Mesh.ID(), dev.Mesh.ID())
	}

	// The device's own announcement.
	dp := announcer(t, dev)
	waitFor(t, "the batch stored", func() bool {
		man.Round++
		announce(t, dp, man)
		time.Sleep(200 * time.Millisecond)
		_, ok := st.credit(id)
		return ok
	})
	if from, _ := st.credit(id); from != dev.Mesh.ID() {
		t.Errorf("the batch is credited to %q, want the device %s (thief %s)", from, dev.Mesh.ID(), thief.Mesh.ID())
	}
}

// BenchmarkPull: a trainer pulls 16 MiB from a device over loopback, its
// memory taken as the bytes arrive.
func BenchmarkPull(b *testing.B) {
	admin, adminData := meshOf(b)
	tr := joined(b, admin, adminData, member.RoleTrainer)
	deadline := time.Now().Add(30 * time.Second)
	for !admitted(admin, tr) {
		if time.Now().After(deadline) {
			b.Fatal("not admitted")
		}
		time.Sleep(25 * time.Millisecond)
	}
	payload := make([]byte, 16<<20)
	rand.Read(payload)
	id := batch.ID(payload)
	admin.Host.Handle(mesh.ProtoPull, func(s mesh.Stream) {
		defer s.Close()
		if skipMsg(bufio.NewReader(s)) != nil {
			s.Reset()
			return
		}
		writeMsg(s, map[string]any{"status": "ok", "size": len(payload)})
		s.Write(payload)
	})
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if _, err := tr.Mesh.Pull(context.Background(), admin.Mesh.ID(), id, int64(len(payload))); err != nil {
			b.Fatal(err)
		}
	}
}
