package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

var loopbackP2P = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// runMeshNode runs a node on data (in a mesh) in front of upstream, as a
// mesh peer on loopback, sealing and shipping quickly.
func runMeshNode(t *testing.T, data, upstream string, pol share.Policy) *node.Node {
	t.Helper()
	n, _ := runStoppableMeshNode(t, data, upstream, pol)
	return n
}

// runStoppableMeshNode is runMeshNode that also returns a stop function
// (the test's cleanup calls it if the test did not).
func runStoppableMeshNode(t *testing.T, data, upstream string, pol share.Policy) (*node.Node, func()) {
	t.Helper()
	return startMeshNode(t, node.Config{
		DataDir: data, Upstream: upstream, Share: pol, ShareInterval: 50 * time.Millisecond, ScoreInterval: 50 * time.Millisecond,
		Mesh: &node.MeshConfig{Listen: loopbackP2P, Ship: mesh.ShipOptions{Retry: 500 * time.Millisecond, MaxRetry: 2 * time.Second, Poll: 100 * time.Millisecond}},
	})
}

// startMeshNode runs a node made from cfg on a loopback listener until the
// test ends, and returns it and a stop function. Unless cfg names one, the
// node compiles its plugins into the cache the tests share.
func startMeshNode(t *testing.T, cfg node.Config) (*node.Node, func()) {
	t.Helper()
	if cfg.PluginCache == "" {
		cfg.PluginCache = testPluginCache
	}
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { n.Serve(ctx, ln); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done; n.Close(context.Background()) }) }
	t.Cleanup(stop)
	waitFor(t, "the node's address file", func() bool { _, err := node.ReadAddr(cfg.DataDir); return err == nil })
	return n, stop
}

func runTrainerPeer(t *testing.T, data string) *trainer.Trainer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := trainer.New(ctx, trainer.Config{DataDir: data, Listen: loopbackP2P})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; tr.Close() })
	waitFor(t, "the trainer's address file", func() bool { _, err := trainer.ReadAddr(data); return err == nil })
	return tr
}

// scriptedUpstream serves a model server that answers every call with
// text, until the test ends, and returns its base URL (…/v1).
func scriptedUpstream(t *testing.T, text string) string {
	t.Helper()
	return serveUpstream(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: text}}})
}

// serveUpstream serves a model server that follows script on loopback
// until the test ends, and returns its base URL (…/v1).
func serveUpstream(t *testing.T, script fakeupstream.Script) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go fakeupstream.New(script).Run(ctx, ln)
	return "http://" + ln.Addr().String() + "/v1"
}

