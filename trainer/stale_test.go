package trainer

import (
	"context"
	"testing"

	"github.com/clawmesh/clawmesh/trainer/group"
)

// Steps made by an adapter more than max-lag versions old are refused as
// stale, and the ledger says so; fresher ones are trained.
func TestStaleBatchesRefused(t *testing.T) {
	ctx := context.Background()
	g := testGroup
	g.MaxLag = 1
	c, err := NewCluster(ctx, ClusterOptions{Trainers: 1, Timing: testTiming, Group: g, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := func() *Trainer { return c.Trainer(0) }
	for k := range 3 {
		p, err := SyntheticBatch(uint64(100+k), 4, "")
		if err != nil {
			t.Fatal(err)
		}
		c.Ship(p)
		want := k + 2
		if err := c.WaitUntil(ctx, clusterWait, "a version", func() bool { return tr().Status().Versions >= want }); err != nil {
			t.Fatal(err)
		}
	}
	cur := tr().Status().Version.Version.Version
	old, _ := SyntheticBatch(200, 4, "v0")
	fresh, _ := SyntheticBatch(201, 4, group.Version{Version: cur}.Name())
	oldID, freshID := c.Ship(old), c.Ship(fresh)
	if err := c.WaitUntil(ctx, clusterWait, "both batches settled", func() bool {
		var o, f group.Status
		for _, b := range tr().Ledger() {
			switch b.ID {
			case oldID:
				o = b.Status
			case freshID:
				f = b.Status
			}
		}
		return o == group.Refused && f == group.Trained
	}); err != nil {
		t.Fatal(err)
	}
	for _, b := range tr().Ledger() {
		if b.ID == oldID && b.Reason != group.ReasonStale {
			t.Errorf("the old batch was refused for %q", b.Reason)
		}
	}
	if n := tr().Status().Refusals[group.ReasonStale]; n != 1 {
		t.Errorf("status counts %d stale refusals", n)
	}
}
