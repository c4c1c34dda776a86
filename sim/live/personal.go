package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/trainer/personal"
)

// localTrainer trains a node's personal adapter in process, as the worker
// `clawmesh personal train` does on a device.
type localTrainer struct {
	base, recipe string
}

func (t localTrainer) Train(ctx context.Context, j core.PersonalJob) (core.PersonalResult, error) {
	return personal.Train(ctx, personal.Options{Base: t.base, Recipe: t.recipe}, j)
}

// trainPersonal trains every node's personal adapter on its user's steps,
// on top of shared version v, waits until each node serves the stack, and
// loads v alone into the shared-only model server. It returns the
// personal version each node serves.
func trainPersonal(ctx context.Context, m *liveMesh, v string, say func(string, ...any)) ([]string, error) {
	out := make([]string, len(m.nodes))
	errs := make([]error, len(m.nodes))
	var wg sync.WaitGroup
	for i, n := range m.nodes {
		wg.Go(func() {
			rec, err := n.Personal().Train(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("node %d's personal adapter: %w", i+1, err)
				return
			}
			out[i] = rec.Version
			score := "-"
			if rec.ScoreAfter >= 0 {
				score = fmt.Sprintf("%.2f -> %.2f", rec.ScoreBefore, rec.ScoreAfter)
			}
			say("  node %d: personal %s on %s from %d steps (held-back agreement %s) in %.1f s", i+1, rec.Version, v, rec.Trained, score, rec.Seconds)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for i, n := range m.nodes {
		want := adapters.StackName(v, out[i])
		for n.Follower().Route().Version != want {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("node %d serves %q, not %s", i+1, n.Follower().Route().Version, want)
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	body, _ := json.Marshal(serveapi.AdapterRequest{Path: m.nodes[0].Follower().VersionDir(v), Version: v})
	req, err := http.NewRequestWithContext(ctx, "POST", m.shared+serveapi.AdapterPath, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if _, err := post(req, nil); err != nil {
		return nil, fmt.Errorf("loading %s into the shared-only model server: %w", v, err)
	}
	return out, nil
}

// personalElsewhere looks for every node's personal adapters (its
// versions and the stacks served) anywhere but in that node's own
// personal directory: in the other nodes' and the trainers' data
// directories, and in the rest of its own: any file that holds one's
// weights file, whole or packed as the weights service packs a bundle. It
// returns where it found them; none, for a personal adapter under mode
// local never leaves its device.
func personalElsewhere(root string, nodes int) ([]string, error) {
	type adapterFile struct {
		data []byte
		dir  string // the node's personal directory
	}
	var mine []adapterFile
	for i := range nodes {
		dir := filepath.Join(root, fmt.Sprint("node", i+1), node.PersonalDir)
		err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "adapter_model.safetensors" {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			mine = append(mine, adapterFile{b, dir})
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	var found []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walked (a pruned version)
			}
			return err
		}
		if e.IsDir() || !e.Type().IsRegular() {
			return nil
		}
		info, err := e.Info()
		if err != nil || info.Size() > 64<<20 {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		// The weights anywhere in a file: as they are, or packed into
		// a bundle (mesh/weights packs them unchanged).
		for _, f := range mine {
			if !strings.HasPrefix(p, f.dir+string(filepath.Separator)) && bytes.Contains(b, f.data) {
				found = append(found, p)
				break
			}
		}
		return nil
	})
	return found, err
}