// endedCall makes one chat call through the gateway of the node running
// on data, saying the session ends with it (so that it is scored and
// shipped without waiting).
func endedCall(t *testing.T, data, content string) {
	t.Helper()
	addr, err := node.ReadAddr(data)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": content}}})
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Done", "true")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

func cli(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("clawmesh %s: code %d\n%s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// TestMeshCLI: a mesh made with `mesh init`, a trainer and a second device
// invited and joined with the commands, and a call recorded on the second
// device reaching the trainer scrubbed, as `mesh batches` and `mesh batch`
// show on each side; `mesh revoke` removes the device.
func TestMeshCLI(t *testing.T) {
	upstream := scriptedUpstream(t, "Sure, I will write to ann.lee@example.org.")

	a, b, tr := t.TempDir(), t.TempDir(), t.TempDir()
	out := cli(t, "mesh", "init", "--name", "home", "--data", a)
	if !strings.Contains(out, "mesh m") || !strings.Contains(out, "admin key") {
		t.Fatalf("init: %s", out)
	}
	// What will leave the device from now on, and how not to.
	if !strings.Contains(out, `sharing: the scored steps that carry a learning signal leave`) || !strings.Contains(out, `mode = "none" in `+filepath.Join(a, "config.toml")) {
		t.Errorf("init says nothing of sharing: %s", out)
	}
	if _, errs, code := runCLI(t, "mesh", "init", "--data", a); code == 0 || !strings.Contains(errs, "already in a mesh") {
		t.Errorf("init twice: %d %s", code, errs)
	}
	na := runMeshNode(t, a, upstream, share.Policy{})
	if m := na.Outbox().Policy().Mode; m != share.ModeScored {
		t.Errorf("a node in a mesh with no [share] mode shares %q, want scored", m)
	}

	tok := strings.TrimSpace(cli(t, "invite", "--role", "trainer", "--data", a))
	if !strings.HasPrefix(tok, "clawmesh-invite1:") || strings.Count(tok, "\n") != 0 {
		t.Fatalf("invite printed %q", tok)
	}
	if out := cli(t, "join", tok, "--data", tr, "--p2p-listen", loopbackP2P[0]); !strings.Contains(out, "as a trainer") || !strings.Contains(out, "clawmesh trainer") {
		t.Fatalf("join: %s", out)
	}
	if _, errs, code := runCLI(t, "join", tok, "--data", t.TempDir()); code == 0 || !strings.Contains(errs, "already redeemed") {
		t.Errorf("a token used twice: %d %s", code, errs)
	}
	runTrainerPeer(t, tr)

	mtok := strings.TrimSpace(cli(t, "invite", "--data", a))
	if out := cli(t, "join", mtok, "--data", b); !strings.Contains(out, "sharing: the scored steps") {
		t.Errorf("a member's join says nothing of sharing: %s", out)
	}
	nb := runMeshNode(t, b, upstream, share.Policy{Mode: share.ModeAll})

	var st peer.Status
	waitFor(t, "the admin's device to admit the trainer and the device", func() bool {
		out, _, _ := runCLI(t, "mesh", "status", "--json", "--data", a)
		return json.Unmarshal([]byte(out), &st) == nil && st.Admitted >= 2
	})
	if !st.Running || !st.Admin || st.Role != "member" || !st.MayInvite || st.Name != "home" {
		t.Errorf("status: %+v", st)
	}
	peers := cli(t, "mesh", "peers", "--data", a)
	if !strings.Contains(peers, "trainer") || !strings.Contains(peers, string(nb.Peer().Mesh.ID())) {
		t.Errorf("peers:\n%s", peers)
	}

	// A call through the second device's gateway.
	endedCall(t, b, "Mail ann.lee@example.org the report")

	var got []peer.BatchInfo
	// Scoring waits for the plugins to compile: slow on a loaded machine.
	waitLong(t, 5*time.Minute, "the trainer to store the batch", func() bool {
		out, _, _ := runCLI(t, "mesh", "batches", "--json", "--data", tr)
		return json.Unmarshal([]byte(out), &got) == nil && len(got) == 1
	})
	if got[0].Steps != 1 || got[0].Received.IsZero() {
		t.Errorf("trainer's batches: %+v", got)
	}
	steps := cli(t, "mesh", "batch", string(got[0].ID), "--data", tr)
	var e core.ExportedStep
	if err := json.Unmarshal([]byte(steps), &e); err != nil {
		t.Fatalf("mesh batch: %v\n%s", err, steps)
	}
	if strings.Contains(steps, "ann.lee") || e.Request.Messages[0].Content != "Mail <EMAIL_1> the report" || e.Action().Content != "Sure, I will write to <EMAIL_1>." {
		t.Errorf("the batch on the trainer:\n%s", steps)
	}
	var mine []peer.BatchInfo
	waitFor(t, "the device to mark its batch shipped", func() bool {
		out, _, _ := runCLI(t, "mesh", "batches", "--json", "--data", b)
		return json.Unmarshal([]byte(out), &mine) == nil && len(mine) == 1 && !mine[0].Shipped.IsZero()
	})
	if mine[0].ID != got[0].ID {
		t.Errorf("the device shipped %s, the trainer holds %s", mine[0].ID, got[0].ID)
	}
	if human := cli(t, "mesh", "batches", "--data", b); !strings.Contains(human, "shipped") {
		t.Errorf("batches:\n%s", human)
	}

	// The trainer, alone in its group, trains the device's batch into v1.
	var ts trainer.Status
	waitLong(t, 4*time.Minute, "the trainer to verify and train the batch", func() bool {
		out, _, _ := runCLI(t, "trainer", "status", "--json", "--data", tr)
		return json.Unmarshal([]byte(out), &ts) == nil && ts.Batches.Trained == 1 && ts.Version != nil && ts.Version.Version.Version >= 1
	})
	if ts.State != "leader" || ts.Leader != ts.Peer || len(ts.Voters) != 1 || ts.Config.Recipe != "combined" || ts.Config.Base != "tiny" || ts.Version.Dir == "" {
		t.Errorf("trainer status: %+v", ts)
	}
	// It replayed the batch's reward plugins first, fetched from the device.
	if mods, _ := filepath.Glob(filepath.Join(tr, trainer.PluginsDir, "*.wasm")); len(mods) == 0 {
		t.Errorf("the trainer verified no plugin of the batch")
	}
	if human := cli(t, "trainer", "status", "--data", tr); !strings.Contains(human, "1 trained") || !strings.Contains(human, "leader") {
		t.Errorf("trainer status:\n%s", human)
	}
	if out := cli(t, "trainer", "config", "--recipe", "opd", "--data", tr); !strings.Contains(out, "recipe opd") {
		t.Errorf("trainer config: %s", out)
	}
	if _, errs, code := runCLI(t, "trainer", "config", "--recipe", "sft", "--data", tr); code == 0 || !strings.Contains(errs, "recipe") {
		t.Errorf("a bad recipe: %d %s", code, errs)
	}
	if out := cli(t, "trainer", "config", "--recipe", "combined", "--rl-weight", "1", "--opd-weight", "0.25", "--data", tr); !strings.Contains(out, "weights: reward 1, hint 0.25") {
		t.Errorf("trainer config with weights: %s", out)
	}
	var gc group.Config
	if err := json.Unmarshal([]byte(cli(t, "trainer", "config", "--json", "--data", tr)), &gc); err != nil || gc.WeightsOf() != (loss.Weights{RL: 1, OPD: 0.25}) {
		t.Errorf("the group's weights: %+v %v", gc, err)
	}
	if _, errs, code := runCLI(t, "trainer", "config", "--rl-weight", "-1", "--data", tr); code == 0 || !strings.Contains(errs, "weights") {
		t.Errorf("a negative weight: %d %s", code, errs)
	}

	// Revoke the device from the admin's.
	bid := string(nb.Peer().Mesh.ID())
	if out := cli(t, "mesh", "revoke", bid, "--reason", "sold", "--data", a); !strings.Contains(out, "revoked") {
		t.Errorf("revoke: %s", out)
	}
	waitFor(t, "the trainer to refuse the revoked device", func() bool {
		var ps []peer.PeerInfo
		out, _, _ := runCLI(t, "mesh", "peers", "--json", "--data", tr)
		if json.Unmarshal([]byte(out), &ps) != nil {
			return false
		}
		for _, p := range ps {
			if p.PeerID == bid {
				return false
			}
		}
		return true
	})
	if _, errs, code := runCLI(t, "mesh", "batch", strings.Repeat("0", 64), "--data", tr); code == 0 || !strings.Contains(errs, "no such batch") {
		t.Errorf("an unknown batch: %d %s", code, errs)
	}
}

// TestMeshOffline: the mesh commands on data directories no peer runs on.
func TestMeshOffline(t *testing.T) {
	d := t.TempDir()
	if _, errs, code := runCLI(t, "mesh", "status", "--data", d); code == 0 || !strings.Contains(errs, "not in a mesh") {
		t.Errorf("status of no mesh: %d %s", code, errs)
	}
	cli(t, "mesh", "init", "--data", d)
	var st peer.Status
	if err := json.Unmarshal([]byte(cli(t, "mesh", "status", "--json", "--data", d)), &st); err != nil || st.Running || st.PeerID == "" || !st.Admin {
		t.Errorf("offline status: %+v, %v", st, err)
	}
	if out := cli(t, "mesh", "peers", "--json", "--data", d); strings.TrimSpace(out) != "[]" {
		t.Errorf("offline peers: %q", out)
	}
	if out := cli(t, "mesh", "batches", "--json", "--data", d); strings.TrimSpace(out) != "[]" {
		t.Errorf("offline batches: %q", out)
	}
	// No address known yet: a clear error.
	if _, errs, code := runCLI(t, "invite", "--data", d); code == 0 || !strings.Contains(errs, "no address") {
		t.Errorf("invite before any run: %d %s", code, errs)
	}
	if _, errs, code := runCLI(t, "invite", "--role", "admin", "--data", d); code != 2 {
		t.Errorf("invite --role admin: %d %s", code, errs)
	}
	if _, errs, code := runCLI(t, "join", "clawmesh-invite1:not*base64", "--data", t.TempDir()); code == 0 || !strings.Contains(errs, "tampered") {
		t.Errorf("a bad token: %d %s", code, errs)
	}
	// revoke takes a peer id, of a peer this device knows unless --force,
	// and says so in one line, then what to do.
	for _, bad := range []string{"12D3KooWbogus", "Traceback (most recent call last):\n  File \"agent.py\", line 12, in <module>\nKeyError: 'peer'"} {
		if _, errs, code := runCLI(t, "mesh", "revoke", bad, "--data", d); code != 1 || strings.Count(errs, "\n") != 2 || !strings.Contains(errs, "not a peer id") {
			t.Errorf("revoke %q: %d %q", bad, code, errs)
		}
	}
	const stranger = "12D3KooWLeSUBrLkmC5jiqPQv84yMbNk3EY5bd3vyDm6H8i92N9S"
	if _, errs, code := runCLI(t, "mesh", "revoke", stranger, "--data", d); code != 1 || strings.Count(errs, "\n") != 2 || !strings.Contains(errs, "--force") {
		t.Errorf("revoke an unknown peer: %d %q", code, errs)
	}
	if err := json.Unmarshal([]byte(cli(t, "mesh", "status", "--json", "--data", d)), &st); err != nil || st.Revocations != 0 {
		t.Errorf("after refused revokes: %+v", st)
	}
	if out := cli(t, "mesh", "revoke", stranger, "--force", "--reason", "typo'd? no", "--data", d); !strings.Contains(out, "spreads when") {
		t.Errorf("offline revoke: %s", out)
	}
	if out := cli(t, "mesh", "revoke", stranger, "--force", "--data", d); !strings.Contains(out, "already revoked") || !strings.Contains(out, "typo'd? no") {
		t.Errorf("revoking twice: %s", out)
	}
	if err := json.Unmarshal([]byte(cli(t, "mesh", "status", "--json", "--data", d)), &st); err != nil || st.Revocations != 1 || st.Revoked {
		t.Errorf("after an offline revoke: %+v", st)
	}
}

// startBarePeer runs the mesh peer of data (no node) on loopback until the
// test ends, and returns it and a stop function.
func startBarePeer(t *testing.T, data string) (*peer.Peer, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: data, Listen: loopbackP2P})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done; p.Close() }) }
	t.Cleanup(stop)
	return p, stop
}

