package trainer

import (
	"context"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// shareVersion puts the current committed version in the weights service,
// so that the devices fetch it: under the manifest the mesh already
// accepted for it, or, on the leader, under one it signs (with the raft
// term and index that committed the version: the fencing token). Version
// 0, the starting adapter, is not shared: devices serve the base model
// until the first trained version.
func (t *Trainer) shareVersion(ctx context.Context) {
	if t.weights == nil {
		return
	}
	var cur group.Version
	var base string
	var ok bool
	t.group.view(func(s *group.State) {
		cur, ok = s.Current()
		base = s.Config.Base
	})
	if !ok || cur.Version == 0 || cur.Version <= t.sharedVersion.Load() || !exists(t.versionDir(cur.Version)) {
		return
	}
	if held := t.weights.Dir().Held(); len(held) > 0 && held[0].Version >= cur.Version {
		t.sharedVersion.Store(held[0].Version)
		return
	}
	b, err := weights.Pack(t.versionDir(cur.Version))
	if err != nil {
		t.log.Warn("packing a version to share", "version", cur.Name(), "err", err)
		return
	}
	m := t.weights.Latest()
	if m == nil || m.Version != cur.Version {
		if !t.group.isLeader() {
			return // the leader signs it; this trainer offers it once it has the manifest
		}
		if m, err = chunks.NewManifest(b); err != nil {
			t.log.Warn("describing a version to share", "version", cur.Name(), "err", err)
			return
		}
		m.MeshID, m.Version, m.Parent, m.Base, m.AdapterHash = t.mesh.MeshID(), cur.Version, cur.Parent, base, cur.Hash
		m.Term, m.Index = cur.Term, cur.Index
		// The version's held-out evaluations travel with it to the devices.
		for _, ev := range cur.Evals {
			m.Evals = append(m.Evals, chunks.Eval{Task: ev.Task, Prompts: ev.Prompts, Passed: ev.Passed, MeanReward: ev.MeanReward})
		}
		err := m.Sign(t.key, t.mesh.Cert(), time.Now())
		if err != nil && len(m.Evals) > 0 {
			// Evaluations a device would refuse must not keep the
			// version from the devices.
			t.log.Warn("a version's evaluations left out of its manifest", "version", cur.Name(), "err", err)
			m.Evals = nil
			err = m.Sign(t.key, t.mesh.Cert(), time.Now())
		}
		if err != nil {
			t.log.Warn("signing a version's manifest", "version", cur.Name(), "err", err)
			return
		}
	}
	if err := t.weights.Publish(ctx, m, b); err != nil {
		t.log.Warn("sharing a version", "version", cur.Name(), "err", err)
		return
	}
	t.sharedVersion.Store(cur.Version)
	t.log.Info("version shared with the devices", "version", cur.Name(), "hash", core.ShortHash(m.AdapterHash), "bundle", core.ShortHash(m.BundleID()), "bytes", m.Size)
	// The devices fetch the newest; a few older ones stay for those that
	// pinned one.
	held := t.weights.Dir().Held()
	for _, old := range held[min(keepShared, len(held)):] {
		if err := t.weights.Dir().Remove(old.BundleID()); err != nil {
			t.log.Warn("removing an old shared version", "version", old.Name(), "err", err)
		}
	}
}

// keepShared is how many of the newest versions a trainer keeps serving.
const keepShared = 3
