package group_test

import (
	"testing"

	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

func TestProperties(t *testing.T) {
	seeds, steps := 200, 200
	if testing.Short() || raceEnabled {
		seeds = 40
	}
	totals := map[string][2]int{}
	largest := 0
	for seed := range uint64(seeds) {
		d := grouptest.NewDriver(t, seed)
		d.Run(steps)
		largest = max(largest, len(d.State().Batches))
		for k, v := range d.Kinds() {
			tv := totals[k]
			totals[k] = [2]int{tv[0] + v[0], tv[1] + v[1]}
		}
	}
	// The driver must exercise every kind of entry, accepted and refused.
	for _, op := range []string{"add", "register", "leave", "revoke", "refuse", "start", "publish", "abort", "close", "configure"} {
		if totals[op][0] == 0 || totals[op][1] == 0 {
			t.Errorf("%s: %d accepted, %d refused", op, totals[op][0], totals[op][1])
		}
	}
	for _, op := range []string{"refuse stale", "publish again", "start while open", "publish no round"} {
		if totals[op] == ([2]int{}) {
			t.Errorf("%s never ran", op)
		}
	}
	t.Logf("entries (accepted, refused): %v; %d batches in the largest ledger", totals, largest)
}
