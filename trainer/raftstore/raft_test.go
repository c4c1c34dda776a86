package raftstore

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// listFSM is a state machine whose state is the list of commands applied.
type listFSM struct {
	mu       sync.Mutex
	cmds     []string
	applies  int
	restores int
}

func (f *listFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cmds = append(f.cmds, string(l.Data))
	f.applies++
	return len(f.cmds)
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return listSnapshot(slices.Clone(f.cmds)), nil
}

func (f *listFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var cmds []string
	if err := json.NewDecoder(rc).Decode(&cmds); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cmds = cmds
	f.restores++
	return nil
}

func (f *listFSM) state() (cmds []string, applies, restores int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cmds), f.applies, f.restores
}

type listSnapshot []string

func (s listSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode([]string(s)); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (listSnapshot) Release() {}

// raftNode is one life of a single-node cluster on a Store in dir.
type raftNode struct {
	store *Store
	raft  *raft.Raft
	trans *raft.InmemTransport
}

const raftAddr = raft.ServerAddress("node-1")

func startRaft(t *testing.T, dir string, fsm raft.FSM, wantExisting bool) *raftNode {
	t.Helper()
	conf := raft.DefaultConfig()
	conf.LocalID = "node-1"
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	// Snapshots are taken by the test alone, and compaction keeps 10
	// entries behind the last snapshot.
	conf.SnapshotInterval = time.Hour
	conf.SnapshotThreshold = 1 << 30
	conf.TrailingLogs = 10
	conf.LogOutput = io.Discard

	store, err := Open(filepath.Join(dir, "raft"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(filepath.Join(dir, "snapshots"), 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil || has != wantExisting {
		t.Fatalf("HasExistingState = %v, %v; want %v", has, err, wantExisting)
	}
	_, trans := raft.NewInmemTransport(raftAddr)
	r, err := raft.NewRaft(conf, fsm, store, store, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	return &raftNode{store: store, raft: r, trans: trans}
}

func (n *raftNode) waitLeader(t *testing.T) {
	t.Helper()
	for range 400 {
		if n.raft.State() == raft.Leader {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("no leader after 10s: state %v", n.raft.State())
}

func (n *raftNode) stop(t *testing.T) {
	t.Helper()
	if err := n.raft.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	if err := n.trans.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRaftRestart runs a real raft.Raft on a Store: a single node
// bootstraps, elects itself, applies 100 commands with a snapshot after
// the 60th (which compacts the log), and stops; started again on the same
// directory with a fresh state machine, it restores the snapshot, replays
// the 40 logged commands after it, and ends in the same state.
func TestRaftRestart(t *testing.T) {
	dir := t.TempDir()
	const total, snapAt = 100, 60

	fsm1 := &listFSM{}
	n := startRaft(t, dir, fsm1, false)
	boot := raft.Configuration{Servers: []raft.Server{{ID: "node-1", Address: raftAddr}}}
	if err := n.raft.BootstrapCluster(boot).Error(); err != nil {
		t.Fatal(err)
	}
	n.waitLeader(t)
	for i := range total {
		if i == snapAt {
			if err := n.raft.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
		f := n.raft.Apply(fmt.Appendf(nil, "cmd %d", i), 5*time.Second)
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		if got := f.Response(); got != i+1 {
			t.Fatalf("Apply %d answered %v", i, got)
		}
	}
	first, _ := n.store.FirstIndex()
	last, _ := n.store.LastIndex()
	if first <= 1 || last <= first {
		t.Fatalf("log [%d, %d] after a snapshot: not compacted", first, last)
	}
	term1, err := n.store.GetUint64([]byte("CurrentTerm"))
	if err != nil || term1 == 0 {
		t.Fatalf("CurrentTerm = %d, %v", term1, err)
	}
	want, _, _ := fsm1.state()
	t.Logf("first life: log [%d, %d], term %d", first, last, term1)
	n.stop(t)

	fsm2 := &listFSM{}
	n = startRaft(t, dir, fsm2, true)
	defer n.stop(t)
	if f, _ := n.store.FirstIndex(); f != first {
		t.Fatalf("FirstIndex after reopening %d, want %d", f, first)
	}
	if l, _ := n.store.LastIndex(); l != last {
		t.Fatalf("LastIndex after reopening %d, want %d", l, last)
	}
	n.waitLeader(t)
	if err := n.raft.Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	got, applies, restores := fsm2.state()
	if !slices.Equal(got, want) || len(got) != total {
		t.Fatalf("state after restart: %d commands %q..., want %d", len(got), got[:min(3, len(got))], len(want))
	}
	if restores != 1 || applies != total-snapAt {
		t.Fatalf("restart restored %d snapshots and applied %d logs, want 1 and %d", restores, applies, total-snapAt)
	}
	term2, err := n.store.GetUint64([]byte("CurrentTerm"))
	if err != nil || term2 <= term1 {
		t.Fatalf("CurrentTerm after restart %d, %v; want more than %d", term2, err, term1)
	}
	t.Logf("second life: %d restored, %d replayed, term %d", len(got)-applies, applies, term2)
}
