package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// raftStore is what raft asks of a store that is both its LogStore and its
// StableStore.
type raftStore interface {
	raft.LogStore
	raft.StableStore
}

// impls are the stores the conformance suite runs against: ours, and raft's
// own InmemStore, so that every expectation below is shown to be raft's and
// not only ours.
var impls = []struct {
	name string
	open func(tb testing.TB) raftStore
}{
	{"pebble", func(tb testing.TB) raftStore { return openTemp(tb) }},
	{"inmem", func(testing.TB) raftStore { return raft.NewInmemStore() }},
}

// openTemp opens a Store in a temporary directory, closed at the end of
// the test.
func openTemp(tb testing.TB) *Store {
	tb.Helper()
	s, err := Open(tb.TempDir(), Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
			tb.Error(err)
		}
	})
	return s
}

// testLog is the entry the tests store at idx: every field set, and
// varied with idx.
func testLog(idx uint64) *raft.Log {
	return &raft.Log{
		Index:      idx,
		Term:       idx/10 + 1,
		Type:       raft.LogType(idx % 6),
		Data:       fmt.Appendf(nil, "data %d", idx),
		Extensions: fmt.Appendf(nil, "ext %d", idx),
		AppendedAt: time.Date(2026, 1, 2, 3, 4, 5, int(idx), time.UTC),
	}
}

func testLogs(lo, hi uint64) []*raft.Log {
	var out []*raft.Log
	for i := lo; i <= hi; i++ {
		out = append(out, testLog(i))
	}
	return out
}

// sameLog reports whether a and b hold the same entry: times compared with
// Equal (a stored time comes back without its location), nil and empty
// byte fields alike.
func sameLog(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type &&
		bytes.Equal(a.Data, b.Data) && bytes.Equal(a.Extensions, b.Extensions) &&
		a.AppendedAt.Equal(b.AppendedAt)
}

func mustStore(t *testing.T, s raft.LogStore, logs ...*raft.Log) {
	t.Helper()
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
}

func wantBounds(t *testing.T, s raft.LogStore, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if f != first || l != last {
		t.Fatalf("bounds [%d, %d], want [%d, %d]", f, l, first, last)
	}
}

func wantLog(t *testing.T, s raft.LogStore, want *raft.Log) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(want.Index, &got); err != nil {
		t.Fatalf("GetLog(%d): %v", want.Index, err)
	}
	if !sameLog(&got, want) {
		t.Fatalf("GetLog(%d) = %+v, want %+v", want.Index, got, *want)
	}
}

func wantMissing(t *testing.T, s raft.LogStore, idx uint64) {
	t.Helper()
	var got raft.Log
	// Compared with ==, as raft's replication does.
	if err := s.GetLog(idx, &got); err != raft.ErrLogNotFound {
		t.Fatalf("GetLog(%d) = %v, want raft.ErrLogNotFound", idx, err)
	}
}

