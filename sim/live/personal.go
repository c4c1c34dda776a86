package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/serveapi"
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