// TestMeshRevokedCLI: a device removed from the mesh says so in `mesh
// status`, and when it tries to join again under its old peer id, `join`
// prints the inviter's refusal, not that the inviter is unreachable.
func TestMeshRevokedCLI(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	pa, stopA := startBarePeer(t, a)
	cli(t, "join", strings.TrimSpace(cli(t, "invite", "--data", a)), "--data", b)
	pb, stopB := startBarePeer(t, b)
	waitFor(t, "the device admitted", func() bool { return pa.Mesh.Admitted(pb.Mesh.ID()) })
	if _, err := pa.Mesh.Revoke(context.Background(), pb.Mesh.ID(), mesh.RevokeOptions{Reason: "sold"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the device told", func() bool { return pb.Mesh.Revoked() != nil })
	stopB()
	var st peer.Status
	if err := json.Unmarshal([]byte(cli(t, "mesh", "status", "--json", "--data", b)), &st); err != nil || !st.Revoked || st.RevokedBy != "the mesh admin" || st.RevokedReason != "sold" {
		t.Errorf("status --json of a revoked device: %+v %v", st, err)
	}
	if out := cli(t, "mesh", "status", "--data", b); !strings.Contains(out, "REVOKED") || !strings.Contains(out, "removed from the mesh by the mesh admin") || !strings.Contains(out, "(reason: sold)") {
		t.Errorf("status of a revoked device:\n%s", out)
	}
	// Joining again under the same peer id, once the refusal of its last
	// connection has passed (a restarted inviter forgets it).
	stopA()
	startBarePeer(t, a)
	again := t.TempDir()
	id, err := os.ReadFile(filepath.Join(b, p2p.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(again, p2p.IdentityFile), id, 0o600)
	tok := strings.TrimSpace(cli(t, "invite", "--data", a))
	_, errs, code := runCLI(t, "join", tok, "--data", again)
	if code != 1 || !strings.Contains(errs, "removed from the mesh") || !strings.Contains(errs, "sold") {
		t.Errorf("join of a revoked device: %d\n%s", code, errs)
	}
}

// TestJoinUnreachable: `join` says which addresses it tries and, when
// none answers, one line of why; --verbose adds each address's error.
func TestJoinUnreachable(t *testing.T) {
	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	key, id, err := peer.Identity(a)
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{"/ip4/127.0.0.1/tcp/9/p2p/" + string(id), "/ip4/127.0.0.1/tcp/1/p2p/" + string(id)}
	tok, err := mesh.Invite(a, key, member.RoleMember, time.Hour, 1, addrs, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, errs, code := runCLI(t, "join", tok.String(), "--data", t.TempDir(), "--p2p-listen", loopbackP2P[1])
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	if code != 1 || len(lines) != 6 || !strings.Contains(lines[0], addrs[0]+" (1 of 2)") || !strings.Contains(lines[2], addrs[1]+" (2 of 2)") ||
		!strings.Contains(lines[1], "no answer") || !strings.Contains(lines[4], "cannot reach the inviter at any of its 2 addresses") ||
		!strings.Contains(lines[5], "--verbose") || strings.Contains(errs, "dial tcp") {
		t.Errorf("join with the inviter offline: %d\n%s", code, errs)
	}
	_, errs, code = runCLI(t, "join", tok.String(), "--verbose", "--data", t.TempDir(), "--p2p-listen", loopbackP2P[1])
	if code != 1 || !strings.Contains(errs, "dial tcp") || !strings.Contains(errs, addrs[1]+": ") {
		t.Errorf("join --verbose with the inviter offline: %d\n%s", code, errs)
	}
}

// TestBenchMeshCLI: `clawmesh bench mesh` runs and reports its goal.
func TestBenchMeshCLI(t *testing.T) {
	out := cli(t, "bench", "mesh", "--batches", "2", "--pull-bytes", "262144", "--rounds", "1", "--idle", "0")
	for _, want := range []string{"p50", "p99", "bare libp2p stream (baseline)", "goal >= 0.80x"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench mesh lacks %q:\n%s", want, out)
		}
	}
}

// TestUnshippedSurvivesRestart: a batch sealed while no trainer is in the
// mesh waits in the outbox; after the node restarts it is announced again
// and ships, once, to the trainer that joined meanwhile.
func TestUnshippedSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	upstream := scriptedUpstream(t, "Noted.")

	a, b, tr := t.TempDir(), t.TempDir(), t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	runMeshNode(t, a, upstream, share.Policy{})
	cli(t, "join", strings.TrimSpace(cli(t, "invite", "--data", a)), "--data", b)
	nb, stop := runStoppableMeshNode(t, b, upstream, share.Policy{Mode: share.ModeAll})
	addr, _ := node.ReadAddr(b)
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"remember this"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Done", "true")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitLong(t, 5*time.Minute, "a sealed batch", func() bool { bs, _ := nb.Pool().Batches(ctx); return len(bs) == 1 })
	time.Sleep(time.Second) // announced, to no trainer
	stop()

	cli(t, "join", strings.TrimSpace(cli(t, "invite", "--role", "trainer", "--data", a)), "--data", tr)
	trn := runTrainerPeer(t, tr)
	runMeshNode(t, b, upstream, share.Policy{Mode: share.ModeAll})
	var mine []peer.BatchInfo
	waitFor(t, "the batch shipped after the restart", func() bool {
		out, _, _ := runCLI(t, "mesh", "batches", "--json", "--data", b)
		return json.Unmarshal([]byte(out), &mine) == nil && len(mine) == 1 && !mine[0].Shipped.IsZero()
	})
	held, err := trn.Store().List(ctx)
	if err != nil || len(held) != 1 || held[0].ID != mine[0].ID {
		t.Fatalf("the trainer holds %+v, %v; the node shipped %s", held, err, mine[0].ID)
	}
}

// TestPrintBatches: `mesh batches` says of each batch when it shipped or
// was received, and of one waiting when it is announced next, or why it
// will not ship.
func TestPrintBatches(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.Local)
	id := func(c string) core.BatchID { return core.BatchID(strings.Repeat(c, 64)) }
	for _, tc := range []struct {
		b    peer.BatchInfo
		want string
	}{
		{peer.BatchInfo{ID: id("a"), Shipped: now.Add(-time.Minute)}, "shipped 11-29 11:59:00"},
		{peer.BatchInfo{ID: id("b"), Received: now.Add(-time.Hour)}, "received 11-29 11:00:00"},
		{peer.BatchInfo{ID: id("c"), NextAnnounce: now.Add(25 * time.Second)}, "waiting for a trainer; announced again at 12:00:25 (in 25s)"},
		{peer.BatchInfo{ID: id("d"), NextAnnounce: now.Add(-time.Second)}, "waiting for a trainer; announced again any moment now"},
		{peer.BatchInfo{ID: id("e"), Blocked: "this device was removed from the mesh by the mesh admin"}, "will not ship: this device was removed from the mesh by the mesh admin"},
		{peer.BatchInfo{ID: id("f")}, "waiting for a trainer"},
	} {
		var b bytes.Buffer
		if err := printBatches(&b, []peer.BatchInfo{tc.b}, now); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		if len(lines) != 2 || !strings.HasSuffix(lines[1], tc.want) {
			t.Errorf("%+v:\n%s\nwant it to end in %q", tc.b, b.String(), tc.want)
		}
	}
}
