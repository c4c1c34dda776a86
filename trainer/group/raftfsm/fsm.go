// Package raftfsm adapts the trainers' replicated state (package group) to
// hashicorp/raft: its FSM applies the committed log entries raft hands
// over to a group.State, snapshots the state as JSON and restores it, and
// tells watchers of every entry applied. Everything that names raft's
// types is here, so that group, and the simulator that runs it, link no
// raft.
package raftfsm

import (
	"encoding/json"
	"io"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/trainer/group"
)

// FSM adapts a group.State to raft: Apply decodes and applies committed
// entries, Snapshot and Restore move the whole state as JSON. Read the
// state only through View.
type FSM struct {
	mu    sync.RWMutex
	st    *group.State
	watch []func(group.Applied)
}

// New returns an FSM over an empty state.
func New() *FSM { return &FSM{st: group.New()} }

// Watch calls fn after every applied entry, in log order, outside the
// state's lock; fn must not block for long.
func (f *FSM) Watch(fn func(group.Applied)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watch = append(f.watch, fn)
}

// View calls fn with the state under a read lock; fn must not keep it.
func (f *FSM) View(fn func(*group.State)) {
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
	e, err := group.DecodeEntry(l.Data)
	f.mu.Lock()
	if err == nil {
		err = f.st.Apply(e, l.Term, l.Index)
	} else {
		f.st.Term, f.st.Index = l.Term, l.Index
	}
	watch := f.watch
	f.mu.Unlock()
	for _, fn := range watch {
		fn(group.Applied{Entry: e, Term: l.Term, Index: l.Index, Err: err})
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
	st, err := group.DecodeState(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
	return nil
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
