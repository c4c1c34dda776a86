package raftnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/mesh"
)

// commands are the commands cmd0…cmd(n-1).
func commands(from, n int) []string {
	l := make([]string, n)
	for i := range l {
		l[i] = fmt.Sprintf("cmd%d", from+i)
	}
	return l
}

// waitApplied waits until every node's FSM holds want, in order (a
// command retried across a change of leader counted once).
func waitApplied(t *testing.T, nodes []*node, want []string) {
	t.Helper()
	for _, n := range nodes {
		eventually(t, fmt.Sprintf("%s applies %d commands", n.id, len(want)), func() bool {
			return len(dedup(n.fsm.entries())) >= len(want)
		})
		if got := dedup(n.fsm.entries()); !slices.Equal(got, want) {
			t.Fatalf("%s applied %q, want %q", n.id, got, want)
		}
	}
}

// Three raft servers on three libp2p hosts elect a leader, replicate what
// it applies to every FSM in order, and elect another when it goes.
func TestReplicateAndFailover(t *testing.T) {
	log := quietLogger(t)
	nodes := cluster(t, 3, log, nil)
	leader := waitLeader(t, nodes)

	want := commands(0, 20)
	for _, c := range want {
		apply(t, nodes, c)
	}
	waitApplied(t, nodes, want)

	// The leader goes: its raft and its host.
	if err := leader.raft.Shutdown().Error(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := leader.host.Close(); err != nil {
		t.Fatalf("close host: %v", err)
	}
	var rest []*node
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	next := waitLeader(t, rest)
	if next == leader {
		t.Fatal("the old leader leads again")
	}

	more := commands(len(want), 10)
	for _, c := range more {
		apply(t, rest, c)
	}
	waitApplied(t, rest, append(want, more...))
}

// A peer the others' allow refuses cannot take part: added as a voter, it
// is never reached, and receives nothing.
func TestRefusedPeerTakesNoPart(t *testing.T) {
	sink := newLogSink(t)
	log := sink.logger(slog.LevelWarn)
	nodes := cluster(t, 3, log, nil)

	// The outsider runs raft and would admit anyone; the group's allow
	// does not admit it.
	out := newHost(t, nil)
	for _, n := range nodes {
		connectAll(t, n.host, out)
	}
	outsider := startNode(t, out, nil, log)

	leader := waitLeader(t, nodes)
	// The group commits the change without the outsider: three of four.
	var err error
	eventually(t, "the outsider is added as a voter", func() bool {
		err = leader.raft.AddVoter(outsider.id, raft.ServerAddress(outsider.id), 0, waitFor).Error()
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			leader = waitLeader(t, nodes)
			return false
		}
		return true
	})
	if err != nil {
		t.Fatalf("AddVoter: %v", err)
	}
	want := commands(0, 5)
	for _, c := range want {
		apply(t, nodes, c)
	}
	waitApplied(t, nodes, want)

	// Some member has tried to reach the outsider and was refused by its
	// own Layer; the outsider has received nothing, not even the
	// configuration.
	eventually(t, "a member's dial to the outsider is refused", func() bool {
		return sink.has(ErrNotAllowed.Error(), string(outsider.id))
	})
	if got := outsider.fsm.entries(); len(got) != 0 {
		t.Fatalf("the outsider applied %q", got)
	}
	if last, err := outsider.store.LastIndex(); err != nil || last != 0 {
		t.Fatalf("the outsider's log reaches index %d (%v), want 0", last, err)
	}

	// And a stream it opens to a member is reset before raft sees it.
	refused(t, func() (mesh.Stream, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		return out.NewStream(ctx, nodes[0].host.ID(), Protocol)
	})
}

// A server that stops cleanly (raft, then its transport, then its host,
// as a trainer that leaves does) logs no failure of its own.
func TestCleanStopLogsNoError(t *testing.T) {
	sink := newLogSink(t)
	nodes := cluster(t, 3, sink.logger(slog.LevelWarn), nil)
	leader := waitLeader(t, nodes)
	want := commands(0, 10)
	for _, c := range want {
		apply(t, nodes, c)
	}
	waitApplied(t, nodes, want)
	for _, n := range nodes {
		if n == leader {
			continue
		}
		if err := leader.raft.RemoveServer(n.id, 0, 0).Error(); err != nil {
			t.Fatalf("remove %s: %v", n.id, err)
		}
		if err := n.raft.Shutdown().Error(); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		n.trans.Close()
		n.host.Close()
		break
	}
	time.Sleep(500 * time.Millisecond) // the streams' ends are read
	if sink.has("failed to decode incoming command") {
		t.Error("a clean stop logged a failure to decode")
	}
}
