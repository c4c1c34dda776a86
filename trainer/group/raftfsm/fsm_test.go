package raftfsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

func (f *FSM) json(t testing.TB) string {
	t.Helper()
	var s string
	f.View(func(st *group.State) { s = grouptest.FullJSON(t, st) })
	return s
}

func applyLog(f *FSM, e grouptest.LogEntry) error {
	resp := f.Apply(&raft.Log{Type: raft.LogCommand, Term: e.Term, Index: e.Index, Data: e.Data})
	if resp == nil {
		return nil
	}
	err, ok := resp.(error)
	if !ok {
		panic("response is not an error")
	}
	return err
}

// snapshotRestore snapshots f through raft's in-memory snapshot store and
// restores it into a new FSM.
func snapshotRestore(t *testing.T, f *FSM) *FSM {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	store := raft.NewInmemSnapshotStore()
	sink, err := store.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("persist: %v", err)
	}
	snap.Release()
	_, rc, err := store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	g := New()
	if err := g.Restore(rc); err != nil {
		t.Fatalf("restore: %v", err)
	}
	return g
}

func TestFSMSnapshotRestore(t *testing.T) {
	for seed := range uint64(8) {
		log, want := grouptest.RecordLog(t, seed, 200)
		for _, cut := range []int{0, 1, 2, len(log) / 3, len(log) / 2, len(log) - 1, len(log)} {
			a := New()
			var errs []string
			for _, e := range log[:cut] {
				err := applyLog(a, e)
				errs = append(errs, errString(err))
			}
			b := snapshotRestore(t, a)
			if ja, jb := a.json(t), b.json(t); ja != jb {
				t.Fatalf("seed %d cut %d: restored state differs %s", seed, cut, grouptest.Diff(ja, jb))
			}
			// Both go on with the rest of the log, refusing the same entries.
			for i, e := range log[cut:] {
				ea, eb := applyLog(a, e), applyLog(b, e)
				if errString(ea) != errString(eb) {
					t.Fatalf("seed %d cut %d entry %d: %v, restored %v", seed, cut, cut+i, ea, eb)
				}
			}
			ja, jb := a.json(t), b.json(t)
			if ja != jb {
				t.Fatalf("seed %d cut %d: states differ after the rest of the log %s", seed, cut, grouptest.Diff(ja, jb))
			}
			if jw := grouptest.FullJSON(t, want); ja != jw {
				t.Fatalf("seed %d: the FSM and the state applied directly differ %s", seed, grouptest.Diff(ja, jw))
			}
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestFSMRestoreEmpty(t *testing.T) {
	f := New()
	for _, in := range []string{`{}`, `{"batches":null,"trainers":null,"revoked":null,"counts":null,"refusals":null}`} {
		if err := f.Restore(io.NopCloser(strings.NewReader(in))); err != nil {
			t.Fatalf("restore %s: %v", in, err)
		}
		e := &group.Entry{Genesis: &group.Genesis{Hash: grouptest.HashN(0)}}
		data, _ := e.Encode()
		if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 1}); err != nil {
			t.Fatal(err)
		}
		data, _ = (&group.Entry{Add: []group.BatchRef{{ID: grouptest.Bid(1)}}}).Encode()
		if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 2}); err != nil {
			t.Fatal(err)
		}
		data, _ = (&group.Entry{Revoke: &group.Revocation{Peer: "x"}}).Encode()
		if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 3}); err != nil {
			t.Fatal(err)
		}
		data, _ = (&group.Entry{Refuse: []group.Refusal{{ID: grouptest.Bid(1), Reason: "r"}}}).Encode()
		if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 4}); err != nil {
			t.Fatal(err)
		}
	}
}

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

func TestFSMRestoreBad(t *testing.T) {
	f := New()
	data, _ := (&group.Entry{Genesis: &group.Genesis{Hash: grouptest.HashN(0)}}).Encode()
	if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 1}); err != nil {
		t.Fatal(err)
	}
	before := f.json(t)
	for _, in := range []string{"", "{", "[]", `{"versions":7}`, "\x00"} {
		rc := &closeCounter{Reader: strings.NewReader(in)}
		if err := f.Restore(rc); err == nil {
			t.Errorf("restore of %q accepted", in)
		}
		if rc.closed != 1 {
			t.Errorf("restore of %q closed the reader %d times", in, rc.closed)
		}
		if after := f.json(t); after != before {
			t.Fatalf("failed restore of %q changed the state", in)
		}
	}
}

type failSink struct {
	bytes.Buffer
	canceled, closed bool
	fail             bool
}

