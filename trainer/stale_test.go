package trainer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer"

	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// Steps made by an adapter more than max-lag versions old are refused as
// stale, and the ledger says so; fresher ones are trained.
func TestStaleBatchesRefused(t *testing.T) {
	ctx := context.Background()
	g := testGroup
	g.MaxLag = 1
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Timing: testTiming, Group: g, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := func() *trainer.Trainer { return c.Trainer(0) }
	for k := range 3 {
		p, err := harness.SyntheticBatch(uint64(100+k), 4, "")
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
	old, _ := harness.SyntheticBatch(200, 4, "v0")
	fresh, _ := harness.SyntheticBatch(201, 4, group.Version{Version: cur}.Name())
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

// A batch that fails verification is refused in the ledger with the
// verifier's reason; one whose check cannot run yet waits; the others
// are trained.
func TestUnverifiedBatchesRefused(t *testing.T) {
	ctx := context.Background()
	bad, _ := harness.SyntheticBatch(300, 4, "")
	good, _ := harness.SyntheticBatch(301, 4, "")
	badID := batch.ID(bad)
	var tries atomic.Int32
	timing := testTiming
	timing.VerifyRetry = 500 * time.Millisecond
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Timing: timing, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t),
		Verify: func(ctx context.Context, id core.BatchID, from mesh.PeerID) (string, error) {
			if id != badID {
				return "", nil
			}
			if tries.Add(1) == 1 {
				return "", errors.New("the device is away")
			}
			return "verification: step s1: score forged", nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Ship(bad)
	goodID := c.Ship(good)
	if err := c.WaitUntil(ctx, clusterWait, "the good batch trained", func() bool {
		for _, b := range c.Trainer(0).Ledger() {
			if b.ID == goodID && b.Status == group.Trained {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "the bad batch refused", func() bool {
		for _, b := range c.Trainer(0).Ledger() {
			if b.ID == badID {
				return b.Status == group.Refused && strings.Contains(b.Reason, "score forged")
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	if n := tries.Load(); n < 2 {
		t.Errorf("the bad batch was checked %d times: a check that could not run must be tried again", n)
	}
}

// The leader refuses a delta that was not taken from the round's base, so
// that a bad contributor cannot hold the round up.
func TestLeaderRefusesAForeignDelta(t *testing.T) {
	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Timing: testTiming, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := c.Trainer(0)
	held, release := make(chan uint64, 1), make(chan struct{})
	tr.SetBeforePublish(func(ctx context.Context, round uint64) {
		select {
		case held <- round:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	p, _ := harness.SyntheticBatch(7, 4, "")
	c.Ship(p)
	round := <-held

	// A delta trained from another seed's version 0.
	err = trainer.OfferForeignDelta(ctx, tr, round, p, t.TempDir())
	if !errors.Is(err, adapter.ErrMismatch) {
		t.Fatalf("a foreign delta: %v", err)
	}
	close(release)
}
