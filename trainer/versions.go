package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// The committed adapter versions on disk: where they are kept, packed for
// the wire, fetched from other trainers, checked against the lineage,
// and held for a leader before it commits them.

// AdaptersDir holds the committed adapter versions, one PEFT bundle per
// version (AdaptersDir/v7/), in a trainer's data directory.
const AdaptersDir = "adapters"

func (t *Trainer) versionDir(v uint64) string {
	return filepath.Join(t.cfg.DataDir, AdaptersDir, "v"+strconv.FormatUint(v, 10))
}

// VersionDir is where committed version v's bundle is kept.
func (t *Trainer) VersionDir(v uint64) string { return t.versionDir(v) }

// bundleBytes packs a committed version's bundle for the wire: the config's
// length (4 bytes), the config, then the weights. A version this trainer
// holds but has not installed yet is served too.
func (t *Trainer) bundleBytes(v uint64) ([]byte, error) {
	b, err := packBundle(t.versionDir(v))
	if err == nil {
		return b, nil
	}
	var hash string
	t.group.view(func(s *group.State) {
		if ver, ok := s.Version(v); ok {
			hash = ver.Hash
		}
	})
	if hash != "" {
		if b, err := packBundle(t.heldDir(hash)); err == nil {
			return b, nil
		}
	}
	return nil, &rpcError{Code: codeNotFound, Msg: fmt.Sprintf("no version %d here", v)}
}

func packBundle(dir string) ([]byte, error) {
	cfg, err := os.ReadFile(filepath.Join(dir, adapter.ConfigFile))
	if err != nil {
		return nil, err
	}
	model, err := os.ReadFile(filepath.Join(dir, adapter.WeightsFile))
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4, 4+len(cfg)+len(model))
	binary.BigEndian.PutUint32(out, uint32(len(cfg)))
	out = append(out, cfg...)
	return append(out, model...), nil
}

// ensureVersion makes sure committed version v is on disk with the hash
// the lineage gives it, fetching it from the trainers that have it.
func (t *Trainer) ensureVersion(ctx context.Context, v group.Version) (string, error) {
	dir := t.versionDir(v.Version)
	if h, err := adapter.Hash(dir); err == nil {
		if h == v.Hash {
			return dir, nil
		}
		t.log.Warn("a kept version does not match the lineage: fetching it again", "version", v.Name())
	}
	if held := t.heldDir(v.Hash); exists(held) {
		if h, err := adapter.Hash(held); err == nil && h == v.Hash {
			if err := t.keepVersion(held, v.Version); err == nil {
				return dir, nil
			}
		}
		os.RemoveAll(held)
	}
	// The trainers connected now first (the publisher and the leader
	// first among them), then the others.
	var sources, later []mesh.PeerID
	for _, p := range append([]mesh.PeerID{v.Publisher, t.group.leader()}, t.group.trainerPeers()...) {
		if p == "" || p == t.self || slices.Contains(sources, p) || slices.Contains(later, p) {
			continue
		}
		if t.mesh.Admitted(p) {
			sources = append(sources, p)
		} else {
			later = append(later, p)
		}
	}
	sources = append(sources, later...)
	var errs []error
	for _, p := range sources {
		if p == "" || p == t.self {
			continue
		}
		b, err := t.call(ctx, p, request{Op: opBundle, Version: v.Version}, nil)
		if err == nil {
			err = t.installBundle(b, v)
		}
		if err == nil {
			return dir, nil
		}
		errs = append(errs, fmt.Errorf("from %s: %w", p, err))
		if ctx.Err() != nil {
			break
		}
	}
	return "", fmt.Errorf("trainer: version %s: %w", v.Name(), errors.Join(append(errs, errors.New("no trainer could give it"))...))
}

// installBundle verifies a packed bundle against v's hash and keeps it.
func (t *Trainer) installBundle(b []byte, v group.Version) error {
	tmp, h, err := t.unpackBundle(b)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := t.group.fenceCheck(group.Claim{Version: v.Version, Hash: h, Term: v.Term, Index: v.Index}); err != nil {
		return err
	}
	return t.keepVersion(tmp, v.Version)
}

// unpackBundle writes a packed bundle to a new directory beside the kept
// versions, checks that it reads as a bundle, and returns the directory
// and the bundle's hash.
func (t *Trainer) unpackBundle(b []byte) (dir, hash string, err error) {
	if len(b) < 4 {
		return "", "", errors.New("trainer: short bundle")
	}
	n := int(binary.BigEndian.Uint32(b))
	if n > len(b)-4 {
		return "", "", errors.New("trainer: bad bundle")
	}
	parent := filepath.Join(t.cfg.DataDir, AdaptersDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", "", err
	}
	tmp, err := os.MkdirTemp(parent, ".fetch-")
	if err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err = os.WriteFile(filepath.Join(tmp, adapter.ConfigFile), b[4:4+n], 0o600); err != nil {
		return "", "", err
	}
	if err = os.WriteFile(filepath.Join(tmp, adapter.WeightsFile), b[4+n:], 0o600); err != nil {
		return "", "", err
	}
	if hash, err = adapter.Hash(tmp); err != nil {
		return "", "", err
	}
	if _, err = adapter.Read(tmp); err != nil {
		return "", "", err
	}
	return tmp, hash, nil
}

// heldDir is where a bundle handed over before its commit waits, by hash.
func (t *Trainer) heldDir(hash string) string {
	return filepath.Join(t.cfg.DataDir, AdaptersDir, ".held-"+hash)
}

// hold keeps a bundle the leader hands over before it commits it, so that
// the version outlives the leader (opHold).
func (t *Trainer) hold(hash string, b []byte) error {
	tmp, h, err := t.unpackBundle(b)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if h != hash {
		return fmt.Errorf("trainer: the bundle handed over is %s, not %s", short(h), short(hash))
	}
	dir := t.heldDir(hash)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	atomicfile.SyncDir(filepath.Dir(dir))
	return nil
}

// handOver gives the bundle in dir, about to be committed as version v,
// to the other live trainers, and succeeds once enough of them hold it
// that, with this one, a majority of the voters do: a version the group
// commits is never lost with its leader.
func (t *Trainer) handOver(ctx context.Context, dir string, v uint64, hash string) error {
	servers, err := t.group.configuration()
	if err != nil {
		return err
	}
	voters := 0
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	need := voters / 2
	var peers []mesh.PeerID
	for _, p := range t.group.live() {
		if p != t.self {
			peers = append(peers, p)
		}
	}
	if need == 0 || len(peers) == 0 {
		return nil
	}
	b, err := packBundle(dir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	errs := make(chan error, len(peers))
	for _, p := range peers {
		go func() {
			_, err := t.call(ctx, p, request{Op: opHold, Version: v, Hash: hash}, b)
			errs <- err
		}()
	}
	ok := 0
	var failed []error
	for range peers {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		} else {
			ok++
		}
	}
	if ok < need {
		return fmt.Errorf("trainer: only %d trainers hold v%d, %d needed: %w", ok, v, need, errors.Join(failed...))
	}
	return nil
}

// keepVersion moves a verified bundle directory into place as version v.
func (t *Trainer) keepVersion(tmp string, v uint64) error {
	dir := t.versionDir(v)
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	atomicfile.SyncDir(filepath.Dir(dir))
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
