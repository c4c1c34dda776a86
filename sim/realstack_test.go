package sim

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// The churn scenario's leader kill, small, on the real stack: the real
// trainers (hashicorp/raft, the native engine, the batch pull) over the
// simulated network mesh/memnet, checked by the invariants the simulator
// checks on its own runs.
func TestRealStackLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on the real stack")
	}
	leaderKilled(t, harness.Memory{Seed: 7, Latency: time.Millisecond, Jitter: 3 * time.Millisecond})
}

// TestRealStackVirtualTime is the same scenario with home-network latencies
// in the virtual time of a testing/synctest bubble: the trainers open no
// real socket (no admin API), so every wait of the stack, raft's timers
// included, is on the bubble's clock.
func TestRealStackVirtualTime(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on the real stack")
	}
	warmCoders(t)
	wall := time.Now()
	var virtual time.Duration
	synctest.Test(t, func(t *testing.T) {
		start := time.Now() // the bubble's clock
		leaderKilled(t, harness.Memory{Seed: 7, Latency: 20 * time.Millisecond, Jitter: 30 * time.Millisecond, NoAdmin: true})
		virtual = time.Since(start)
	})
	t.Logf("%s of virtual time in %s of wall time", virtual, time.Since(wall))
}

// leaderKilled runs three trainers on memnet, trains a round of batches,
// kills the leader, trains another under the new one, restarts the killed
// trainer, and checks the lineage, the ledger and the catch-up.
func leaderKilled(t *testing.T, so harness.Memory) {
	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{
		Trainers: 3,
		Timing:   trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond, SnapshotThreshold: 4, SnapshotInterval: 200 * time.Millisecond},
		Group:    group.Config{Deadline: 4 * time.Second, LocalSteps: 2},
		Dir:      t.TempDir(),
		Net:      so,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const wait = 90 * time.Second
	leader := func() (int, *trainer.Trainer) {
		var i int
		if err := c.WaitUntil(ctx, wait, "leader with a version", func() bool {
			var ok bool
			i, ok = c.Leader()
			return ok && c.Trainer(i).Status().Version != nil
		}); err != nil {
			t.Fatal(err)
		}
		return i, c.Trainer(i)
	}
	var ids []core.BatchID
	ship := func(from, n int) {
		for i := from; i < from+n; i++ {
			p, err := harness.SyntheticBatch(uint64(i+1), 8, "")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, c.Ship(p))
		}
	}
	trained := func() *trainer.Trainer {
		var tr *trainer.Trainer
		if err := c.WaitUntil(ctx, wait, "every batch trained", func() bool {
			i, ok := c.Leader()
			if !ok {
				return false
			}
			tr = c.Trainer(i)
			st := tr.Status()
			// Certified too: a version whose publisher dies before the
			// voters certified it is retracted, and trained again.
			return st.Batches.Trained == len(ids) && st.Round == nil && st.Certified
		}); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	// Every trainer a voter before the leader goes: a group of two that
	// loses one cannot elect (in virtual time, which costs no CPU, the
	// kill would otherwise come while the third is still joining).
	if err := c.WaitUntil(ctx, wait, "group of three voters", func() bool {
		i, ok := c.Leader()
		return ok && len(c.Trainer(i).Status().Voters) == 3
	}); err != nil {
		t.Fatal(err)
	}
	li, _ := leader()
	ship(0, 3)
	trained()
	if err := c.Kill(li); err != nil {
		t.Fatal(err)
	}
	if ni, _ := leader(); ni == li {
		t.Fatalf("trainer %d still leads after it was killed", li)
	}
	ship(3, 3)
	tr := trained()
	if err := c.Start(ctx, li); err != nil {
		t.Fatal(err)
	}
	versions, ledger := tr.Lineage(), tr.Ledger()
	if v := CheckLineage(versions, ledger); len(v) > 0 {
		t.Errorf("the real stack breaks the invariants: %v", v)
	}
	if len(versions) < 3 {
		t.Errorf("%d versions for two rounds of batches and genesis", len(versions))
	}
	if versions[len(versions)-1].Term <= versions[1].Term {
		t.Errorf("no version under the new leader's term: %+v", versions)
	}
	for _, id := range ids {
		if !slices.ContainsFunc(ledger, func(b group.Batch) bool { return b.ID == id && b.Status == group.Trained }) {
			t.Errorf("batch %s not trained", short(id))
		}
	}
	// The restarted trainer catches up on the same lineage.
	if err := c.WaitUntil(ctx, wait, "the restarted trainer caught up", func() bool {
		r := c.Trainer(li)
		return r != nil && len(r.Lineage()) == len(versions)
	}); err != nil {
		t.Fatal(err)
	}
	if got := c.Trainer(li).Lineage(); CheckLineage(got, c.Trainer(li).Ledger()) != nil || got[len(got)-1].Index != versions[len(versions)-1].Index {
		t.Errorf("the restarted trainer's lineage: %+v", got)
	}
}

// warmCoders builds mesh/batch's shared zstd coders before a synctest
// bubble: they are built on first use, and their channels belong to the
// bubble that builds them.
func warmCoders(t *testing.T) {
	t.Helper()
	warm, err := harness.SyntheticBatch(1, 8, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := batch.Decode(warm, batch.Limits{}); err != nil {
		t.Fatal(err)
	}
}
