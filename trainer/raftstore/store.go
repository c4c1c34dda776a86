// Package raftstore keeps a hashicorp/raft node's log and stable state in
// one Pebble database: Store implements raft.LogStore and raft.StableStore.
//
// Every write (StoreLogs, DeleteRange, Set, SetUint64) is committed with
// pebble.Sync before it returns, as raft requires before it acknowledges
// anything. Log entries live under their big-endian index, so the database
// keeps them in index order, and FirstIndex and LastIndex are answered from
// memory: the bounds are read from disk at Open and kept up to date by
// every write. Errors that raft itself inspects (raft.ErrLogNotFound, the
// "not found" of a missing stable key) are returned exactly as raft expects
// them; see GetLog and Get.
//
// Store does not implement raft.MonotonicLogStore. That interface is for
// stores that cannot hold a gap between indexes; this one can (entries are
// independent keys, and the bounds are exact across gaps), and saying
// IsMonotonic would only make raft delete the whole log after every
// snapshot it installs or restores, where otherwise it keeps its trailing
// logs as it does with raft-boltdb, the path raft's users run most.
package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/internal/pebblelock"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrLocked: the directory is held by another Store, in this process
	// or another.
	ErrLocked = errors.New("raftstore: directory locked by another store")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("raftstore: closed")
	// ErrCorrupt: a stored value or key cannot be decoded.
	ErrCorrupt = errors.New("raftstore: corrupt entry")
	// ErrInvalid: a write raft would never make (a log at index 0).
	ErrInvalid = errors.New("raftstore: invalid write")
	// ErrKeyNotFound is what Get and GetUint64 return for a key never set.
	// Its text is exactly "not found", without our package prefix, and it is
	// returned unwrapped, because raft v1.8.0 recognises a missing key by
	// err.Error() == "not found" (NewRaft and HasExistingState reading
	// CurrentTerm, requestVote reading LastVoteTerm and LastVoteCand); any
	// other error there fails NewRaft on a fresh store. The text and the
	// behaviour are raft-boltdb's, and raft.InmemStore's Get says the same.
	ErrKeyNotFound = errors.New("not found")
)

// Key prefixes: log entries sort under 'l' by index, stable keys under 's'.
const (
	prefixLog    = 'l'
	prefixStable = 's'
	logKeyLen    = 1 + 8
)

var (
	logLower = []byte{prefixLog}
	logUpper = []byte{prefixLog + 1}
)

func logKey(index uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixLog}, index)
}

func stableKey(key []byte) []byte {
	return append([]byte{prefixStable}, key...)
}

// Options configure a Store. The zero value means defaults.
type Options struct {
	// Logger receives Pebble's logs (its informational ones at debug
	// level). Nil discards them.
	Logger *slog.Logger
	// FS is the filesystem Pebble runs on. Nil means the disk.
	// vfs.NewMem() is for tests only.
	FS vfs.FS
}

// Store is raft's LogStore and StableStore on one Pebble database. It is
// safe for concurrent use.
type Store struct {
	db   *pebble.DB
	lock *pebble.Lock
	log  *slog.Logger

	// life guards closed: operations hold it shared while they run, Close
	// takes it exclusively, so nothing touches a closed database.
	life   sync.RWMutex
	closed bool

	// logMu serializes the log writes (StoreLogs, DeleteRange), each a
	// commit and then an update of bounds, so that bounds always follows
	// the database. Raft writes logs from its main loop and compacts them
	// from its snapshot goroutine, so the two do meet.
	logMu sync.Mutex
	// bounds holds the first and last stored index ({0, 0} when there are
	// none), replaced whole so that a reader sees the two together.
	bounds atomic.Pointer[bounds]
}

type bounds struct{ first, last uint64 }

var (
	_ raft.LogStore    = (*Store)(nil)
	_ raft.StableStore = (*Store)(nil)
)

// Open opens (creating if needed) the store in dir. If another Store holds
// dir, Open fails at once with an error wrapping ErrLocked.
func Open(dir string, o Options) (*Store, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "raftstore")
	fs := o.FS
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	// Take Pebble's directory lock ourselves so that a held lock is
	// recognised and reported as ErrLocked (a non-blocking fcntl lock: this
	// never waits).
	lock, err := pebble.LockDirectory(dir, fs)
	if err != nil {
		if pebblelock.Held(err) {
			return nil, fmt.Errorf("%w: %s: %v", ErrLocked, dir, err)
		}
		return nil, fmt.Errorf("raftstore: lock %s: %w", dir, err)
	}
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, Lock: lock, Logger: pebbleLogger{log}})
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	s := &Store{db: db, lock: lock, log: log}
	b, err := s.scanBounds()
	if err != nil {
		_ = db.Close()
		_ = lock.Close()
		return nil, err
	}
	s.bounds.Store(&b)
	log.Debug("opened", "dir", dir, "first", b.first, "last", b.last)
	return s, nil
}

// Close closes the database and releases the directory. Operations in
// progress finish first; later ones return ErrClosed.
func (s *Store) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	err := s.db.Close()
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	if err != nil {
		return fmt.Errorf("raftstore: close: %w", err)
	}
	return nil
}

// enter starts an operation; the returned function ends it.
func (s *Store) enter() (func(), error) {
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return nil, ErrClosed
	}
	return s.life.RUnlock, nil
}