func (s *failSink) Write(p []byte) (int, error) {
	if s.fail {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}
func (s *failSink) Close() error  { s.closed = true; return nil }
func (s *failSink) ID() string    { return "x" }
func (s *failSink) Cancel() error { s.canceled = true; return nil }

func TestFSMSnapshotPersist(t *testing.T) {
	f := New()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	ok := &failSink{}
	if err := snap.Persist(ok); err != nil || !ok.closed || ok.canceled {
		t.Errorf("persist: %v, closed %v, canceled %v", err, ok.closed, ok.canceled)
	}
	var st group.State
	if err := json.Unmarshal(ok.Bytes(), &st); err != nil {
		t.Errorf("snapshot is not a state: %v", err)
	}
	bad := &failSink{fail: true}
	if err := snap.Persist(bad); err == nil || !bad.canceled || bad.closed {
		t.Errorf("persist to a failing sink: %v, closed %v, canceled %v", err, bad.closed, bad.canceled)
	}
	// A snapshot is the state when it was taken.
	data, _ := (&group.Entry{Genesis: &group.Genesis{Hash: grouptest.HashN(0)}}).Encode()
	if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 1}); err != nil {
		t.Fatal(err)
	}
	later := &failSink{}
	if err := snap.Persist(later); err != nil || !bytes.Equal(later.Bytes(), ok.Bytes()) {
		t.Errorf("the snapshot changed with the state")
	}
}

func TestFSMWatch(t *testing.T) {
	f := New()
	var mu sync.Mutex
	var seen, seen2 []group.Applied
	f.Watch(func(a group.Applied) {
		// Watchers run outside the state's lock: View must not deadlock.
		f.View(func(s *group.State) {
			if s.Index != a.Index {
				t.Errorf("watch of %d sees index %d", a.Index, s.Index)
			}
		})
		mu.Lock()
		seen = append(seen, a)
		mu.Unlock()
	})
	f.Watch(func(a group.Applied) {
		mu.Lock()
		seen2 = append(seen2, a)
		mu.Unlock()
	})
	enc := func(e *group.Entry) []byte {
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	logs := []*raft.Log{
		{Type: raft.LogCommand, Term: 1, Index: 1, Data: enc(&group.Entry{Genesis: &group.Genesis{Hash: grouptest.HashN(0)}})},
		{Type: raft.LogNoop, Term: 1, Index: 2},
		{Type: raft.LogCommand, Term: 1, Index: 3, Data: enc(&group.Entry{Register: &group.Trainer{ID: "t1"}})},
		{Type: raft.LogCommand, Term: 1, Index: 4, Data: []byte("garbage")},
		{Type: raft.LogCommand, Term: 2, Index: 5, Data: enc(&group.Entry{Leave: "t9"})},
		{Type: raft.LogConfiguration, Term: 2, Index: 6},
		{Type: raft.LogCommand, Term: 2, Index: 7, Data: enc(&group.Entry{Leave: "t1"})},
	}
	done := make(chan []any)
	go func() {
		var out []any
		for _, l := range logs {
			out = append(out, f.Apply(l))
		}
		done <- out
	}()
	var resps []any
	select {
	case resps = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Apply did not return: a watcher deadlocked")
	}
	wantIdx := []uint64{1, 3, 4, 5, 7}
	wantErrs := []error{nil, nil, group.ErrEntry, group.ErrTrainer, nil}
	if len(seen) != len(wantIdx) || len(seen2) != len(wantIdx) {
		t.Fatalf("watch saw %d and %d entries, want %d", len(seen), len(seen2), len(wantIdx))
	}
	for i, a := range seen {
		if a.Index != wantIdx[i] || !grouptest.WantErr(a.Err, wantErrs[i]) {
			t.Errorf("watch %d: index %d err %v, want %d %v", i, a.Index, a.Err, wantIdx[i], wantErrs[i])
		}
		if (a.Entry == nil) != (wantIdx[i] == 4) {
			t.Errorf("watch %d: entry %v", i, a.Entry)
		}
		if seen2[i].Index != a.Index || seen2[i].Term != a.Term {
			t.Errorf("second watcher saw %+v, first %+v", seen2[i], a)
		}
	}
	if seen[0].Entry.Genesis == nil || seen[0].Term != 1 || seen[3].Term != 2 {
		t.Errorf("watch %+v", seen)
	}
	for i, l := range logs {
		r := resps[i]
		if l.Type != raft.LogCommand {
			if r != nil {
				t.Errorf("log %d of type %v: response %v", l.Index, l.Type, r)
			}
			continue
		}
		if l.Index == 4 || l.Index == 5 {
			if _, ok := r.(error); !ok {
				t.Errorf("log %d: response %v", l.Index, r)
			}
		} else if r != nil {
			t.Errorf("log %d: response %v", l.Index, r)
		}
	}
}

func TestFSMMalformed(t *testing.T) {
	f := New()
	data, _ := (&group.Entry{Genesis: &group.Genesis{Hash: grouptest.HashN(0)}}).Encode()
	if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 1}); err != nil {
		t.Fatal(err)
	}
	data, _ = (&group.Entry{Register: &group.Trainer{ID: "t1"}}).Encode()
	if err := applyLog(f, grouptest.LogEntry{Data: data, Term: 1, Index: 2}); err != nil {
		t.Fatal(err)
	}
	var before string
	f.View(func(s *group.State) { before = grouptest.StateJSON(t, s) })
	bad := []string{
		"", " ", "{", "}", "[]", "null", "7", `"leave"`, "\xff\xfe",
		`{}`,
		`{"at":"2025-01-01T00:00:00Z"}`,
		`{"leave":"t1"} x`,
		`{"leave":"t1"}}`,
		`{"leave":"t1"}]`,
		`{"leave":"t1"}{"leave":"t1"}`,
		`{"leave":"t1"} {}`,
		`{"leave":"t1","abort":{"round":1}}`,
		`{"leave":"t1","bogus":1}`,
		`{"leave":7}`,
		`{"at":"yesterday","leave":"t1"}`,
		`{"add":[{"id":5}]}`,
		`{"add":[{"id":"` + grouptest.HashN(1) + `","steps":1.5}]}`,
		`{"add":[{"id":"` + grouptest.HashN(1) + `","extra":1}]}`,
		`{"add":[]}`,
		`{"add":null}`,
		`{"register":{"id":"t2","speed":1e400}}`,
		`{"register":{"id":"t2","speed":-1}}`,
		`{"register":null}`,
		`{"speeds":[]}`,
		`{"start":{"round":-1}}`,
		`{"publish":{"round":1,"version":1,"contributors":{}}}`,
		`{"configure":{"deadline_ns":"1m"}}`,
		strings.Repeat(" ", group.MaxEntry+1),
	}
	for i, in := range bad {
		idx := uint64(10 + i)
		err := applyLog(f, grouptest.LogEntry{Data: []byte(in), Term: 3, Index: idx})
		if !errors.Is(err, group.ErrEntry) {
			t.Errorf("%.60q: %v, want ErrEntry", in, err)
		}
		f.View(func(s *group.State) {
			if s.Term != 3 || s.Index != idx {
				t.Errorf("%.60q: applied (%d,%d), want (3,%d)", in, s.Term, s.Index, idx)
			}
			if after := grouptest.StateJSON(t, s); after != before {
				t.Errorf("%.60q changed the state", in)
			}
		})
	}
	// What DecodeEntry accepts: surrounding space, a known command.
	for _, in := range []string{` {"leave":"t1"} `, "{\"leave\":\"t1\"}\n"} {
		if _, err := group.DecodeEntry([]byte(in)); err != nil {
			t.Errorf("DecodeEntry(%q): %v", in, err)
		}
	}
}

