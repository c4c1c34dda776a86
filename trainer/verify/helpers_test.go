package verify_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

// The device side of these tests is the real one a node runs: its reward
// runner scores the raw steps, its outbox (node/share) scrubs them, scores
// them again and encodes the batch. It is imported here by the tests only;
// the package itself knows nothing of nodes.

var testDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "clawmesh-verify-test-")
	if err != nil {
		panic(err)
	}
	testDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

var contact struct {
	once sync.Once
	path string
	err  error
}

// contactPlugin builds reward/testdata/contact, a plugin whose verdict
// reads e-mail addresses in the reply, once per run.
func contactPlugin(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH to build the contact plugin")
	}
	contact.once.Do(func() {
		contact.path = filepath.Join(testDir, "contact.wasm")
		_, contact.err = reward.Build(context.Background(), "../../reward/testdata/contact", contact.path, os.Stderr)
	})
	if contact.err != nil {
		t.Fatal(contact.err)
	}
	return contact.path
}

func compileCache() string { return filepath.Join(testDir, "wazero") }

// device is a node's scoring and sharing, without its gateway: a pool of
// scored steps, the reward runner that scored them and an outbox.
type device struct {
	runner *reward.Runner
	pool   *pool.Pool
	out    *share.Outbox
	// raw seals without scoring again: what the batch would carry if the
	// scores made before scrubbing left as they were.
	raw *share.Outbox
	// judged counts the calls to the device's LLM judge.
	judged int
}

var t0 = time.Date(2026, 5, 1, 9, 30, 0, 0, time.UTC)

func newDevice(t testing.TB) *device {
	t.Helper()
	ctx := context.Background()
	d := &device{}
	plugins := reward.Builtins()
	for i := range plugins {
		if plugins[i].Builtin == "judge" {
			plugins[i].Enabled = true // the device's LLM judges too
		}
	}
	plugins = append(plugins, reward.PluginConfig{Name: "contact", Path: contactPlugin(t), Enabled: true})
	r, err := reward.New(ctx, reward.Options{
		Plugins: plugins, CacheDir: compileCache(), Deadline: 5 * time.Second, Strict: true,
		Judge: func(context.Context, string) (string, error) { d.judged++; return "Score: 1", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(ctx) })
	d.runner = r
	if d.pool, err = pool.Open(t.TempDir(), pool.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.pool.Close() })
	key := bytes.Repeat([]byte{7}, 32)
	pol := share.Policy{Mode: share.ModeAll, Tools: []string{"*"}}
	now := func() time.Time { return t0 }
	if d.out, err = share.New(share.Options{Pool: d.pool, Key: key, Policy: pol, Rescore: r, Now: now}); err != nil {
		t.Fatal(err)
	}
	if d.raw, err = share.New(share.Options{Pool: d.pool, Key: key, Policy: pol, Now: now}); err != nil {
		t.Fatal(err)
	}
	return d
}

// record scores steps as the node's scorer does, on the steps as
// recorded, and puts them in the pool.
func (d *device) record(t testing.TB, steps ...*core.Step) {
	t.Helper()
	ctx := context.Background()
	for _, s := range steps {
		rw := d.runner.Score(ctx, s)
		s.Reward, s.State = &rw, core.StateScored
		if err := d.pool.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
}

// seal returns the next batch's bytes, decoded, from out (a dry run: the
// pool is not changed).
func seal(t testing.TB, out *share.Outbox) ([]byte, *batch.Batch) {
	t.Helper()
	pr, err := out.Prepare(context.Background())
	if err != nil || pr == nil || pr.Payload == nil {
		t.Fatalf("no batch: %+v, %v", pr, err)
	}
	b, err := batch.Verify(pr.Payload, pr.ID, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return pr.Payload, b
}

// recordedSteps are the reward package's recorded steps, which the
// built-ins score, and one whose reply gives an e-mail address.
func recordedSteps(t testing.TB) []*core.Step {
	t.Helper()
	f, err := os.Open("../../reward/testdata/steps.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	steps, err := reward.ReadSteps(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []*core.Step
	for i := range steps {
		out = append(out, &steps[i])
	}
	return append(out, emailStep())
}

// emailStep is a step whose reply gives an e-mail address, which the
// scrubber replaces before the step leaves.
func emailStep() *core.Step {
	return &core.Step{
		ID: "13-address", SessionID: "s-mail", Turn: core.TurnMain, API: core.APIChat, State: core.StateClosed,
		Request: core.Request{Model: "qwen3:8b", Messages: []core.Message{
			{Role: core.RoleUser, Content: "Who do I write to about the invoice?"},
		}},
		Response: core.Response{Model: "qwen3:8b", Choices: []core.Choice{{Message: core.Message{
			Role: core.RoleAssistant, Content: "Write to billing.jane@example.com, she handles invoices."}}}},
		NextState: &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "thanks, that's right"}}},
		Timings:   core.Timings{Start: t0},
		Source:    "gateway",
	}
}

