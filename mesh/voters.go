package mesh

import (
	"crypto/ed25519"
	"fmt"
	"sync"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// voterState is the newest voter set this peer has verified: the admin's
// word on which trainers vote in the trainers' group and certify versions.
type voterState struct {
	mu      sync.Mutex
	set     *member.VoterSet // nil: none seen
	changed chan struct{}    // closed when set changes
}

// Voters returns the newest voter set this peer knows (nil: none yet).
func (m *Mesh) Voters() *member.VoterSet {
	m.voters.mu.Lock()
	defer m.voters.mu.Unlock()
	return m.voters.set
}

// VotersChanged returns a channel closed when the voter set next changes.
func (m *Mesh) VotersChanged() <-chan struct{} {
	m.voters.mu.Lock()
	defer m.voters.mu.Unlock()
	if m.voters.changed == nil {
		m.voters.changed = make(chan struct{})
	}
	return m.voters.changed
}

// AdoptVoters takes vs as the voter set in force if the mesh's admin
// signed it and it is newer than the one known. It says whether it did.
func (m *Mesh) AdoptVoters(vs *member.VoterSet) (bool, error) {
	if vs == nil {
		return false, nil
	}
	if err := vs.Verify(m.admin); err != nil {
		return false, fmt.Errorf("mesh: voter set %d: %w", vs.Seq(), err)
	}
	m.voters.mu.Lock()
	defer m.voters.mu.Unlock()
	if !m.voters.set.Newer(vs) {
		return false, nil
	}
	m.voters.set = vs
	if m.voters.changed != nil {
		close(m.voters.changed)
		m.voters.changed = nil
	}
	return true, nil
}

// Sign signs msg with this peer's identity key, the one its certificate
// certifies: for protocols that build on the mesh's identities (a
// trainer's signed deltas, a voter's votes). Each such protocol prefixes
// what it signs with its own context.
func (m *Mesh) Sign(msg []byte) []byte { return ed25519.Sign(m.cfg.Key, msg) }
