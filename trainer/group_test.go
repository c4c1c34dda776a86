package trainer_test

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// The helpers of package trainer's tests (export_test.go).
var (
	testTiming = trainer.QuickTiming
	testGroup  = trainer.QuickGroup
	testLogger = trainer.NewTestLogger
)

const clusterWait = 90 * time.Second

func newTestCluster(t *testing.T, n int) *harness.Cluster {
	t.Helper()
	c, err := harness.NewCluster(context.Background(), harness.ClusterOptions{Trainers: n, Timing: testTiming, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	settle(t, c, n)
	return c
}

// settle waits for a leader of n voters that committed version 0.
func settle(t *testing.T, c *harness.Cluster, n int) {
	t.Helper()
	ctx := context.Background()
	if err := c.WaitUntil(ctx, clusterWait, "leader with every trainer a voter", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		return len(st.Voters) == n && st.Version != nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestGroupTrainsEveryBatchOnce(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	var ids []core.BatchID
	for i := range 6 {
		p, err := harness.SyntheticBatch(uint64(i+1), 8, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.Ship(p))
	}
	if err := c.WaitUntil(ctx, clusterWait, "every batch trained", func() bool {
		i, ok := c.Leader()
		return ok && c.Trainer(i).Status().Batches.Trained == len(ids)
	}); err != nil {
		t.Fatal(err)
	}
	i, _ := c.Leader()
	checkLedger(t, c.Trainer(i), ids)
}

// checkLedger checks that every batch was trained exactly once, in
// strictly increasing versions.
func checkLedger(t *testing.T, tr *trainer.Trainer, ids []core.BatchID) {
	t.Helper()
	lin := tr.Lineage()
	seen := map[core.BatchID]uint64{}
	for k, v := range lin {
		if v.Version != uint64(k) {
			t.Fatalf("lineage[%d] is v%d", k, v.Version)
		}
		if k > 0 {
			p := lin[k-1]
			if v.Term < p.Term || (v.Term == p.Term && v.Index <= p.Index) {
				t.Fatalf("v%d at (%d,%d) after v%d at (%d,%d)", v.Version, v.Term, v.Index, p.Version, p.Term, p.Index)
			}
		}
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				if w, ok := seen[id]; ok {
					t.Fatalf("batch %s trained in v%d and v%d", id, w, v.Version)
				}
				seen[id] = v.Version
			}
		}
	}
	led := map[core.BatchID]group.Batch{}
	for _, b := range tr.Ledger() {
		led[b.ID] = b
	}
	for _, id := range ids {
		b, ok := led[id]
		if !ok {
			t.Fatalf("batch %s lost: not in the ledger", id)
		}
		if b.Status != group.Trained || seen[id] != b.Version {
			t.Fatalf("batch %s: %s in v%d, lineage says v%d", id, b.Status, b.Version, seen[id])
		}
	}
}
