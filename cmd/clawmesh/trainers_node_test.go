package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// TestTrainersOnNodeBatches: a real node records conversations through its
// gateway, scores, scrubs and ships them; three trainers in a raft group
// (the first one invited a voter, the others volunteers, as `clawmesh
// invite` makes them by default) verify every batch (replaying its
// plugins, fetched from the node) and train each exactly once, into
// versions the voter certified.
func TestTrainersOnNodeBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a node and three trainers")
	}
	ctx := context.Background()
	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	n := runMeshNode(t, a, scriptedUpstream(t, "Sure, here it is."), share.Policy{Mode: share.ModeAll})

	timing := trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond,
		VerifyRetry: 2 * time.Second}
	var trs []*trainer.Trainer
	for range 3 {
		d := t.TempDir()
		trs = append(trs, joinTrainer(t, a, d, trainer.Config{Bootstrap: n.Peer().Host.Addrs(), Timing: timing,
			Group: group.Config{Deadline: 5 * time.Second, LocalSteps: 1}}))
	}

	const sessions = 5
	for i := range sessions {
		endedCall(t, a, fmt.Sprintf("Question %d: list the files", i))
	}
	var shipped []core.BatchID
	waitFor(t, "the node to ship every step", func() bool {
		bs, err := n.Pool().Batches(ctx)
		if err != nil {
			return false
		}
		shipped = shipped[:0]
		steps := 0
		for _, b := range bs {
			if b.Shipped.IsZero() {
				return false
			}
			shipped = append(shipped, b.ID)
			steps += len(b.Steps)
		}
		return steps == sessions
	})
	// The leader verifies each batch first: the first check compiles the
	// reward plugins, which takes long on a loaded machine.
	var lead *trainer.Trainer
	waitLong(t, 4*time.Minute, "every batch trained", func() bool {
		for _, tr := range trs {
			if st := tr.Status(); st.State == "leader" && st.Batches.Trained == len(shipped) && len(st.Voters) == 1 && len(st.Nonvoters) == 2 && st.Certified {
				lead = tr
				return true
			}
		}
		return false
	})
	seen := map[core.BatchID]uint64{}
	for _, v := range lead.Lineage() {
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				if w, ok := seen[id]; ok {
					t.Fatalf("batch %s trained in v%d and v%d", id, w, v.Version)
				}
				seen[id] = v.Version
			}
		}
	}
	for _, id := range shipped {
		if _, ok := seen[id]; !ok {
			t.Errorf("batch %s shipped but in no version", id)
		}
	}
}

// waitLong is waitFor with a bound of its own.
func waitLong(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("waited %s for %s", d, what)
}

// joinTrainer joins data directory d to the mesh of the device in a as a
// trainer, and runs a trainer there (cfg with d and loopback listeners)
// until the test ends.
func joinTrainer(t *testing.T, a, d string, cfg trainer.Config) *trainer.Trainer {
	t.Helper()
	cli(t, "join", strings.TrimSpace(cli(t, "invite", "--role", "trainer", "--data", a)), "--data", d, "--p2p-listen", loopbackP2P[1])
	cfg.DataDir, cfg.Listen = d, loopbackP2P
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := trainer.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; tr.Close() })
	return tr
}
