package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node"
)

// meshStatus is `mesh status --json` of data.
func meshStatus(t *testing.T, data string) peer.Status {
	t.Helper()
	var st peer.Status
	out := cli(t, "mesh", "status", "--json", "--data", data)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("mesh status --json: %v\n%s", err, out)
	}
	return st
}

// TestMeshVotersCLI: the first trainer invited into a mesh with no voter
// is made one (unless --voter=false); `mesh trust` and `mesh untrust`
// change the voter set through the running node, or in the data directory
// when none runs, on the admin's device only; `mesh status` lists the
// voters, and says when there is none.
func TestMeshVotersCLI(t *testing.T) {
	a := t.TempDir()
	cli(t, "mesh", "init", "--name", "home", "--data", a)
	const none = "no trusted trainer: versions cannot be certified; trust one with `clawmesh mesh trust PEER`"
	if out := cli(t, "mesh", "status", "--data", a); !strings.Contains(out, none) {
		t.Errorf("status of a mesh with no voter:\n%s", out)
	}
	var fields map[string]any
	raw := cli(t, "mesh", "status", "--json", "--data", a)
	if err := json.Unmarshal([]byte(raw), &fields); err != nil {
		t.Fatal(err)
	}
	if v, ok := fields["voters"].([]any); !ok || len(v) != 0 || fields["voter_set_seq"] != 0.0 {
		t.Errorf("status --json of a mesh with no voter: %s", raw)
	}
	startMeshNode(t, node.Config{DataDir: a, Upstream: scriptedUpstream(t, "ok"), NoScoring: true, Mesh: &node.MeshConfig{Listen: loopbackP2P}})

	if _, errs, code := runCLI(t, "invite", "--role", "member", "--voter", "--data", a); code != 2 || !strings.Contains(errs, "--voter is for a trainer") {
		t.Errorf("invite --role member --voter: %d %s", code, errs)
	}
	tok1, errs, code := runCLI(t, "invite", "--role", "trainer", "--data", a)
	if code != 0 || !strings.Contains(errs, "this trainer will be a voter: the mesh has none yet; --voter=false makes it a volunteer") {
		t.Fatalf("the first trainer invite: %d %s", code, errs)
	}
	tok2, errs, code := runCLI(t, "invite", "--role", "trainer", "--voter=false", "--data", a)
	if code != 0 || !strings.Contains(errs, "this trainer will be a volunteer") {
		t.Fatalf("invite --role trainer --voter=false: %d %s", code, errs)
	}
	t1, t2 := t.TempDir(), t.TempDir()
	if out := cli(t, "join", strings.TrimSpace(tok1), "--data", t1); !strings.Contains(out, "as a trainer (a voter)") {
		t.Errorf("join with a voter token: %s", out)
	}
	if out := cli(t, "join", strings.TrimSpace(tok2), "--data", t2); !strings.Contains(out, "as a trainer (a volunteer)") {
		t.Errorf("join with a volunteer token: %s", out)
	}
	id1, id2 := meshStatus(t, t1).PeerID, meshStatus(t, t2).PeerID

	// The redemption of the voter token made the trainer a voter.
	st := meshStatus(t, a)
	if !st.Running || strings.Join(st.Voters, " ") != id1 || st.VoterSetSeq != 1 {
		t.Fatalf("status after a voter joined: running %v, voters %v, seq %d", st.Running, st.Voters, st.VoterSetSeq)
	}
	if out := cli(t, "mesh", "status", "--data", a); !strings.Contains(out, "1 trusted trainer (voter set 1)") || !strings.Contains(out, id1) || strings.Contains(out, none) {
		t.Errorf("status with a voter:\n%s", out)
	}
	// With a voter in the mesh, a trainer token makes a volunteer; --voter
	// a voter.
	if _, errs, code := runCLI(t, "invite", "--role", "trainer", "--data", a); code != 0 || !strings.Contains(errs, "this trainer will be a volunteer") {
		t.Errorf("a trainer invite once the mesh has a voter: %d %s", code, errs)
	}
	if _, errs, code := runCLI(t, "invite", "--role", "trainer", "--voter", "--data", a); code != 0 || !strings.Contains(errs, "this trainer will be a voter") {
		t.Errorf("invite --role trainer --voter: %d %s", code, errs)
	}

	// trust and untrust, through the running node.
	if out := cli(t, "mesh", "trust", id2, "--data", a); !strings.Contains(out, "trusted "+id2) || !strings.Contains(out, "2 voters") {
		t.Errorf("trust: %s", out)
	}
	if st := meshStatus(t, a); len(st.Voters) != 2 || st.VoterSetSeq != 2 {
		t.Errorf("status after trust: voters %v, seq %d", st.Voters, st.VoterSetSeq)
	}
	if out := cli(t, "mesh", "trust", id2, "--data", a); !strings.Contains(out, "a voter already: nothing to do") {
		t.Errorf("trusting twice: %s", out)
	}
	if _, errs, code := runCLI(t, "mesh", "trust", "12D3KooWbogus", "--data", a); code != 1 || !strings.Contains(errs, "not a peer id") {
		t.Errorf("trusting a bad id: %d %s", code, errs)
	}
	const stranger = "12D3KooWLeSUBrLkmC5jiqPQv84yMbNk3EY5bd3vyDm6H8i92N9S"
	if _, errs, code := runCLI(t, "mesh", "trust", stranger, "--data", a); code != 1 || !strings.Contains(errs, "never admitted") {
		t.Errorf("trusting a peer never seen: %d %s", code, errs)
	}
	if out := cli(t, "mesh", "untrust", id1, "--data", a); !strings.Contains(out, "untrusted "+id1) {
		t.Errorf("untrust: %s", out)
	}
	out, errs, code := runCLI(t, "mesh", "untrust", id2, "--data", a)
	if code != 0 || !strings.Contains(out, "untrusted "+id2) || !strings.Contains(errs, "the mesh will certify no version until a voter is trusted") {
		t.Errorf("untrusting the last voter: %d %s %s", code, out, errs)
	}
	if out := cli(t, "mesh", "status", "--data", a); !strings.Contains(out, none) {
		t.Errorf("status once the last voter is untrusted:\n%s", out)
	}
	if out := cli(t, "mesh", "untrust", id2, "--data", a); !strings.Contains(out, "not a voter: nothing to do") {
		t.Errorf("untrusting a volunteer: %s", out)
	}

	// Only the admin's device decides.
	if _, errs, code := runCLI(t, "mesh", "trust", id2, "--data", t1); code != 1 || !strings.Contains(errs, "only the mesh admin") {
		t.Errorf("trust on a trainer's device: %d %s", code, errs)
	}
	if _, errs, code := runCLI(t, "invite", "--role", "trainer", "--voter", "--data", t1); code != 1 || !strings.Contains(errs, "only the mesh admin may make a voter") {
		t.Errorf("invite --voter on a trainer's device: %d %s", code, errs)
	}
	st1 := meshStatus(t, t1)
	if st1.Role != "trainer" || !st1.Volunteer {
		t.Errorf("a trainer's status, no voter set known: %+v", st1)
	}
}

