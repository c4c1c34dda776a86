package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// TestWeightsComeBack closes the loop on real parts: a node in front of
// `clawmesh serve --tiny` records calls that three trainers (raft, on
// loopback libp2p) train into v1; the leader signs v1's manifest and
// serves it over QUIC; the node fetches it, verifies it, installs it and
// hot-swaps it into the model server, and its next reply is v1's, recorded
// as such. A second device, whose upstream cannot hot-swap, fetches and
// installs v1 too.
func TestWeightsComeBack(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a model server, two nodes and three trainers")
	}
	ctx := context.Background()
	modelAddr := serveTiny(t)
	log := failureLog(t, "the nodes and trainers")

	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	na := runWeightsNode(t, a, "http://"+modelAddr+"/v1", "clawmesh", nil, log.With("device", "a"))
	b := t.TempDir()
	cli(t, "join", strings.TrimSpace(cli(t, "invite", "--data", a)), "--data", b, "--p2p-listen", loopbackP2P[1])
	nb := runWeightsNode(t, b, scriptedUpstream(t, "fine"), "openai", na.Peer().Host.Addrs(), log.With("device", "b"))

	timing := trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond,
		VerifyRetry: 2 * time.Second}
	var trainerDirs []string
	for range 3 {
		d := t.TempDir()
		trainerDirs = append(trainerDirs, d)
		joinTrainer(t, a, d, trainer.Config{Bootstrap: na.Peer().Host.Addrs(), Timing: timing,
			Group: group.Config{Deadline: 5 * time.Second, LocalSteps: 1}, Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond, Logger: log.With("trainer", len(trainerDirs))})
	}

	// The three steps leave in one batch, so that one round trains them
	// into v1, however slowly a loaded machine scores them; nothing leaves
	// the first device after v1, so v1 stays the newest version.
	if err := na.ReloadShare(share.Policy{Mode: share.ModeNone}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		endedCall(t, a, "Question "+string(rune('A'+i))+": list the files")
	}
	waitLong(t, 5*time.Minute, "the three steps scored", func() bool {
		steps, err := na.Pool().List(ctx, pool.Filter{State: core.StateScored})
		return err == nil && len(steps) == 3
	})
	if err := na.ReloadShare(share.Policy{Mode: share.ModeAll}); err != nil {
		t.Fatal(err)
	}
	waitLong(t, 5*time.Minute, "v1 serving on the first device", func() bool {
		return na.Follower().Status().Serving == "v1"
	})
	if err := na.ReloadShare(share.Policy{Mode: share.ModeNone}); err != nil {
		t.Fatal(err)
	}
	st := na.Follower().Status()
	if st.Driver != "clawmesh" || st.Latest != "v1" || len(st.Versions) == 0 || st.Versions[0].State != "serving" {
		t.Fatalf("status after the swap: %+v", st)
	}

	// The model server serves v1 now, and the gateway records it.
	addr, _ := node.ReadAddr(a)
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": "after"}}})
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Get(serveapi.AdapterHeader); resp.StatusCode != 200 || got != "v1" {
		t.Fatalf("reply after the swap: %d, served by %q", resp.StatusCode, got)
	}
	var found bool
	waitFor(t, "the call recorded", func() bool {
		steps, err := na.Pool().List(ctx, pool.Filter{})
		if err != nil {
			return false
		}
		for _, s := range steps {
			if len(s.Request.Messages) > 0 && strings.Contains(s.Request.Messages[len(s.Request.Messages)-1].Content, "after") {
				found = s.Adapter == "v1"
				return true
			}
		}
		return false
	})
	if !found {
		t.Fatal("the step served after the swap does not name v1")
	}

	// The second device installs v1 (its upstream cannot hot-swap).
	waitLong(t, 2*time.Minute, "v1 installed on the second device", func() bool {
		for _, v := range nb.Follower().Status().Versions {
			if v.Version == "v1" && (v.State == "serving" || v.State == "installed") {
				return true
			}
		}
		return false
	})

	// pool stats counts the steps each version served.
	if out := cli(t, "pool", "stats", "--data", a); !strings.Contains(out, "served by") || !strings.Contains(out, " v1 1") {
		t.Errorf("pool stats does not count the step v1 served:\n%s", out)
	}

	// The commands: ls --json, pin and unpin, get, and bad input.
	var ls adapters.Status
	if err := json.Unmarshal([]byte(cli(t, "weights", "ls", "--json", "--data", a)), &ls); err != nil || ls.Serving != "v1" || ls.Latest != "v1" {
		t.Fatalf("weights ls --json: %+v %v", ls, err)
	}
	if out := cli(t, "weights", "ls", "--data", a); !strings.Contains(out, "serving:  v1") || !regexp.MustCompile(`(?m)^v1 +[0-9a-f]{12} +serving `).MatchString(out) {
		t.Errorf("weights ls:\n%s", out)
	}
	if err := json.Unmarshal([]byte(cli(t, "weights", "use", "v1", "--json", "--data", a)), &ls); err != nil || ls.Pin != "v1" {
		t.Fatalf("weights use v1: %+v %v", ls, err)
	}
	if out := cli(t, "weights", "use", "latest", "--data", a); !strings.Contains(out, "following the newest") {
		t.Errorf("weights use latest: %s", out)
	}
	if out := cli(t, "weights", "get", "v1", "--data", b); !strings.Contains(out, "v1") {
		t.Errorf("weights get v1: %s", out)
	}
	for _, args := range [][]string{{"use", "v9"}, {"use", "seven"}, {"get", "base"}, {"frob"}} {
		_, errs, code := runCLI(t, append(append([]string{"weights"}, args...), "--data", a)...)
		if code == 0 || errs == "" {
			t.Errorf("weights %v: code %d, %q", args, code, errs)
		}
	}

	// Fencing and the signature chain, with manifests a trainer of the
	// mesh signs (its real key and certificate).
	v1 := na.Weights().Latest()
	sign := func(dir string, edit func(*chunks.Manifest)) *chunks.Manifest {
		key, _, err := peer.Identity(dir)
		if err != nil {
			t.Fatal(err)
		}
		st, err := mesh.LoadState(dir)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := st.Certificate()
		if err != nil {
			t.Fatal(err)
		}
		m, err := chunks.NewManifest([]byte("another bundle"))
		if err != nil {
			t.Fatal(err)
		}
		m.MeshID, m.Version, m.Parent, m.Base, m.Term, m.Index = v1.MeshID, v1.Version+1, v1.Version, v1.Base, v1.Term, v1.Index+5
		edit(m)
		if err := m.Sign(key, cert, time.Now()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// The first trainer is the mesh's one voter (the first trainer
	// invited); the others volunteer.
	vs := na.Peer().Mesh.Voters()
	if vs == nil || vs.Len() != 1 || !vs.Has(string(trainerID(t, trainerDirs[0]))) {
		t.Fatalf("the voter set on the first device: %v", vs)
	}
	certify := func(m *chunks.Manifest) *chunks.Manifest {
		key, _, err := peer.Identity(trainerDirs[0])
		if err != nil {
			t.Fatal(err)
		}
		vote, err := m.VoteFor(key, string(trainerID(t, trainerDirs[0])), vs)
		if err != nil {
			t.Fatal(err)
		}
		if !m.Certify(vs, []chunks.Vote{vote}) {
			t.Fatal("the voter's vote is no quorum")
		}
		return m
	}
	for _, tc := range []struct {
		name string
		m    *chunks.Manifest
		want error
	}{
		// A volunteer's own version, with made-up numbers, and the ones
		// fencing would have refused: not certified.
		{"a volunteer's v1000", sign(trainerDirs[1], func(m *chunks.Manifest) { m.Version, m.Term, m.Index = 1000, 1<<30, 1<<40 }), chunks.ErrUncertified},
		{"an uncertified older version", sign(trainerDirs[1], func(m *chunks.Manifest) { m.Version = 0 }), chunks.ErrUncertified},
		{"an uncertified second v1", sign(trainerDirs[1], func(m *chunks.Manifest) { m.Version = v1.Version }), chunks.ErrUncertified},
		// Certified by the voter, but behind v1: fenced.
		{"an older version", sign(trainerDirs[0], func(m *chunks.Manifest) { m.Version = 0; certify(m) }), chunks.ErrStale},
		{"a lower term", sign(trainerDirs[0], func(m *chunks.Manifest) { m.Term = v1.Term - 1; certify(m) }), chunks.ErrStale},
		{"a second v1", sign(trainerDirs[0], func(m *chunks.Manifest) { m.Version = v1.Version; certify(m) }), chunks.ErrStale},
		{"a wrong signature", func() *chunks.Manifest {
			m := sign(trainerDirs[1], func(*chunks.Manifest) {})
			m.Index++
			return m
		}(), chunks.ErrSignature},
		{"a device's signature", sign(b, func(*chunks.Manifest) {}), chunks.ErrSignature},
	} {
		if err := na.Weights().Accept(tc.m, weights.Source{}); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	revoked := sign(trainerDirs[2], func(*chunks.Manifest) {})
	tid := trainerID(t, trainerDirs[2])
	cli(t, "mesh", "revoke", string(tid), "--reason", "test", "--data", a)
	waitFor(t, "the revocation on the node", func() bool { return na.Peer().Mesh.Blocked(tid) })
	if err := na.Weights().Accept(revoked, weights.Source{}); !errors.Is(err, chunks.ErrSignature) {
		t.Errorf("a manifest signed by a revoked trainer: %v", err)
	}
	if got := na.Weights().Latest(); got.Version != v1.Version {
		t.Errorf("a refused manifest moved the latest to v%d", got.Version)
	}

	// The first device's /metrics says what happened: v1 fetched and
	// serving, the manifests above refused by reason.
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	metric := func(name, label, value string) float64 {
		t.Helper()
		for _, m := range fams[name].GetMetric() {
			ok := label == ""
			for _, l := range m.GetLabel() {
				ok = ok || (l.GetName() == label && l.GetValue() == value)
			}
			if ok {
				if m.Counter != nil {
					return m.Counter.GetValue()
				}
				return m.Gauge.GetValue()
			}
		}
		t.Fatalf("no series %s{%s=%q}", name, label, value)
		return 0
	}
	if got := metric("clawmesh_weights_fetched_bytes_total", "", ""); got < float64(v1.Size) {
		t.Errorf("fetched %v bytes, v1 is %d", got, v1.Size)
	}
	if got := metric("clawmesh_weights_versions_accepted_total", "", ""); got < 1 {
		t.Errorf("%v versions accepted", got)
	}
	if got := metric("clawmesh_weights_versions_refused_total", "reason", "stale"); got < 3 {
		t.Errorf("%v stale manifests refused, want at least the 3 above", got)
	}
	if got := metric("clawmesh_weights_versions_refused_total", "reason", "uncertified"); got < 3 {
		t.Errorf("%v uncertified manifests refused, want at least the 3 above", got)
	}
	if got := metric("clawmesh_weights_versions_refused_total", "reason", "signature"); got < 3 {
		t.Errorf("%v manifests refused for their signature, want at least the 3 above", got)
	}
	if got := metric("clawmesh_adapter_serving_version", "", ""); got != 1 {
		t.Errorf("serving version %v, want 1", got)
	}
}

// trainerID is the peer id of the peer whose data directory is dir.
func trainerID(t *testing.T, dir string) mesh.PeerID {
	t.Helper()
	_, id, err := peer.Identity(dir)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// runWeightsNode runs a mesh node that follows the trainers' versions,
// with short intervals.
func runWeightsNode(t *testing.T, data, upstream, kind string, bootstrap []string, log *slog.Logger) *node.Node {
	t.Helper()
	n, _ := startMeshNode(t, node.Config{
		DataDir: data, Upstream: upstream, UpstreamKind: kind, Share: share.Policy{Mode: share.ModeAll}, ShareInterval: 50 * time.Millisecond, ScoreInterval: 50 * time.Millisecond,
		Mesh: &node.MeshConfig{Listen: loopbackP2P, Bootstrap: bootstrap, Ship: mesh.ShipOptions{Retry: 500 * time.Millisecond, MaxRetry: 2 * time.Second, Poll: 100 * time.Millisecond},
			Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond, WeightsRetry: 300 * time.Millisecond},
		Logger: log,
	})
	return n
}
