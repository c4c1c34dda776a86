package harness

import (
	"time"

	"github.com/clawmesh/clawmesh/trainer"
)

// testTiming makes raft and rounds quick enough for tests on a loaded
// two-core machine; nothing asserts on durations.
var testTiming = trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond,
	SnapshotThreshold: 4, SnapshotInterval: 200 * time.Millisecond}
