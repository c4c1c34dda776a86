package trainer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// With three voter seats and four trainers, the fourth is a non-voter; it
// takes the seat of a voter that dies, and a trainer that leaves is out of
// the group and the registry.
func TestNonVoterPromotedAndLeave(t *testing.T) {
	ctx := context.Background()
	timing := testTiming
	timing.MaxVoters = 3
	timing.ReplaceAfter = 2 * time.Second
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 4, Timing: timing, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var st trainer.Status
	if err := c.WaitUntil(ctx, clusterWait, "three voters and a non-voter", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st = c.Trainer(i).Status()
		return len(st.Voters) == 3 && len(st.Nonvoters) == 1 && len(st.Trainers) == 4
	}); err != nil {
		t.Fatal(err)
	}
	standby := st.Nonvoters[0]
	// Kill a voter that does not lead.
	victim := -1
	for i := range c.Len() {
		id := c.Trainer(i).ID()
		if id != st.Leader && slices.Contains(st.Voters, id) {
			victim = i
			break
		}
	}
	dead := c.Trainer(victim).ID()
	if err := c.Kill(victim); err != nil {
		t.Logf("kill: %v", err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "the non-voter promoted in the dead voter's seat", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st = c.Trainer(i).Status()
		return slices.Contains(st.Voters, standby) && !slices.Contains(st.Voters, dead) && len(st.Voters) == 3
	}); err != nil {
		t.Fatal(err)
	}
	// A follower leaves.
	var leaver *trainer.Trainer
	for i := range c.Len() {
		if tr := c.Trainer(i); tr != nil && tr.ID() != st.Leader {
			leaver = tr
			break
		}
	}
	if err := leaver.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	li, _ := c.Leader()
	st = c.Trainer(li).Status()
	if slices.Contains(st.Voters, leaver.ID()) || slices.Contains(st.Nonvoters, leaver.ID()) {
		t.Errorf("%s left but is still in the group: %+v", leaver.ID(), st)
	}
	if slices.ContainsFunc(st.Trainers, func(tr group.Trainer) bool { return tr.ID == leaver.ID() }) {
		t.Errorf("%s left but is still registered", leaver.ID())
	}
	// The leader itself leaves: it hands over first.
	old := c.Trainer(li)
	if err := old.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "another leader", func() bool {
		for i := range c.Len() {
			if tr := c.Trainer(i); tr != nil && tr != old && tr != leaver && tr.IsLeader() {
				st = tr.Status()
				return !slices.Contains(st.Voters, old.ID())
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
}