func TestFSMConcurrentView(t *testing.T) {
	log, _ := grouptest.RecordLog(t, 3, 150)
	f := New()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for range 100000 {
			select {
			case <-stop:
				return
			default:
			}
			f.View(func(s *group.State) {
				if err := grouptest.CheckInvariants(s); err != nil {
					t.Errorf("view: %v", err)
				}
			})
		}
	})
	for _, e := range log {
		applyLog(f, e)
	}
	close(stop)
	wg.Wait()
}

// fuzzBase is a state with a lineage, an open round, refusals and a
// revocation, as JSON: FuzzApply restores it before every input.
func fuzzBase(tb testing.TB) []byte {
	fx := grouptest.Published(tb) // v1 from round 1; batches 1..3 trained, 4..6 pending
	fx.Must(&group.Entry{Add: []group.BatchRef{{ID: grouptest.Bid(7), From: "d3", Steps: 2, Adapters: []string{"v1"}}, {ID: grouptest.Bid(8), From: "d9", Steps: 300}, {ID: grouptest.Bid(9), Steps: 1, Adapters: []string{"v0"}}}})
	fx.Must(&group.Entry{Refuse: []group.Refusal{{ID: grouptest.Bid(4), Reason: "unreadable: x"}}})
	fx.Must(&group.Entry{Register: &group.Trainer{ID: "t4", Speed: 3, Addrs: []string{"a"}}})
	fx.Must(&group.Entry{Revoke: &group.Revocation{Peer: "d9", Reason: "spam"}})
	fx.Must(&group.Entry{Add: []group.BatchRef{{ID: grouptest.Bid(10), From: "d9"}, {ID: grouptest.Bid(11), From: "d4", Steps: 1}}})
	fx.Must(&group.Entry{Start: &group.Start{Round: 2, Base: 1, Leader: "t2", Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(5)}, "t3": {grouptest.Bid(6), grouptest.Bid(7)}}}})
	if err := grouptest.CheckInvariants(fx.S); err != nil {
		tb.Fatal(err)
	}
	return []byte(grouptest.FullJSON(tb, fx.S))
}

