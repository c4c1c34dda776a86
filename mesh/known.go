package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// MaxKnown bounds the peers DATA/mesh/members.json keeps: past it, the one
// seen longest ago is forgotten.
const MaxKnown = 1024

// knownRefresh is how stale a known peer's Seen may grow before an
// admission writes it again: the file is written when a peer is new to it,
// not at every exchange.
const knownRefresh = time.Hour

// Known is a peer this device admitted or issued a certificate to, as
// DATA/mesh/members.json keeps it: what `mesh revoke` checks a peer id
// against, so that a typo is not spread across the mesh as a revocation.
type Known struct {
	PeerID PeerID `json:"peer_id"`
	Role   string `json:"role"`
	// Issued is set when this device issued the peer's certificate (it
	// redeemed one of this device's invites).
	Issued bool `json:"issued,omitempty"`
	// Seen is when it was last admitted here, or its certificate issued.
	Seen time.Time `json:"seen"`
}

type knownFile struct {
	Peers []Known `json:"peers"`
}

func knownPath(dataDir string) string { return filepath.Join(dataDir, Dir, "members.json") }

// LoadKnown reads the peers this device knows (none if the file is
// missing), MaxKnown at most.
func LoadKnown(dataDir string) (map[PeerID]Known, error) {
	out := map[PeerID]Known{}
	b, err := os.ReadFile(knownPath(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("mesh: %w", err)
	}
	var f knownFile
	if err := json.Unmarshal(b, &f); err != nil {
		return out, fmt.Errorf("mesh: %s is damaged: %v", knownPath(dataDir), err)
	}
	for _, k := range f.Peers {
		if k.PeerID != "" && len(out) < MaxKnown {
			out[k.PeerID] = k
		}
	}
	return out, nil
}

// saveKnown writes the known peers, newest first.
func saveKnown(dataDir string, known []Known) error {
	slices.SortFunc(known, func(a, b Known) int { return b.Seen.Compare(a.Seen) })
	b, err := json.MarshalIndent(knownFile{Peers: known}, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(knownPath(dataDir), append(b, '\n'))
}

// remember records p as known (admitted, or issued a certificate when
// issued), and writes the record if that is news.
func (m *Mesh) remember(p PeerID, role string, issued bool) {
	now := m.now().UTC()
	m.mu.Lock()
	k, ok := m.known[p]
	news := !ok || k.Role != role || issued && !k.Issued || now.Sub(k.Seen) > knownRefresh
	if !news {
		m.mu.Unlock()
		return
	}
	k = Known{PeerID: p, Role: role, Issued: issued || k.Issued, Seen: now}
	m.known[p] = k
	if len(m.known) > MaxKnown {
		var oldest PeerID
		for q, o := range m.known {
			if q != p && (oldest == "" || o.Seen.Before(m.known[oldest].Seen)) {
				oldest = q
			}
		}
		delete(m.known, oldest)
	}
	m.mu.Unlock()
	// Snapshot and write under knownMu, so that writes land in order.
	m.knownMu.Lock()
	defer m.knownMu.Unlock()
	m.mu.Lock()
	all := make([]Known, 0, len(m.known))
	for _, k := range m.known {
		all = append(all, k)
	}
	m.mu.Unlock()
	if err := saveKnown(m.cfg.DataDir, all); err != nil {
		m.log.Warn("saving the known members", "err", err)
	}
}

// Known reports whether this device knows p: it admitted it (now or
// before) or issued its certificate.
func (m *Mesh) Known(p PeerID) (Known, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.known[p]; ok {
		return k, true
	}
	if pe, ok := m.admitted[p]; ok {
		return Known{PeerID: p, Role: pe.Cert.Role().String(), Seen: pe.Since}, true
	}
	return Known{}, false
}
