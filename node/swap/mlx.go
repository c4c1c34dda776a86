package swap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/clawmesh/clawmesh/model/mlx"
)

// mlxDriver drives mlx_lm.server (mlx-lm's OpenAI-compatible server on
// Apple silicon), which holds one model and loads an adapter per request:
// a request naming its "model" and an "adapters" directory is served by
// that model with that adapter, loaded then (mlx_lm/server.py:
// APIHandler.do_POST reads body["adapters"]; ModelProvider.load reloads
// the model whenever (model, adapters) differs from the last request's).
// A request without "model" gets the server's own --model and
// --adapter-path whatever its "adapters" says (ModelProvider.load maps
// "default_model" to both), so every Target names the base model.
//
// mlx-lm reads its own adapter layout (adapters.safetensors +
// adapter_config.json, model/mlx), not PEFT's: Load writes the version's
// mlx-lm copy beside its directory (DIR.mlx, an absolute path, since the
// server resolves it against its own working directory) and returns a
// Target whose Fields set "adapters" to it. The server must see the
// node's files at that path (the usual case: it runs on the same Mac).
//
// API (mlx_lm/server.py): POST /v1/chat/completions, OpenAI's shape plus
// "adapters"; the reply's "model" echoes the request's. A load that fails
// (FileNotFoundError "The adapter path does not exist", ValueError
// "contains incompatible tensors", an unknown model) is answered 404
// {"error": "<message>"} (APIHandler.handle_completion). GET /v1/models
// lists the server's --model (as an absolute path) and the mlx models in
// the Hugging Face cache.
type mlxDriver struct {
	*client
	mu sync.Mutex // one copy written at a time
}

// mlxSuffix ends the name of the mlx-lm copy of a version's directory.
const mlxSuffix = ".mlx"

// mlxDir is where the mlx-lm copy of the PEFT directory abs goes.
func mlxDir(abs string) string { return filepath.Clean(abs) + mlxSuffix }

// Load implements Driver: it writes the version's mlx-lm copy and returns
// the Target that names it; the server loads it on the first request
// routed there (Warm's).
func (d *mlxDriver) Load(ctx context.Context, version, dir string) (Target, error) {
	if err := checkVersion(version); err != nil {
		return Target{}, err
	}
	abs, _, err := readAdapter(dir)
	if err != nil {
		return Target{}, err
	}
	base, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	out, err := d.write(abs)
	if err != nil {
		return Target{}, err
	}
	fields, err := json.Marshal(map[string]string{"adapters": out})
	if err != nil {
		return Target{}, err
	}
	t := Target{Version: version, Model: base, Fields: string(fields)}
	d.log.Debug("loaded", "target", t, "adapters", out)
	return t, nil
}

// write exports the PEFT directory abs to its mlx-lm copy (through a
// temporary directory renamed into place, replacing an older copy), and
// removes the copies whose PEFT directory is gone (versions the node
// pruned, which nothing routes to any more).
func (d *mlxDriver) write(abs string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := mlxDir(abs)
	parent := filepath.Dir(out)
	tmp, err := os.MkdirTemp(parent, ".mlx-"+filepath.Base(abs)+"-")
	if err != nil {
		return "", fmt.Errorf("%w: writing the mlx-lm copy beside %s: %v", ErrAdapter, abs, err)
	}
	defer os.RemoveAll(tmp)
	if err := mlx.Export(abs, tmp); err != nil {
		if errors.Is(err, mlx.ErrUnsupported) {
			return "", fmt.Errorf("%w: mlx-lm cannot load %s: %v", ErrRefused, abs, err)
		}
		return "", fmt.Errorf("%w: %v", ErrAdapter, err)
	}
	if err := os.RemoveAll(out); err != nil {
		return "", fmt.Errorf("%w: replacing %s: %v", ErrAdapter, out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("%w: %v", ErrAdapter, err)
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		name := e.Name()
		peft, ours := strings.CutSuffix(name, mlxSuffix)
		stale := strings.HasPrefix(name, ".mlx-") // an interrupted write
		if ours && peft != "" {
			_, err := os.Stat(filepath.Join(parent, peft))
			stale = errors.Is(err, os.ErrNotExist) && isMLXCopy(filepath.Join(parent, name))
		}
		if stale && e.IsDir() {
			if err := os.RemoveAll(filepath.Join(parent, name)); err != nil {
				d.log.Debug("removing a stale mlx-lm copy", "dir", name, "err", err)
			}
		}
	}
	return out, nil
}

// isMLXCopy reports whether dir looks like a copy write made: mlx-lm's
// weights file, and no PEFT one (never a version's own directory).
func isMLXCopy(dir string) bool {
	_, errW := os.Stat(filepath.Join(dir, mlx.WeightsFile))
	_, errP := os.Stat(filepath.Join(dir, weightsFile))
	return errW == nil && errors.Is(errP, os.ErrNotExist)
}

// Base implements Driver: the base model by name, with no adapter.
func (d *mlxDriver) Base(ctx context.Context) (Target, error) {
	base, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	return Target{Version: BaseVersion, Model: base}, nil
}

// Warm implements Driver: one one-token chat completion with t's model and
// fields. The server loads the adapter to answer it, so an answer is
// proof that it loaded; the reply must echo t's model.
func (d *mlxDriver) Warm(ctx context.Context, t Target) error {
	model := t.Model
	if model == "" {
		var err error
		if model, err = d.baseModel(ctx); err != nil {
			return err
		}
	}
	r, cr, err := d.chat(ctx, t, model)
	if err != nil {
		if r != nil && strings.Contains(r.message(), "not supported in distributed mode") {
			// ModelProvider._load refuses adapters when the server runs
			// over several machines (mlx.launch).
			return fmt.Errorf("%w: mlx_lm.server runs distributed, where it loads no adapters: run it on one machine to serve version %s (%s)", ErrUnsupported, t.Version, r.message())
		}
		if r != nil && strings.Contains(r.message(), "adapter path does not exist") {
			return fmt.Errorf("%w (mlx_lm.server must see the node's files at the same path: run it on the same machine)", err)
		}
		return err
	}
	if cr.Model != model {
		return fmt.Errorf("%w: version %s: asked for model %q, answered by %q", ErrWarm, t.Version, model, cr.Model)
	}
	d.log.Debug("warm", "target", t)
	return nil
}

// Unload implements Driver: the server frees an adapter when a request
// names another, and a request sent before the flip may still be queued
// with this one, so its copy stays until its version's directory is
// pruned (write removes it then).
func (d *mlxDriver) Unload(context.Context, Target) error { return nil }
