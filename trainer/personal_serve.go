package trainer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	meshpersonal "github.com/clawmesh/clawmesh/mesh/personal"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/engine/torch"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/personal"
)

// PersonalDir holds the personal jobs while they run, in a trainer's data
// directory; it is emptied when the trainer starts.
const PersonalDir = "personal"

// PersonalConfig is the training of the devices' personal adapters, off
// unless On.
type PersonalConfig struct {
	// On serves the personal adapter protocol (mesh/personal): a member
	// device that names this trainer in its [personal] trainers sends it
	// its own steps, and the trainer trains that device's adapter alone,
	// on its own copy of the shared version the device serves, and sends
	// it back to that device only. The job's steps and adapters are kept
	// only while it runs: never in a round, the aggregate, the batch
	// store or the weights service.
	On bool
	// MaxJobs is how many it trains at once (default 1).
	MaxJobs int
}

// servePersonal starts serving personal jobs.
func (t *Trainer) servePersonal() error {
	srv, err := meshpersonal.Serve(meshpersonal.ServerConfig{Host: t.host, Mesh: t.mesh, Handler: t.trainPersonal,
		TempDir: filepath.Join(t.cfg.DataDir, PersonalDir), MaxJobs: t.cfg.Personal.MaxJobs, Logger: t.cfg.Logger})
	if err != nil {
		return err
	}
	t.personal = srv
	t.log.Info("training personal adapters for the devices that trust this trainer", "jobs_at_once", max(t.cfg.Personal.MaxJobs, 1))
	return nil
}

// trainPersonal trains one device's job on the base this trainer trains
// and its copy of the shared version the job names.
func (t *Trainer) trainPersonal(ctx context.Context, from mesh.PeerID, j core.PersonalJob) (core.PersonalResult, error) {
	j.Shared = ""
	if j.SharedVersion != "" {
		dir, err := t.sharedDir(ctx, j.SharedVersion)
		if err != nil {
			return core.PersonalResult{}, err
		}
		j.Shared = dir
	}
	var cfg group.Config
	var configured bool
	t.group.view(func(s *group.State) { cfg, configured = s.Config.WithDefaults(), s.Configured })
	if !configured {
		return core.PersonalResult{}, fmt.Errorf("%w: this trainer is in no trainers' group yet", meshpersonal.ErrBusy)
	}
	base, err := t.personalBase(cfg.Seed)
	if err != nil {
		return core.PersonalResult{}, err
	}
	o := personal.Options{Base: base, Recipe: cfg.Recipe, Logger: t.log.With("device", from)}
	if w := t.work.w; w.engineID == EngineTorch {
		// The trainer's own engine: a device trusts it with a model too
		// large for the native one.
		o.Engine, o.Torch = personal.EngineTorch, torch.Options{Python: w.python, Device: w.device, GradCheckpoint: w.gradCheckpoint}
	}
	return personal.Train(ctx, o, j)
}

// personalBase is the base model's directory personal training opens:
// the trainer's --base, or for the tiny model (which lives in memory
// only) the group's, drawn from its seed, written once to
// DATA/personal/tiny-SEED.
func (t *Trainer) personalBase(seed uint64) (string, error) {
	if dir := baseDir(t.cfg.Base); dir != "" {
		return dir, nil
	}
	t.tinyMu.Lock()
	defer t.tinyMu.Unlock()
	dir := filepath.Join(t.cfg.DataDir, PersonalDir, "tiny-"+strconv.FormatUint(seed, 10))
	if exists(filepath.Join(dir, modeldir.TokenizerFile)) {
		return dir, nil
	}
	txt, nc, err := modeldir.Tiny()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "tiny-*.tmp")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := native.CreateTiny(tmp, nc, seed); err != nil {
		return "", err
	}
	if err := txt.Tokenizer.Save(filepath.Join(tmp, modeldir.TokenizerFile)); err != nil {
		return "", err
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// sharedDir is this trainer's copy of the certified version named name
// ("v7"), fetched from the other trainers if it has none; an error
// wrapping mesh/personal.ErrUnknownVersion for a name that is no
// certified version of the group's lineage.
func (t *Trainer) sharedDir(ctx context.Context, name string) (string, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(name, "v"), 10, 64)
	if err != nil || "v"+strconv.FormatUint(n, 10) != name {
		return "", fmt.Errorf("%w: %q is not a version's name (v1, v2, ...)", meshpersonal.ErrUnknownVersion, name)
	}
	var v group.Version
	var ok bool
	t.group.view(func(s *group.State) { v, ok = s.Version(n) })
	if !ok || v.Cert == nil {
		return "", fmt.Errorf("%w: %s is no certified version of this trainer's group", meshpersonal.ErrUnknownVersion, name)
	}
	return t.ensureVersion(ctx, v)
}
