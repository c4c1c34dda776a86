package group

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// Applied describes one entry as the FSM applied it.
type Applied struct {
	Entry       *Entry
	Term, Index uint64
	Err         error
}

// FSM adapts a State to raft: Apply decodes and applies committed entries,
// Snapshot and Restore move the whole state as JSON. Read the state only
// through View.
type FSM struct {
	mu    sync.RWMutex
	st    *State
	watch []func(Applied)
}

// NewFSM returns an FSM over an empty state.
func NewFSM() *FSM { return &FSM{st: New()} }

// Watch calls fn after every applied entry, in log order, outside the
// state's lock; fn must not block for long.
func (f *FSM) Watch(fn func(Applied)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watch = append(f.watch, fn)
}

// View calls fn with the state under a read lock; fn must not keep it.
func (f *FSM) View(fn func(*State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.st)
}

// Apply implements raft.FSM. It returns the entry's error (nil when it was
// applied), which the proposer reads from the future's Response.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	e, err := DecodeEntry(l.Data)
	f.mu.Lock()
	if err == nil {
		err = f.st.Apply(e, l.Term, l.Index)
	} else {
		f.st.Term, f.st.Index = l.Term, l.Index
	}
	watch := f.watch
	f.mu.Unlock()
	for _, fn := range watch {
		fn(Applied{Entry: e, Term: l.Term, Index: l.Index, Err: err})
	}
	return err
}

// Snapshot implements raft.FSM.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	b, err := json.Marshal(f.st)
	if err != nil {
		return nil, err
	}
	return snapshot(b), nil
}

// Restore implements raft.FSM.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st := New()
	if err := json.NewDecoder(rc).Decode(st); err != nil {
		return fmt.Errorf("group: restore: %w", err)
	}
	st.fill()
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
	return nil
}

// fill makes the maps a decoded state may lack.
func (s *State) fill() {
	if s.Batches == nil {
		s.Batches = map[core.BatchID]*Batch{}
	}
	if s.Trainers == nil {
		s.Trainers = map[mesh.PeerID]*Trainer{}
	}
	if s.Revoked == nil {
		s.Revoked = map[mesh.PeerID]string{}
	}
	if s.Counts == nil {
		s.Counts = map[Status]int{}
	}
	if s.Refusals == nil {
		s.Refusals = map[string]int{}
	}
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (snapshot) Release() {}
