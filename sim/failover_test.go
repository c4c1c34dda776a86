package sim

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clawmesh/clawmesh/trainer/harness"
)

// realElection kills the leader of three real trainers (hashicorp/raft at
// the trainers' default timing, over mesh/memnet with 20–50 ms links) in
// the virtual time of a synctest bubble, and returns how long the others
// took to elect a new one.
func realElection(t *testing.T, seed uint64) time.Duration {
	var took time.Duration
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 3, Dir: t.TempDir(),
			Net: harness.Memory{Seed: seed, Latency: 20 * time.Millisecond, Jitter: 30 * time.Millisecond, NoAdmin: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const wait = 2 * time.Minute
		var li int
		if err := c.WaitUntil(ctx, wait, "group of three voters", func() bool {
			var ok bool
			li, ok = c.Leader()
			return ok && len(c.Trainer(li).Status().Voters) == 3
		}); err != nil {
			t.Fatal(err)
		}
		// A settled group, killed at a moment that varies with the seed
		// against the followers' timers.
		time.Sleep(5*time.Second + time.Duration(seed*137%1000)*time.Millisecond)
		start := time.Now()
		if err := c.Kill(li); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitUntil(ctx, wait, "new leader", func() bool {
			i, ok := c.Leader()
			return ok && i != li
		}); err != nil {
			t.Fatal(err)
		}
		took = time.Since(start)
	})
	return took
}

// TestFailoverMatchesRaft checks the simulator's model of raft against
// hashicorp/raft itself: the time from the leader's death to the next
// leader's election, over seeds, in the real trainers (virtual time) and
// in the model (the churn scenario's leader kill).
func TestFailoverMatchesRaft(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real trainers")
	}
	warmCoders(t)
	// The real runs vary from run to run (goroutines and raft's own
	// random draws), the model's from seed to seed: enough of each that
	// the means are within about 0.1 s of their own.
	const realRuns, modelRuns = 48, 96
	var real, model []float64
	for s := uint64(1); s <= realRuns; s++ {
		real = append(real, realElection(t, s).Seconds())
	}
	for s := uint64(1); s <= modelRuns; s++ {
		r, err := Run(Options{Nodes: 20, Trainers: 3, Seed: s, Scenario: Churn})
		if err != nil {
			t.Fatal(err)
		}
		for _, fo := range r.Failovers {
			if fo.Cause == "leader killed mid-round" {
				model = append(model, fo.Elected-fo.At)
			}
		}
	}
	if len(model) != modelRuns {
		t.Fatalf("%d leader kills in %d runs of the model", len(model), modelRuns)
	}
	mr, mm := meanOf(real), meanOf(model)
	t.Logf("election after the leader died: hashicorp/raft %.2f s over %d runs, model %.2f s over %d seeds", mr, len(real), mm, len(model))
	for _, x := range append(append([]float64{}, real...), model...) {
		if x < 1 || x > 3.5 {
			t.Errorf("an election %.2f s after the leader died: a follower stands after 1–2 heartbeat timeouts (1 s)", x)
		}
	}
	if math.Abs(mr-mm) > 0.4 {
		t.Errorf("mean election time: hashicorp/raft %.2f s, the model %.2f s", mr, mm)
	}
}

func meanOf(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
