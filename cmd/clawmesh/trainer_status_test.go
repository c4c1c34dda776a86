package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// TestTrainerStatusHuman: `trainer status` prints a version's hash as
// `weights ls` does (label "hash", the same digits), pads its keys to the
// longest key rather than to a trainer's id, and says a trainer's speed is
// not measured rather than printing the default.
func TestTrainerStatusHuman(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	long := mesh.PeerID("12D3KooW" + strings.Repeat("x", 44))
	st := trainer.Status{Peer: long, State: "leader", Leader: long, Voters: []mesh.PeerID{long},
		Version:  &trainer.VersionStatus{Version: group.Version{Version: 3, Hash: hash, Term: 2, Index: 30, At: time.Now()}, Name: "v3"},
		Trainers: []group.Trainer{{ID: long, Engine: "torch", Device: "cpu", Speed: 1}, {ID: "t2", Engine: "torch", Device: "cuda", Speed: 12.5, Measured: true}}}
	var buf bytes.Buffer
	printTrainerStatus(&buf, st)
	out := buf.String()
	if !strings.Contains(out, "adapter   v3 (hash abababababab, term 2, index 30, not certified yet)\n") {
		t.Errorf("the version's line:\n%s", out)
	}
	if !strings.Contains(out, "trust     no voter set known yet") {
		t.Errorf("the trainer's trust:\n%s", out)
	}
	st.Trusted, st.VoterSet, st.Retracted = true, 4, 1
	st.Version.Cert = &group.Certify{Votes: []group.Vote{{Peer: "a"}, {Peer: "b"}}}
	buf.Reset()
	printTrainerStatus(&buf, st)
	out2 := strings.Join(strings.Fields(buf.String()), " ")
	for _, want := range []string{"index 30, certified, 2 votes)", "trust a voter: it votes in the group and certifies versions (voter set 4)", "retracted 1 version (not certified by the voters)"} {
		if !strings.Contains(out2, want) {
			t.Errorf("no %q in:\n%s", want, out2)
		}
	}
	if !strings.Contains(out, "speed not measured yet") || !strings.Contains(out, "12.5 samples/s") || strings.Contains(out, "1.0 samples/s") {
		t.Errorf("the trainers' speeds:\n%s", out)
	}
	if !strings.Contains(out, "\nterm      0 (applied 0)\n") {
		t.Errorf("the keys are not padded to the longest key:\n%s", out)
	}

	var ls bytes.Buffer
	printWeights(&ls, adapters.Status{Versions: []adapters.Version{{Version: "v3", State: "serving", Bundle: strings.Repeat("0", 64), Hash: hash, Term: 2, Index: 30}}})
	if !strings.Contains(ls.String(), "v3       abababababab") {
		t.Errorf("weights ls prints the hash otherwise:\n%s", ls.String())
	}
}
