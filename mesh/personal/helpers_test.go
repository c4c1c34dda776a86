package personal

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
)

var loopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// waitFor polls cond until it holds or 20 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// node is a running mesh peer and its data directory.
type node struct {
	*peer.Peer
	dir string
}

func (n node) id() mesh.PeerID { return n.Mesh.ID() }

func (n node) key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	k, _, err := peer.Identity(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// start runs the peer of dir until the test ends.
func start(t *testing.T, dir string, bootstrap ...string) node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: dir, Listen: loopback, Bootstrap: bootstrap, AdmitTimeout: 3 * time.Second, RefuseFor: time.Minute, Stall: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
	return node{Peer: p, dir: dir}
}

// world is a mesh of two member devices (a, the admin's, and b) and two
// trainers (tr, the one a's user trusts, and vol, a volunteer).
type world struct {
	a, b, tr, vol node
}

func newWorld(t *testing.T) *world {
	t.Helper()
	adminDir := t.TempDir()
	key, id, err := peer.Identity(adminDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(adminDir, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	w := &world{a: start(t, adminDir)}
	join := func(role member.Role) string {
		tok, err := mesh.Invite(adminDir, key, role, time.Hour, 1, w.a.Host.Addrs(), time.Now(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if _, err := peer.Join(context.Background(), dir, tok.String(), loopback, nil); err != nil {
			t.Fatalf("join: %v", err)
		}
		return dir
	}
	bDir, trDir, volDir := join(member.RoleMember), join(member.RoleTrainer), join(member.RoleTrainer)
	w.b = start(t, bDir, w.a.Host.Addrs()...)
	w.tr = start(t, trDir, w.a.Host.Addrs()...)
	w.vol = start(t, volDir, w.a.Host.Addrs()...)
	all := []node{w.a, w.b, w.tr, w.vol}
	waitFor(t, "every peer admitted by every other", func() bool {
		for _, x := range all {
			for _, y := range all {
				if x.id() != y.id() && !x.Mesh.Admitted(y.id()) {
					return false
				}
			}
		}
		return true
	})
	return w
}

// fake is a trainer's handler that records its jobs and writes an
// adapter that says what it was trained on.
type fake struct {
	mu    sync.Mutex
	calls []fakeCall
	// block, when set, is waited on (or the job's end) before training.
	block   chan struct{}
	entered chan struct{}
	// notReady is how many of the first jobs are answered ErrBusy, as a
	// trainer in no group yet answers.
	notReady int
}

type fakeCall struct {
	from     mesh.PeerID
	steps    []core.StepID
	heldBack int
	shared   string
	seed     uint64
	prev     string // the previous adapter's config, as sent
	ctxErr   error  // the job's context's error once training ended
}

func (f *fake) handle(ctx context.Context, from mesh.PeerID, j core.PersonalJob) (core.PersonalResult, error) {
	f.mu.Lock()
	if f.notReady > 0 {
		f.notReady--
		f.mu.Unlock()
		return core.PersonalResult{}, fmt.Errorf("%w: not ready", ErrBusy)
	}
	f.mu.Unlock()
	c := fakeCall{from: from, heldBack: len(j.HeldBack), shared: j.SharedVersion, seed: j.Seed}
	for _, s := range j.Steps {
		c.steps = append(c.steps, s.ID)
	}
	if j.Prev != "" {
		b, err := os.ReadFile(filepath.Join(j.Prev, ConfigFile))
		if err != nil {
			return core.PersonalResult{}, err
		}
		c.prev = string(b)
	}
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
		}
	}
	c.ctxErr = ctx.Err()
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	if c.ctxErr != nil {
		return core.PersonalResult{}, c.ctxErr
	}
	if strings.HasPrefix(j.SharedVersion, "unknown") {
		return core.PersonalResult{}, fmt.Errorf("%w: %s", ErrUnknownVersion, j.SharedVersion)
	}
	if err := writeAdapter(j.Out, adapterTag(from, c.steps)); err != nil {
		return core.PersonalResult{}, err
	}
	return core.PersonalResult{Trained: len(j.Steps), HeldBack: len(j.HeldBack), ScoreBefore: 0.25, ScoreAfter: 0.75, Seconds: 0.5}, nil
}

func (f *fake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fake) last() fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

// adapterTag is what the fake writes in an adapter it trains.
func adapterTag(from mesh.PeerID, steps []core.StepID) string {
	ids := make([]string, len(steps))
	for i, s := range steps {
		ids[i] = string(s)
	}
	return string(from) + ":" + strings.Join(ids, ",")
}

// writeAdapter writes a PEFT directory whose config and safetensors
// header carry tag.
func writeAdapter(dir, tag string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cfg, _ := json.Marshal(map[string]any{"r": 4, "lora_alpha": 8, "tag": tag})
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), cfg, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, WeightsFile), safetensors(tag, 64), 0o600)
}

// safetensors is a safetensors file of one tensor of n bytes, its
// metadata carrying tag.
func safetensors(tag string, n int) []byte {
	h, _ := json.Marshal(map[string]any{
		"__metadata__": map[string]string{"tag": tag},
		"t":            map[string]any{"dtype": "U8", "shape": []int{n}, "data_offsets": []int{0, n}},
	})
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	for i := range n {
		b = append(b, byte(i))
	}
	return b
}

// adapterTagIn reads the tag of the adapter in dir, checking both files.
func adapterTagIn(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct{ Tag string }
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(dir, WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w, safetensors(cfg.Tag, 64)) {
		t.Errorf("the adapter's weights in %s are not what the trainer wrote", dir)
	}
	return cfg.Tag
}

// steps makes n valid scored steps whose ids start with tag.
func steps(n int, tag string) []*core.Step {
	var out []*core.Step
	for i := range n {
		v := 1.0
		if i%2 == 1 {
			v = -1
		}
		out = append(out, &core.Step{
			ID: core.StepID(fmt.Sprintf("%s-%d", tag, i)), SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprintf("%s %d", tag, i)}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
			Reward:   &core.Reward{Value: &v, Scores: []core.Score{}},
		})
	}
	return out
}

func stepIDs(s []*core.Step) []core.StepID {
	var out []core.StepID
	for _, x := range s {
		out = append(out, x.ID)
	}
	return out
}

// serve serves the protocol on n with handler f until the test ends.
func serve(t *testing.T, n node, f *fake, cfg ServerConfig) *Server {
	t.Helper()
	cfg.Host, cfg.Mesh, cfg.Handler = n.Host, n.Mesh, f.handle
	if cfg.TempDir == "" {
		cfg.TempDir = filepath.Join(t.TempDir(), "personal")
	}
	s, err := Serve(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// emptyDir reports whether dir holds nothing.
func emptyDir(t *testing.T, dir string) bool {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(es) == 0
}
