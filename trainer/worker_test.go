package trainer

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer/group"
)

func TestWorkerTrainsADelta(t *testing.T) {
	ctx := context.Background()
	w := &worker{}
	defer w.close()
	cfg := group.Config{LocalSteps: 2}.WithDefaults()
	dir := filepath.Join(t.TempDir(), "v0")
	if _, err := w.genesis(ctx, cfg, dir); err != nil {
		t.Fatal(err)
	}
	p, err := SyntheticBatch(1, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := batch.Decode(p, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.train(ctx, cfg, dir, 0, b.Steps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report %+v", res.report)
	if res.samples == 0 || res.delta.Norm() == 0 {
		t.Fatalf("trained %d samples, delta norm %v", res.samples, res.delta.Norm())
	}
}