// scanBounds reads the first and last stored index from the database.
func (s *Store) scanBounds() (bounds, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: logLower, UpperBound: logUpper})
	if err != nil {
		return bounds{}, fmt.Errorf("raftstore: %w", err)
	}
	defer it.Close()
	var b bounds
	if it.First() {
		if b.first, err = keyIndex(it.Key()); err != nil {
			return bounds{}, err
		}
		if !it.Last() {
			return bounds{}, fmt.Errorf("raftstore: log has a first entry but no last")
		}
		if b.last, err = keyIndex(it.Key()); err != nil {
			return bounds{}, err
		}
	}
	if err := it.Error(); err != nil {
		return bounds{}, fmt.Errorf("raftstore: %w", err)
	}
	return b, nil
}

func keyIndex(k []byte) (uint64, error) {
	if len(k) != logKeyLen {
		return 0, fmt.Errorf("%w: log key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}

// FirstIndex returns the lowest stored index, 0 if there is none. It is
// answered from memory.
func (s *Store) FirstIndex() (uint64, error) {
	done, err := s.enter()
	if err != nil {
		return 0, err
	}
	defer done()
	return s.bounds.Load().first, nil
}

// LastIndex returns the highest stored index, 0 if there is none. It is
// answered from memory.
func (s *Store) LastIndex() (uint64, error) {
	done, err := s.enter()
	if err != nil {
		return 0, err
	}
	defer done()
	return s.bounds.Load().last, nil
}

// GetLog reads the entry at index into l. A missing entry is
// raft.ErrLogNotFound itself, unwrapped: raft's replication compares with
// == (replication.go) to decide that a follower needs a snapshot.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	done, err := s.enter()
	if err != nil {
		return err
	}
	defer done()
	v, closer, err := s.db.Get(logKey(index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raftstore: get log %d: %w", index, err)
	}
	defer closer.Close()
	if err := decodeLog(v, l); err != nil {
		return fmt.Errorf("raftstore: log %d: %w", index, err)
	}
	if l.Index != index {
		return fmt.Errorf("%w: log %d holds index %d", ErrCorrupt, index, l.Index)
	}
	return nil
}

// StoreLog stores one entry; see StoreLogs.
func (s *Store) StoreLog(l *raft.Log) error {
	return s.StoreLogs([]*raft.Log{l})
}

// StoreLogs stores entries in one batch, replacing any at the same indexes,
// and returns once the batch is synced. The indexes need not be
// contiguous with what is stored.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	done, err := s.enter()
	if err != nil {
		return err
	}
	defer done()
	wb := s.db.NewBatch()
	defer wb.Close()
	lo, hi := uint64(math.MaxUint64), uint64(0)
	var buf []byte
	for _, l := range logs {
		if l.Index == 0 {
			return fmt.Errorf("%w: log index 0", ErrInvalid)
		}
		lo, hi = min(lo, l.Index), max(hi, l.Index)
		if n := encodedLen(l); cap(buf) < n {
			buf = make([]byte, 0, n)
		}
		// Set copies key and value into the batch, so buf is reused.
		buf = appendLog(buf[:0], l)
		if err := wb.Set(logKey(l.Index), buf, nil); err != nil {
			return fmt.Errorf("raftstore: %w", err)
		}
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	if err := wb.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: store logs: %w", err)
	}
	b := *s.bounds.Load()
	if b.first == 0 || lo < b.first {
		b.first = lo
	}
	b.last = max(b.last, hi)
	s.bounds.Store(&b)
	return nil
}

// DeleteRange deletes the entries from lo to hi inclusive with one range
// deletion, synced. A range with lo > hi deletes nothing.
func (s *Store) DeleteRange(lo, hi uint64) error {
	if lo > hi {
		return nil
	}
	done, err := s.enter()
	if err != nil {
		return err
	}
	defer done()
	end := logUpper
	if hi < math.MaxUint64 {
		end = logKey(hi + 1)
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	b := *s.bounds.Load()
	if b.last == 0 || hi < b.first || lo > b.last {
		return nil // nothing stored in the range
	}
	wb := s.db.NewBatch()
	defer wb.Close()
	if err := wb.DeleteRange(logKey(lo), end, nil); err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	if err := wb.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: delete logs %d-%d: %w", lo, hi, err)
	}
	if lo > b.first && hi < b.last {
		return nil // a hole: both ends stay
	}
	// An end was cut: find the new ones on disk, where entries beyond a gap
	// may lie (two seeks; the range deletion lets the iterator skip what it
	// covers).
	nb, err := s.scanBounds()
	if err != nil {
		return err
	}
	s.bounds.Store(&nb)
	return nil
}

// Set stores val under key, synced.
func (s *Store) Set(key, val []byte) error {
	done, err := s.enter()
	if err != nil {
		return err
	}
	defer done()
	if err := s.db.Set(stableKey(key), val, pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: set %q: %w", key, err)
	}
	return nil
}

// Get returns a copy of the value under key. For a key never set it
// returns nil and ErrKeyNotFound, unwrapped (see ErrKeyNotFound). A key
// set to an empty value returns an empty, non-nil slice.
func (s *Store) Get(key []byte) ([]byte, error) {
	done, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	v, closer, err := s.db.Get(stableKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: get %q: %w", key, err)
	}
	defer closer.Close()
	return append([]byte{}, v...), nil
}

// SetUint64 stores val under key (as 8 big-endian bytes, in the same key
// space as Set), synced.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns the value SetUint64 stored under key. For a key never
// set it returns 0 and ErrKeyNotFound, as raft-boltdb does; raft accepts
// that (it checks the text, see ErrKeyNotFound) as well as raft.InmemStore's
// 0 and nil.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: %q holds %d bytes, not a uint64", ErrCorrupt, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// pebbleLogger routes Pebble's logs to slog.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "from", "pebble")
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...), "from", "pebble")
}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error(msg, "from", "pebble")
	panic("pebble: " + msg)
}
