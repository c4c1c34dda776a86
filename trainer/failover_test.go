package trainer_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

func shipN(t *testing.T, c *harness.Cluster, from, n int) []core.BatchID {
	t.Helper()
	var ids []core.BatchID
	for i := from; i < from+n; i++ {
		p, err := harness.SyntheticBatch(uint64(i+1), 8, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.Ship(p))
	}
	return ids
}

func leaderOf(t *testing.T, c *harness.Cluster) (int, *trainer.Trainer) {
	t.Helper()
	var i int
	if err := c.WaitUntil(context.Background(), clusterWait, "leader", func() bool {
		var ok bool
		i, ok = c.Leader()
		return ok
	}); err != nil {
		t.Fatal(err)
	}
	return i, c.Trainer(i)
}

func waitTrained(t *testing.T, c *harness.Cluster, ids []core.BatchID) *trainer.Trainer {
	t.Helper()
	var tr *trainer.Trainer
	if err := c.WaitUntil(context.Background(), clusterWait, "every batch trained", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		tr = c.Trainer(i)
		st := tr.Status()
		return st.Batches.Trained == len(ids) && st.Round == nil
	}); err != nil {
		t.Fatal(err)
	}
	checkLedger(t, tr, ids)
	return tr
}

// A round whose leader dies before it publishes completes under a new
// leader; the dead leader's share goes back to pending and is trained
// later; no batch is trained twice or lost.
func TestLeaderKilledMidRound(t *testing.T) { leaderKilledMidRound(t, newTestCluster(t, 3)) }

func leaderKilledMidRound(t *testing.T, c *harness.Cluster) {
	ctx := context.Background()
	// Every trainer registered, so that the round is shared by three.
	if err := c.WaitUntil(ctx, clusterWait, "three registered trainers", func() bool {
		i, ok := c.Leader()
		return ok && len(c.Trainer(i).Status().Trainers) == 3
	}); err != nil {
		t.Fatal(err)
	}
	// Whichever trainer leads when the first round is about to be
	// published (leadership may move on a loaded machine) stops there
	// until it is killed.
	type pause struct {
		trainer int
		round   uint64
	}
	paused := make(chan pause, 1)
	var once atomic.Bool
	for i := range c.Len() {
		c.Trainer(i).SetBeforePublish(func(ctx context.Context, round uint64) {
			if !once.CompareAndSwap(false, true) {
				return
			}
			paused <- pause{i, round}
			<-ctx.Done()
		})
	}
	ids := shipN(t, c, 0, 9)
	var p pause
	select {
	case p = <-paused:
	case <-time.After(clusterWait):
		t.Fatal("the leader never got to publish")
	}
	li, leader, round := p.trainer, c.Trainer(p.trainer), p.round
	if err := c.Kill(li); err != nil {
		t.Logf("kill: %v", err)
	}
	tr := waitTrained(t, c, ids)
	lin := tr.Lineage()
	for _, v := range lin {
		if v.Publisher == leader.ID() && v.Round >= round && v.Version > 0 {
			t.Fatalf("v%d was published by the killed leader", v.Version)
		}
	}
	// The killed trainer comes back and catches up with the lineage.
	if err := c.Start(ctx, li); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "the restarted trainer to catch up", func() bool {
		tt := c.Trainer(li)
		return tt != nil && tt.Status().Versions == len(lin)
	}); err != nil {
		t.Fatal(err)
	}
}

// A leader cut off the group mid-round is replaced; when it comes back,
// its late publication is refused and the lineage is the new leader's.
func TestPausedLeaderIsFenced(t *testing.T) { pausedLeaderIsFenced(t, newTestCluster(t, 3)) }

