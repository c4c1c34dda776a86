package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustStore(t, s, testLogs(1, 60)...)
	mustStore(t, s, testLogs(61, 100)...)
	if err := s.DeleteRange(1, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("node-1")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LastIndex(); !errors.Is(err, ErrClosed) {
		t.Fatalf("LastIndex after Close = %v, want ErrClosed", err)
	}
	if err := s.GetLog(50, new(raft.Log)); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetLog after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}

	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantBounds(t, s, 11, 100)
	for i := uint64(1); i <= 10; i++ {
		wantMissing(t, s, i)
	}
	for i := uint64(11); i <= 100; i++ {
		wantLog(t, s, testLog(i))
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-1" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("GetUint64 = %d, %v", v, err)
	}
}

// TestCrash shows every write synced before it returns: a crash clone of
// the filesystem taken right after each write, which keeps exactly what
// was synced, holds it.
func TestCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, err := Open("db", Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	steps := []struct {
		name        string
		write       func() error
		first, last uint64
		term        uint64 // 0: not set yet
		cand        string // "": not set yet
	}{
		{"StoreLogs", func() error { return s.StoreLogs(testLogs(1, 20)) }, 1, 20, 0, ""},
		{"StoreLog", func() error { return s.StoreLog(testLog(21)) }, 1, 21, 0, ""},
		{"DeleteRange", func() error { return s.DeleteRange(1, 5) }, 6, 21, 0, ""},
		{"SetUint64", func() error { return s.SetUint64([]byte("CurrentTerm"), 3) }, 6, 21, 3, ""},
		{"Set", func() error { return s.Set([]byte("LastVoteCand"), []byte("n1")) }, 6, 21, 3, "n1"},
	}
	for _, st := range steps {
		if err := st.write(); err != nil {
			t.Fatal(err)
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{})
		t.Run(st.name, func(t *testing.T) {
			c, err := Open("db", Options{FS: crashed})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wantBounds(t, c, st.first, st.last)
			wantMissing(t, c, st.first-1)
			for i := st.first; i <= st.last; i++ {
				wantLog(t, c, testLog(i))
			}
			term, err := c.GetUint64([]byte("CurrentTerm"))
			if term != st.term || (st.term != 0 && err != nil) {
				t.Fatalf("GetUint64 = %d, %v; want %d", term, err, st.term)
			}
			cand, err := c.Get([]byte("LastVoteCand"))
			if string(cand) != st.cand || (st.cand != "" && err != nil) {
				t.Fatalf("Get = %q, %v; want %q", cand, err, st.cand)
			}
		})
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s2, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s.Close()
}

// TestBoundsAcrossGaps: the bounds are exact where the stored indexes have
// gaps (raft.InmemStore only guesses max+1 there).
func TestBoundsAcrossGaps(t *testing.T) {
	s := openTemp(t)
	mustStore(t, s, testLogs(1, 10)...)
	mustStore(t, s, testLogs(20, 30)...)
	mustStore(t, s, testLogs(40, 40)...)
	wantBounds(t, s, 1, 40)

	steps := []struct {
		lo, hi      uint64
		first, last uint64
	}{
		{12, 15, 1, 40},  // inside a gap
		{25, 27, 1, 40},  // a hole
		{1, 10, 20, 40},  // a prefix up to a gap
		{31, 50, 20, 30}, // a suffix across a gap
		{5, 2, 20, 30},   // lo > hi: nothing
		{0, 20, 21, 30},  // from 0
		{29, math.MaxUint64, 21, 28},
		{21, 28, 0, 0},
		{1, 100, 0, 0}, // an empty store
	}
	for _, st := range steps {
		if err := s.DeleteRange(st.lo, st.hi); err != nil {
			t.Fatal(err)
		}
		wantBounds(t, s, st.first, st.last)
	}

	// Stores below the first index lower it.
	mustStore(t, s, testLog(50))
	mustStore(t, s, testLog(45))
	wantBounds(t, s, 45, 50)
	wantLog(t, s, testLog(45))
}

func TestStoreInvalid(t *testing.T) {
	s := openTemp(t)
	if err := s.StoreLogs([]*raft.Log{testLog(1), {Index: 0}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("StoreLogs with index 0 = %v, want ErrInvalid", err)
	}
	// The batch is all or nothing.
	wantMissing(t, s, 1)
	wantBounds(t, s, 0, 0)
	if err := s.StoreLogs(nil); err != nil {
		t.Fatal(err)
	}
}

func TestStableEdges(t *testing.T) {
	s := openTemp(t)
	// A key set empty is there, and empty.
	if err := s.Set([]byte("k"), nil); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get([]byte("k")); err != nil || v == nil || len(v) != 0 {
		t.Fatalf("Get(empty) = %#v, %v", v, err)
	}
	// Not a uint64.
	if _, err := s.GetUint64([]byte("k")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("GetUint64 of 0 bytes = %v, want ErrCorrupt", err)
	}
	// The missing-key error is raft-boltdb's, unwrapped.
	if _, err := s.GetUint64([]byte("none")); err != ErrKeyNotFound {
		t.Fatalf("GetUint64(missing) = %v", err)
	}
	// Stable keys and log entries do not meet, whatever the key.
	mustStore(t, s, testLog(1))
	key := logKey(1)
	if err := s.Set(key, []byte("x")); err != nil {
		t.Fatal(err)
	}
	wantLog(t, s, testLog(1))
	wantBounds(t, s, 1, 1)
	// Get returns a copy.
	v, _ := s.Get(key)
	v[0] = 'y'
	if v2, _ := s.Get(key); !bytes.Equal(v2, []byte("x")) {
		t.Fatalf("Get after changing its result = %q", v2)
	}
}

func TestGetLogCorrupt(t *testing.T) {
	s := openTemp(t)
	// An entry filed under the wrong index.
	buf := appendLog(nil, testLog(2))
	if err := s.db.Set(logKey(1), buf, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.GetLog(1, new(raft.Log)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("GetLog of a misfiled entry = %v, want ErrCorrupt", err)
	}
	if err := s.db.Set(logKey(3), buf[:len(buf)-1], nil); err != nil {
		t.Fatal(err)
	}
	if err := s.GetLog(3, new(raft.Log)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("GetLog of a truncated entry = %v, want ErrCorrupt", err)
	}
}

// TestConcurrent runs raft's pattern under -race: one goroutine appends,
// one compacts the head, readers read the bounds and entries, others use
// the stable store. Every entry read must be the one written at its index,
// and neither bound ever moves back.
func TestConcurrent(t *testing.T) {
	s := openTemp(t)
	const (
		batches = 100
		perB    = 8
		last    = batches * perB
		readers = 4
		maxIter = 1_000_000
	)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, readers+3)
	wg.Go(func() {
		defer close(stop)
		for b := range uint64(batches) {
			if err := s.StoreLogs(testLogs(b*perB+1, (b+1)*perB)); err != nil {
				errc <- err
				return
			}
		}
	})
	wg.Go(func() {
		for range maxIter {
			select {
			case <-stop:
				return
			default:
			}
			l, _ := s.LastIndex()
			if l > 64 {
				if err := s.DeleteRange(1, l-64); err != nil {
					errc <- err
					return
				}
			}
		}
	})
	wg.Go(func() {
		for i := range uint64(200) {
			if err := s.SetUint64([]byte("term"), i); err != nil {
				errc <- err
				return
			}
			if err := s.Set([]byte(fmt.Sprint("k", i%4)), []byte("v")); err != nil {
				errc <- err
				return
			}
		}
	})
	for range readers {
		wg.Go(func() {
			var lastFirst, lastLast uint64
			for range maxIter {
				select {
				case <-stop:
					return
				default:
				}
				f, _ := s.FirstIndex()
				l, _ := s.LastIndex()
				if f < lastFirst || l < lastLast {
					errc <- fmt.Errorf("bounds moved back: [%d, %d] after [%d, %d]", f, l, lastFirst, lastLast)
					return
				}
				lastFirst, lastLast = f, l
				if l == 0 {
					continue
				}
				idx := f + (l-f)/2
				var got raft.Log
				err := s.GetLog(idx, &got)
				if err == raft.ErrLogNotFound && idx < l {
					continue // compacted since we read the bounds
				}
				if err != nil {
					errc <- fmt.Errorf("GetLog(%d) in [%d, %d]: %v", idx, f, l, err)
					return
				}
				if !sameLog(&got, testLog(idx)) {
					errc <- fmt.Errorf("GetLog(%d) = %+v", idx, got)
					return
				}
				if _, err := s.GetUint64([]byte("term")); err != nil && err != ErrKeyNotFound {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if l, _ := s.LastIndex(); l != last {
		t.Fatalf("LastIndex %d, want %d", l, last)
	}
	// The bounds in memory are the ones on disk.
	f, _ := s.FirstIndex()
	disk, err := s.scanBounds()
	if err != nil {
		t.Fatal(err)
	}
	if disk != (bounds{f, last}) {
		t.Fatalf("bounds in memory [%d, %d], on disk %+v", f, last, disk)
	}
}