// FuzzApply decodes arbitrary bytes as log entries (one a line, at most 8)
// and applies them through the FSM to a prepared state: nothing panics, a
// refused entry changes nothing but the applied index, and the invariants
// hold after every entry.
func FuzzApply(f *testing.F) {
	base := fuzzBase(f)
	seeds := []string{
		`{"publish":{"round":2,"version":2,"parent":1,"hash":"` + grouptest.HashN(2) + `","publisher":"t2","contributors":[{"trainer":"t1","batches":["` + string(grouptest.Bid(5)) + `"]},{"trainer":"t3","batches":["` + string(grouptest.Bid(7)) + `"]}],"refused":[{"id":"` + string(grouptest.Bid(6)) + `","reason":"verify"}]}}`,
		`{"abort":{"round":2,"reason":"deadline"}}` + "\n" + `{"start":{"round":3,"base":1,"shares":{"t4":["` + string(grouptest.Bid(5)) + `","` + string(grouptest.Bid(9)) + `"]}}}` + "\n" + `{"publish":{"round":3,"version":2,"parent":1,"hash":"` + grouptest.HashN(3) + `","contributors":[{"trainer":"t4","batches":["` + string(grouptest.Bid(9)) + `"]}]}}`,
		`{"add":[{"id":"` + grouptest.HashN(77) + `","from":"d1","steps":3,"adapters":["v1"]}]}`,
		`{"refuse":[{"id":"` + string(grouptest.Bid(11)) + `","reason":"stale"}]}`,
		`{"register":{"id":"t5","engine":"cuda","device":"h100","speed":2.5,"addrs":["x:1"]}}`,
		`{"leave":"t3"}` + "\n" + `{"abort":{"round":2}}`,
		`{"revoke":{"peer":"d3","reason":"bad"}}` + "\n" + `{"abort":{"round":2}}`,
		`{"speeds":[{"trainer":"t1","speed":4}]}`,
		`{"configure":{"quota":3,"round_steps":5,"max_lag":1}}`,
		`{"genesis":{"hash":"` + grouptest.HashN(9) + `"}}`,
		`{"start":{"round":3,"base":1,"shares":{"t1":["` + string(grouptest.Bid(11)) + `"]}}}`,
		`{"at":"2025-01-01T00:00:00Z","leave":"t1","abort":{"round":2}}`,
		`{"publish":{"round":2,"version":2,"parent":1,"hash":"` + grouptest.HashN(2) + `","contributors":[{"trainer":"t1","batches":["` + string(grouptest.Bid(5)) + `","` + string(grouptest.Bid(5)) + `"]}]}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fsm := New()
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(base))); err != nil {
			t.Fatal(err)
		}
		var idx uint64
		fsm.View(func(s *group.State) { idx = s.Index })
		for i, part := range bytes.SplitN(data, []byte("\n"), 8) {
			var before string
			fsm.View(func(s *group.State) { before = grouptest.StateJSON(t, s) })
			idx++
			resp := fsm.Apply(&raft.Log{Type: raft.LogCommand, Term: 5, Index: idx, Data: part})
			fsm.View(func(s *group.State) {
				if s.Term != 5 || s.Index != idx {
					t.Fatalf("entry %d: applied (%d,%d)", i, s.Term, s.Index)
				}
				if resp != nil {
					err, ok := resp.(error)
					if !ok {
						t.Fatalf("entry %d: response %T", i, resp)
					}
					if !isSentinel(err) {
						t.Fatalf("entry %d: error %v wraps no sentinel", i, err)
					}
					if after := grouptest.StateJSON(t, s); after != before {
						t.Fatalf("entry %d refused (%v) but changed the state %s", i, err, grouptest.Diff(before, after))
					}
				}
				if err := grouptest.CheckInvariants(s); err != nil {
					t.Fatalf("entry %d %q: %v", i, part, err)
				}
			})
		}
		// Whatever the state became, it snapshots and restores as it is.
		snap, err := fsm.Snapshot()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		sink := &failSink{}
		if err := snap.Persist(sink); err != nil {
			t.Fatal(err)
		}
		g := New()
		if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
			t.Fatalf("restore: %v", err)
		}
		if a, b := fsm.json(t), g.json(t); a != b {
			t.Fatalf("restored state differs %s", grouptest.Diff(a, b))
		}
	})
}

func isSentinel(err error) bool {
	for _, s := range []error{group.ErrEntry, group.ErrConfig, group.ErrNoRound, group.ErrVersion, group.ErrBatch, group.ErrTrainer, group.ErrFenced, group.ErrGenesis, group.ErrNoGenesis} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
