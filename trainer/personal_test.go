package trainer_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	meshpersonal "github.com/clawmesh/clawmesh/mesh/personal"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// syntheticSteps are the steps of a synthetic batch.
func syntheticSteps(t *testing.T, seed uint64, n int) []*core.Step {
	t.Helper()
	p, err := harness.SyntheticBatch(seed, n, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := batch.Decode(p, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return b.Steps
}

// A trainer with personal training on trains a device's adapter over the
// mesh, on its own copy of the certified shared version the device
// names, and refuses a version it has not; the job leaves nothing in the
// trainer's batches, its lineage or its data directory.
func TestPersonalOverMesh(t *testing.T) {
	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Timing: testTiming, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t),
		Personal: trainer.PersonalConfig{On: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	settle(t, c, 1)
	ids := shipBatches(t, c, 2, 1)
	tr := c.Trainer(0)
	if err := c.WaitUntil(ctx, clusterWait, "a certified version", func() bool {
		var v group.Version
		var ok bool
		tr.ViewGroup(func(s *group.State) { v, ok = s.Current() })
		st := tr.Status()
		return ok && v.Version >= 1 && v.Cert != nil && st.Batches.Trained == len(ids) && st.Round == nil
	}); err != nil {
		t.Fatal(err)
	}
	var versions int
	tr.ViewGroup(func(s *group.State) { versions = len(s.Versions) })

	host, m := c.Device()
	client := meshpersonal.Client{Host: host, Mesh: m, Trainers: []mesh.PeerID{tr.ID()}}
	steps, held := syntheticSteps(t, 100, 8), syntheticSteps(t, 200, 4)
	first := filepath.Join(t.TempDir(), "personal")
	res, err := client.Train(ctx, core.PersonalJob{SharedVersion: "v1", Steps: steps, HeldBack: held, Out: first, Seed: 3})
	if err != nil {
		t.Fatalf("a personal job on v1: %v", err)
	}
	if res.Trained < 1 || res.Trained > len(steps) || res.HeldBack > len(held) {
		t.Errorf("result %+v for %d steps and %d held back", res, len(steps), len(held))
	}
	b, err := os.ReadFile(filepath.Join(first, meshpersonal.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		R int `json:"r"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil || cfg.R < 1 {
		t.Errorf("the adapter's config: %s (%v)", b, err)
	}
	if _, err := os.Stat(filepath.Join(first, meshpersonal.WeightsFile)); err != nil {
		t.Error(err)
	}

	// Trained further, on the base alone.
	if _, err := client.Train(ctx, core.PersonalJob{Prev: first, Steps: syntheticSteps(t, 300, 4), Out: filepath.Join(t.TempDir(), "p2")}); err != nil {
		t.Errorf("a personal job from the previous adapter: %v", err)
	}
	for _, v := range []string{"v9", "v0", "v01", "latest"} {
		if _, err := client.Train(ctx, core.PersonalJob{SharedVersion: v, Steps: steps, Out: filepath.Join(t.TempDir(), "p")}); !errors.Is(err, meshpersonal.ErrUnknownVersion) {
			t.Errorf("shared version %s: %v, want ErrUnknownVersion", v, err)
		}
	}

	// Nothing of the jobs stays on the trainer.
	es, err := tr.Store().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != len(ids) {
		t.Errorf("the trainer's store holds %d batches, %d shipped", len(es), len(ids))
	}
	tr.ViewGroup(func(s *group.State) {
		if len(s.Versions) != versions || len(s.Batches) != len(ids) {
			t.Errorf("the group has %d versions and %d batches after the personal jobs, %d and %d before", len(s.Versions), len(s.Batches), versions, len(ids))
		}
	})
	// Only the tiny base the jobs open is kept there.
	left, err := os.ReadDir(filepath.Join(c.DataDir(0), trainer.PersonalDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		if !strings.HasPrefix(e.Name(), "tiny-") {
			t.Errorf("the trainer's personal directory holds %s", e.Name())
		}
	}
}
