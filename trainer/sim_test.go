package trainer_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/trainer/harness"
)

// simSeeds is how many seeds each scenario runs over on the simulated
// network: a few in the normal run, more by hand
// (CLAWMESH_SIM_SEEDS=50 go test -run TestScenariosSimulated ./trainer).
func simSeeds() int {
	if n, err := strconv.Atoi(os.Getenv("CLAWMESH_SIM_SEEDS")); err == nil && n > 0 {
		return n
	}
	if testing.Short() {
		return 1
	}
	return 3
}

// The failover scenarios again, on a simulated network with latencies
// drawn from each seed: a crash there is the host vanishing at once.
func TestScenariosSimulated(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(*testing.T, *harness.Cluster)
	}{
		{"leader killed mid-round", leaderKilledMidRound},
		{"paused leader fenced", pausedLeaderIsFenced},
		{"restart all from disk", restartAllFromDisk},
		{"every batch once", func(t *testing.T, c *harness.Cluster) {
			ids := shipN(t, c, 0, 6)
			waitTrained(t, c, ids)
		}},
	}
	for seed := range simSeeds() {
		for _, sc := range scenarios {
			t.Run(fmt.Sprintf("%s/seed=%d", sc.name, seed+1), func(t *testing.T) {
				c, err := harness.NewCluster(context.Background(), harness.ClusterOptions{Trainers: 3, Timing: testTiming, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t),
					Net: harness.Memory{Seed: uint64(seed + 1), Latency: time.Millisecond, Jitter: 3 * time.Millisecond}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				settle(t, c, 3)
				sc.run(t, c)
			})
		}
	}
}
