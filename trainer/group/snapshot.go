package group

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// A snapshot of the state is its JSON encoding (json.Marshal of a State).

// DecodeState reads a state from a snapshot: the first JSON value r
// holds, with the maps it lacks made empty.
func DecodeState(r io.Reader) (*State, error) {
	st := New()
	if err := json.NewDecoder(r).Decode(st); err != nil {
		return nil, fmt.Errorf("group: restore: %w", err)
	}
	st.fill()
	return st, nil
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