// meshPair is a node and a trainer admitted to each other over loopback
// libp2p; the node serves its runner's plugin modules.
type meshPair struct {
	node, trainer *peer.Peer
	adminData     string
}

var loopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

func startPeer(t testing.TB, data string, bootstrap ...string) *peer.Peer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: data, Listen: loopback, Bootstrap: bootstrap, Stall: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
	return p
}

func newMeshPair(t testing.TB, src mesh.PluginSource) *meshPair {
	t.Helper()
	data := t.TempDir()
	key, id, err := peer.Identity(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(data, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	mp := &meshPair{adminData: data}
	mp.node = startPeer(t, data)
	mp.node.Mesh.ServePlugins(src)
	mp.trainer = mp.join(t, member.RoleTrainer)
	return mp
}

// join starts a new peer of the mesh with role and waits for the node and
// it to admit each other.
func (mp *meshPair) join(t testing.TB, role member.Role) *peer.Peer {
	t.Helper()
	key, _, _ := peer.Identity(mp.adminData)
	tok, err := mesh.Invite(mp.adminData, key, role, time.Hour, 1, mp.node.Host.Addrs(), time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	if _, err := peer.Join(context.Background(), data, tok.String(), loopback, nil); err != nil {
		t.Fatal(err)
	}
	p := startPeer(t, data, mp.node.Host.Addrs()...)
	for deadline := time.Now().Add(20 * time.Second); !p.Mesh.Admitted(mp.node.Mesh.ID()) || !mp.node.Mesh.Admitted(p.Mesh.ID()); {
		if time.Now().After(deadline) {
			t.Fatal("peers not admitted in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// runnerPlugins serves a reward runner's modules, as a node does.
type runnerPlugins struct{ r *reward.Runner }

func (s runnerPlugins) Plugin(ctx context.Context, hash string) ([]byte, error) {
	b, err := s.r.Module(hash)
	if errors.Is(err, reward.ErrUnknownPlugin) {
		return nil, fmt.Errorf("%w: %v", mesh.ErrNoPlugin, err)
	}
	return b, err
}

// countingFetch wraps a fetch and counts its calls.
type countingFetch struct {
	mu    sync.Mutex
	n     int
	fetch func(ctx context.Context, from mesh.PeerID, hash string, max int64) ([]byte, error)
}

func (f *countingFetch) Fetch(ctx context.Context, from mesh.PeerID, hash string, max int64) ([]byte, error) {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	return f.fetch(ctx, from, hash, max)
}

func (f *countingFetch) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// reencode encodes b's steps again after edit changed them: a batch as a
// device that forges it would make it.
func reencode(t testing.TB, b *batch.Batch, edit func(steps []*core.Step)) *batch.Batch {
	t.Helper()
	edit(b.Steps)
	payload, err := batch.Encode(batch.Meta{Created: b.Header.Created, Policy: b.Header.Policy}, b.Steps)
	if err != nil {
		t.Fatal(err)
	}
	out, err := batch.Decode(payload, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stepWith returns the step of b whose score of plugin name has the value
// want (nil: any).
func stepWith(b *batch.Batch, name string, want *float64) (*core.Step, int) {
	for _, s := range b.Steps {
		if s.Reward == nil {
			continue
		}
		for i, sc := range s.Reward.Scores {
			if sc.Plugin == name && sc.Value != nil && (want == nil || *sc.Value == *want) {
				return s, i
			}
		}
	}
	return nil, -1
}

func f64(v float64) *float64 { return &v }

// recombine sets a step's combined reward from its scores, as a device
// that forges a score consistently would.
func recombine(s *core.Step) {
	rw := reward.Combine(s.Reward.Scores, s.Reward.At)
	s.Reward.Value, s.Reward.Hint = rw.Value, rw.Hint
}
