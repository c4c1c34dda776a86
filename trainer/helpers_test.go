package trainer

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/trainer/group"
)

// testTiming makes raft and rounds quick enough for tests on a loaded
// two-core machine; nothing asserts on durations.
var testTiming = Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond, CertifyWait: 20 * time.Second,
	SnapshotThreshold: 4, SnapshotInterval: 200 * time.Millisecond}

var testGroup = group.Config{Deadline: 4 * time.Second, LocalSteps: 2}

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