// TestConformance holds the cases of raft-boltdb's bolt_store_test.go, and a
// few more raft relies on, for every implementation in impls.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, s raftStore)
	}{
		{"FirstIndex", func(t *testing.T, s raftStore) {
			wantBounds(t, s, 0, 0)
			mustStore(t, s, testLogs(1, 3)...)
			if f, _ := s.FirstIndex(); f != 1 {
				t.Fatalf("FirstIndex %d, want 1", f)
			}
		}},
		{"LastIndex", func(t *testing.T, s raftStore) {
			wantBounds(t, s, 0, 0)
			mustStore(t, s, testLogs(1, 3)...)
			if l, _ := s.LastIndex(); l != 3 {
				t.Fatalf("LastIndex %d, want 3", l)
			}
		}},
		{"GetLog", func(t *testing.T, s raftStore) {
			wantMissing(t, s, 1)
			mustStore(t, s, testLogs(1, 3)...)
			wantLog(t, s, testLog(2))
			wantMissing(t, s, 4)
		}},
		{"SetLog", func(t *testing.T, s raftStore) {
			if err := s.StoreLog(testLog(1)); err != nil {
				t.Fatal(err)
			}
			wantLog(t, s, testLog(1))
			wantBounds(t, s, 1, 1)
		}},
		{"SetLogs", func(t *testing.T, s raftStore) {
			mustStore(t, s, testLog(1), testLog(2))
			wantLog(t, s, testLog(1))
			wantLog(t, s, testLog(2))
			wantBounds(t, s, 1, 2)
		}},
		{"DeleteRange", func(t *testing.T, s raftStore) {
			mustStore(t, s, testLogs(1, 3)...)
			if err := s.DeleteRange(1, 2); err != nil {
				t.Fatal(err)
			}
			wantMissing(t, s, 1)
			wantMissing(t, s, 2)
			wantLog(t, s, testLog(3))
			wantBounds(t, s, 3, 3)
		}},
		{"DeleteSuffix", func(t *testing.T, s raftStore) {
			// How raft drops entries that conflict with its leader's.
			mustStore(t, s, testLogs(1, 5)...)
			if err := s.DeleteRange(4, 5); err != nil {
				t.Fatal(err)
			}
			wantBounds(t, s, 1, 3)
			wantMissing(t, s, 4)
			replaced := testLog(4)
			replaced.Term = 99
			mustStore(t, s, replaced)
			wantLog(t, s, replaced)
			wantBounds(t, s, 1, 4)
		}},
		{"DeleteAll", func(t *testing.T, s raftStore) {
			mustStore(t, s, testLogs(1, 5)...)
			if err := s.DeleteRange(1, 5); err != nil {
				t.Fatal(err)
			}
			wantBounds(t, s, 0, 0)
			mustStore(t, s, testLogs(10, 12)...)
			wantBounds(t, s, 10, 12)
		}},
		{"Overwrite", func(t *testing.T, s raftStore) {
			mustStore(t, s, testLogs(1, 3)...)
			l := testLog(2)
			l.Term, l.Data, l.Extensions = 7, []byte("new"), nil
			mustStore(t, s, l)
			wantLog(t, s, l)
			wantBounds(t, s, 1, 3)
		}},
		{"Set_Get", func(t *testing.T, s raftStore) {
			k, v := []byte("hello"), []byte("world")
			// raft's test for a missing key: the error's text (raft.go,
			// api.go), and no value.
			got, err := s.Get(k)
			if err == nil || err.Error() != "not found" || len(got) != 0 {
				t.Fatalf("Get(missing) = %q, %v; want nothing, \"not found\"", got, err)
			}
			if err := s.Set(k, v); err != nil {
				t.Fatal(err)
			}
			got, err = s.Get(k)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("Get = %q, %v; want %q", got, err, v)
			}
			v2 := []byte("again")
			if err := s.Set(k, v2); err != nil {
				t.Fatal(err)
			}
			if got, err = s.Get(k); err != nil || !bytes.Equal(got, v2) {
				t.Fatalf("Get = %q, %v; want %q", got, err, v2)
			}
		}},
		{"SetUint64_GetUint64", func(t *testing.T, s raftStore) {
			k := []byte("CurrentTerm")
			// raft accepts 0 with no error (InmemStore) or with an error
			// whose text is "not found" (raft-boltdb, and us).
			got, err := s.GetUint64(k)
			if got != 0 || (err != nil && err.Error() != "not found") {
				t.Fatalf("GetUint64(missing) = %d, %v", got, err)
			}
			for _, v := range []uint64{1, 0, 1 << 63, 42} {
				if err := s.SetUint64(k, v); err != nil {
					t.Fatal(err)
				}
				if got, err := s.GetUint64(k); err != nil || got != v {
					t.Fatalf("GetUint64 = %d, %v; want %d", got, err, v)
				}
			}
		}},
		{"HasExistingState", func(t *testing.T, s raftStore) {
			// What raft asks of a fresh store before bootstrapping it.
			snaps := raft.NewInmemSnapshotStore()
			if has, err := raft.HasExistingState(s, s, snaps); err != nil || has {
				t.Fatalf("fresh store: HasExistingState = %v, %v", has, err)
			}
			if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
				t.Fatal(err)
			}
			if has, err := raft.HasExistingState(s, s, snaps); err != nil || !has {
				t.Fatalf("after a term: HasExistingState = %v, %v", has, err)
			}
		}},
	}
	for _, impl := range impls {
		for _, c := range cases {
			t.Run(impl.name+"/"+c.name, func(t *testing.T) {
				c.run(t, impl.open(t))
			})
		}
	}
}
