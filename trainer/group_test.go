package trainer

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// testTiming makes raft and rounds quick enough for tests on a loaded
// two-core machine; nothing asserts on durations.
var testTiming = Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond,
	SnapshotThreshold: 4, SnapshotInterval: 200 * time.Millisecond}

// testCluster is what the scenarios need of a cluster: Cluster on
// loopback libp2p, or SimCluster on a simulated network.
type testCluster interface {
	Len() int
	Trainer(i int) *Trainer
	DataDir(i int) string
	Start(ctx context.Context, i int) error
	Kill(i int) error
	Isolate(i int, on bool)
	Leader() (int, bool)
	Ship(payload []byte) core.BatchID
	WaitUntil(ctx context.Context, d time.Duration, what string, cond func() bool) error
	Close() error
}

var testGroup = group.Config{Deadline: 4 * time.Second, LocalSteps: 2}

const clusterWait = 90 * time.Second

// testLogger logs to stderr with CLAWMESH_TEST_LOG set; otherwise it keeps
// the last testLogLines lines and prints them if the test fails, so that a
// failure seen once on a busy machine says what the trainers were doing.
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("CLAWMESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	r := &logRing{failed: t.Failed}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the trainers' last %d log lines:\n%s", testLogLines, r.String())
		}
	})
	return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

const testLogLines = 150

// logRing is an io.Writer that keeps the last testLogLines writes (slog
// writes a record at a time) until the test fails: what the cluster logs
// as it closes after a failure would push out what led to it.
type logRing struct {
	failed func() bool
	mu     sync.Mutex
	lines  []string
}

func (r *logRing) Write(p []byte) (int, error) {
	if r.failed() {
		return len(p), nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) == testLogLines {
		r.lines = append(r.lines[:0:0], r.lines[1:]...)
	}
	r.lines = append(r.lines, string(p))
	return len(p), nil
}

func (r *logRing) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "")
}

func newTestCluster(t *testing.T, n int) *Cluster {
	t.Helper()
	c, err := NewCluster(context.Background(), ClusterOptions{Trainers: n, Timing: testTiming, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	settle(t, c, n)
	return c
}

// settle waits for a leader of n voters that committed version 0.
func settle(t *testing.T, c testCluster, n int) {
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
		p, err := SyntheticBatch(uint64(i+1), 8, "")
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
func checkLedger(t *testing.T, tr *Trainer, ids []core.BatchID) {
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
