package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// `trainer status` lists the benched trainers with why; `trainer clear`
// takes one peer id and refuses anything else before it looks for a
// trainer.
func TestTrainerClearAndBenched(t *testing.T) {
	p := mesh.PeerID("12D3KooWHShim58ey965LS6pE7FhLp2vHDZoUt6KC8vTgpCkgEah")
	st := trainer.Status{Peer: "t1", State: "leader", Benched: []trainer.BenchedTrainer{{Trainer: p,
		BenchRecord: group.BenchRecord{Round: 7, Reason: "spot check: its delta of round 7 is not what its share makes"}}}}
	var buf bytes.Buffer
	printTrainerStatus(&buf, st)
	if out := buf.String(); !strings.Contains(out, "benched   1 (no share until 'clawmesh trainer clear PEER')") ||
		!strings.Contains(out, "benched "+string(p)+" since round 7: spot check: its delta of round 7") {
		t.Errorf("the benched trainers:\n%s", out)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"clear", "--data", dir}, "clear takes one argument"},
		{[]string{"clear", "not-a-peer", "--data", dir}, `clear "not-a-peer": not a peer id`},
		{[]string{"clear", string(p), "x", "--data", dir}, "clear takes one argument"},
		{[]string{"clear", string(p), "--data", dir}, "no trainer runs on"},
		{[]string{"--spot-check", "1.5", "--data", dir}, "--spot-check 1.5: from 0 (none) to 1"},
	} {
		err := runTrainer(context.Background(), c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("trainer %q: %v, want %q", c.args, err, c.want)
		}
	}
}