// TestMeshTrustOffline: with no node running, trust writes the voter set
// into the data directory, and says it spreads at the next run.
func TestMeshTrustOffline(t *testing.T) {
	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	_, stop := startMeshNode(t, node.Config{DataDir: a, Upstream: scriptedUpstream(t, "ok"), NoScoring: true, Mesh: &node.MeshConfig{Listen: loopbackP2P}})
	tok, _, _ := runCLI(t, "invite", "--role", "trainer", "--voter=false", "--data", a)
	tr := t.TempDir()
	cli(t, "join", strings.TrimSpace(tok), "--data", tr)
	id := meshStatus(t, tr).PeerID
	stop()
	waitFor(t, "the node's address file gone", func() bool { _, err := node.ReadAddr(a); return err != nil })
	if out := cli(t, "mesh", "trust", id, "--data", a); !strings.Contains(out, "trusted "+id) || !strings.Contains(out, "spreads when this device next runs") {
		t.Errorf("offline trust: %s", out)
	}
	if st := meshStatus(t, a); st.Running || strings.Join(st.Voters, " ") != id || st.VoterSetSeq != 1 {
		t.Errorf("offline status after trust: running %v, voters %v, seq %d", st.Running, st.Voters, st.VoterSetSeq)
	}
	if out := cli(t, "mesh", "status", "--data", a); !strings.Contains(out, "1 trusted trainer (voter set 1)") || !strings.Contains(out, id) {
		t.Errorf("offline status:\n%s", out)
	}
}