func pausedLeaderIsFenced(t *testing.T, c *harness.Cluster) {
	ctx := context.Background()
	li, leader := leaderOf(t, c)
	paused, release := make(chan uint64, 1), make(chan struct{})
	leader.SetBeforePublish(func(ctx context.Context, round uint64) {
		select {
		case paused <- round:
		default:
			return
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	ids := shipN(t, c, 0, 6)
	select {
	case <-paused:
	case <-time.After(clusterWait):
		t.Fatal("the leader never got to publish")
	}
	before := len(leader.Lineage())
	c.Isolate(li, true)
	// The others elect a new leader, which completes the round.
	var ni int
	if err := c.WaitUntil(ctx, clusterWait, "a new leader that publishes", func() bool {
		for i := range c.Len() {
			if i != li && c.Trainer(i).IsLeader() && len(c.Trainer(i).Lineage()) > before {
				ni = i
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := c.WaitUntil(ctx, clusterWait, "the old leader's publication refused", func() bool {
		return leader.Fenced() > 0
	}); err != nil {
		t.Fatal(err)
	}
	c.Isolate(li, false)
	tr := waitTrained(t, c, ids)
	for _, v := range tr.Lineage()[before:] {
		if v.Publisher == leader.ID() {
			t.Fatalf("v%d is the deposed leader's", v.Version)
		}
	}
	// Its claim to the version it made is refused by every other trainer.
	newV := c.Trainer(ni).Lineage()[before]
	stale := group.Claim{Version: newV.Version, Hash: "0000000000000000000000000000000000000000000000000000000000000001", Term: newV.Term - 1, Index: newV.Index}
	for i := range c.Len() {
		if err := c.Trainer(i).FenceCheck(stale); err == nil {
			t.Fatalf("trainer %d accepted a deposed leader's claim", i)
		}
	}
	// And the old leader catches up with the lineage.
	if err := c.WaitUntil(ctx, clusterWait, "the old leader to catch up", func() bool {
		return len(leader.Lineage()) == len(tr.Lineage())
	}); err != nil {
		t.Fatal(err)
	}
}

// Every trainer stops; restarted from disk (snapshots and the log after
// them) they continue from the last version.
func TestRestartAllFromDisk(t *testing.T) { restartAllFromDisk(t, newTestCluster(t, 3)) }

func restartAllFromDisk(t *testing.T, c *harness.Cluster) {
	ctx := context.Background()
	ids := shipN(t, c, 0, 4)
	tr := waitTrained(t, c, ids)
	lin := tr.Lineage()
	if err := c.WaitUntil(ctx, clusterWait, "a snapshot on every trainer", func() bool {
		for i := range c.Len() {
			snaps, _ := filepath.Glob(filepath.Join(c.DataDir(i), trainer.RaftDir, "snapshots", "snapshots", "*", "state.bin"))
			if len(snaps) == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for i := range c.Len() {
		if err := c.Kill(i); err != nil {
			t.Logf("kill %d: %v", i, err)
		}
	}
	for i := range c.Len() {
		if err := c.Start(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	_, l := leaderOf(t, c)
	if err := c.WaitUntil(ctx, clusterWait, "the lineage replayed", func() bool { return len(l.Lineage()) >= len(lin) }); err != nil {
		t.Fatal(err)
	}
	got := l.Lineage()
	for k, v := range lin {
		if got[k].Hash != v.Hash || got[k].Term != v.Term || got[k].Index != v.Index {
			t.Fatalf("v%d changed across the restart", k)
		}
	}
	more := shipN(t, c, 4, 3)
	tr = waitTrained(t, c, append(ids, more...))
	if n := len(tr.Lineage()); n <= len(lin) {
		t.Fatalf("no version after the restart: %d versions, %d before", n, len(lin))
	}
}

// Before the leader commits a version, a majority of the voters hold its
// bundle: a version never dies with its leader.
func TestVersionHandedOverBeforeCommit(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	if err := c.WaitUntil(ctx, clusterWait, "three registered trainers", func() bool {
		i, ok := c.Leader()
		return ok && len(c.Trainer(i).Status().Trainers) == 3
	}); err != nil {
		t.Fatal(err)
	}
	// Whichever trainer leads when the round publishes (a busy machine
	// may see an election before then) counts the others' held bundles.
	holders := make(chan int, 1)
	for li := range c.Len() {
		c.Trainer(li).SetBeforePublish(func(ctx context.Context, round uint64) {
			n := 0
			for i := range c.Len() {
				if i == li {
					continue
				}
				if held, _ := filepath.Glob(filepath.Join(c.DataDir(i), trainer.AdaptersDir, ".held-*")); len(held) > 0 {
					n++
				}
			}
			select {
			case holders <- n:
			default:
			}
		})
	}
	shipN(t, c, 0, 3)
	select {
	case n := <-holders:
		if n < 1 {
			t.Fatalf("%d other trainers held the version before its commit", n)
		}
	case <-time.After(clusterWait):
		t.Fatal("no version published")
	}
}

// A batch that only a follower stored (its leader missed the announcement,
// and the device, acknowledged by the follower, announces it no more) is
// offered to the leader, which pulls it and trains it.
func TestStrandedBatchOffered(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	li, leader := leaderOf(t, c)
	fi := (li + 1) % c.Len()
	payload, err := harness.SyntheticBatch(99, 8, "")
	if err != nil {
		t.Fatal(err)
	}
	id := batch.ID(payload)
	b, err := batch.Verify(payload, id, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Trainer(fi).Store().PutFrom(ctx, id, "", payload, b); err != nil {
		t.Fatal(err)
	}
	if ok, _ := leader.Store().Has(ctx, id); ok {
		t.Fatal("the leader has the batch before any offer")
	}
	waitTrained(t, c, []core.BatchID{id})
}
