package trainer

import (
	"bytes"
	"context"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// shareVersion puts the newest committed version in the weights service,
// so that the devices fetch it, once the mesh's voters certified it under
// the voter set in force: every trainer builds the same manifest from its
// copy of the version and the group's log, attaches the votes the log
// recorded and signs it. Version 0, the starting adapter, is not shared:
// devices serve the base model until the first trained version.
func (t *Trainer) shareVersion(ctx context.Context) {
	if t.weights == nil {
		return
	}
	var cur group.Version
	var ok bool
	t.group.view(func(s *group.State) { cur, ok = s.Current() })
	vs := t.mesh.Voters()
	if !ok || cur.Version == 0 || cur.Cert == nil || vs == nil || !bytes.Equal(cur.Cert.Voters, vs.Marshal()) || !exists(t.versionDir(cur.Version)) {
		return
	}
	key := voteKey(cur, vs)
	if t.sharedKey.Load() == key {
		return
	}
	m, b, err := t.versionManifest(cur, t.versionDir(cur.Version))
	if err != nil {
		t.log.Warn("describing a version to share", "version", cur.Name(), "err", err)
		return
	}
	if !certifyWith(m, vs, cur.Cert.Votes) {
		t.log.Warn("a version's recorded votes do not certify this trainer's copy of it", "version", cur.Name())
		return
	}
	if err := m.Sign(t.key, t.mesh.Cert(), time.Now()); err != nil {
		t.log.Warn("signing a version's manifest", "version", cur.Name(), "err", err)
		return
	}
	if err := t.weights.Publish(ctx, m, b); err != nil {
		t.log.Warn("sharing a version", "version", cur.Name(), "err", err)
		return
	}
	t.sharedKey.Store(key)
	t.sharedVersion.Store(cur.Version)
	t.log.Info("version shared with the devices", "version", cur.Name(), "hash", core.ShortHash(m.AdapterHash), "bundle", core.ShortHash(m.BundleID()), "bytes", m.Size,
		"votes", len(m.Cert.Votes), "voter_set", vs.Seq())
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
