package personal

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/peer"
)

// TestDeviceGetsItsAdapter: a device has its adapter trained by the
// trainer it trusts, on its own steps, and then trained further from the
// one it got; the trainer keeps nothing.
func TestDeviceGetsItsAdapter(t *testing.T) {
	w := newWorld(t)
	f := &fake{}
	srv := serve(t, w.tr, f, ServerConfig{})
	c := Client{Host: w.a.Host, Mesh: w.a.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	ctx := context.Background()
	outs := t.TempDir()

	first := filepath.Join(outs, "p1")
	st, held := steps(5, "a"), steps(2, "held")
	res, err := c.Train(ctx, core.PersonalJob{Shared: "/on/the/device/v3", SharedVersion: "v3", Steps: st, HeldBack: held, Out: first, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if want := (core.PersonalResult{Trained: 5, HeldBack: 2, ScoreBefore: 0.25, ScoreAfter: 0.75, Seconds: 0.5}); res != want {
		t.Errorf("result %+v, want %+v", res, want)
	}
	if got, want := adapterTagIn(t, first), adapterTag(w.a.id(), stepIDs(st)); got != want {
		t.Errorf("the adapter was trained on %q, want %q", got, want)
	}
	call := f.last()
	if call.from != w.a.id() || !slices.Equal(call.steps, stepIDs(st)) || call.heldBack != 2 || call.shared != "v3" || call.seed != 9 || call.prev != "" {
		t.Errorf("the trainer's job: %+v", call)
	}
	if !emptyDir(t, srv.cfg.TempDir) {
		t.Error("the trainer kept something of the job")
	}

	// Trained further from the adapter it got.
	second := filepath.Join(outs, "p2")
	if _, err := c.Train(ctx, core.PersonalJob{Prev: first, Steps: steps(3, "b"), Out: second}); err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(filepath.Join(first, ConfigFile))
	if call := f.last(); call.prev != string(cfg) || call.shared != "" {
		t.Errorf("the trainer got previous adapter %q, shared version %q; want %q and none", call.prev, call.shared, cfg)
	}
	if es, _ := os.ReadDir(outs); len(es) != 2 {
		t.Errorf("the jobs left %d entries beside their adapters", len(es)-2)
	}

	// A version the trainer does not hold; an Out that exists.
	third := filepath.Join(outs, "p3")
	if _, err := c.Train(ctx, core.PersonalJob{SharedVersion: "unknown-v9", Steps: steps(1, "c"), Out: third}); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("an unknown shared version: %v", err)
	}
	if _, err := os.Stat(third); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed job left its Out")
	}
	if _, err := c.Train(ctx, core.PersonalJob{SharedVersion: "unknown-v10", Steps: steps(1, "c"), Out: third}); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("an unknown shared version again, at once: %v", err)
	}
	n := f.count()
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(1, "d"), Out: first}); err == nil || f.count() != n {
		t.Errorf("a job whose Out exists: %v, %d jobs sent", err, f.count()-n)
	}
	if !emptyDir(t, srv.cfg.TempDir) {
		t.Error("the trainer kept something of the jobs")
	}
}

// liar is a device's membership that says it is another device.
type liar struct {
	Mesh
	as mesh.PeerID
}

func (l liar) ID() mesh.PeerID { return l.as }

// TestNoOtherDevicesAdapter: another member device cannot have a job run
// for the victim: a request naming the victim, or the victim's request
// replayed whole, is refused before any training; what it sends as itself
// is trained for itself only.
func TestNoOtherDevicesAdapter(t *testing.T) {
	w := newWorld(t)
	f := &fake{}
	srv := serve(t, w.tr, f, ServerConfig{})
	ctx := context.Background()

	// B's client says it is A.
	c := Client{Host: w.b.Host, Mesh: liar{w.b.Mesh, w.a.id()}, Trainers: []mesh.PeerID{w.tr.id()}}
	out := filepath.Join(t.TempDir(), "p")
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(2, "victim"), Out: out}); !errors.Is(err, ErrRefused) {
		t.Errorf("a device asking as another: %v, want ErrRefused", err)
	}

	// The victim's request, as its client writes it, sent whole by B.
	job, err := Client{}.prepare(core.PersonalJob{Steps: steps(2, "victim"), Out: out}, Limits{}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	head, _ := encodeMsg(request{Device: string(w.a.id()), Nonce: strings.Repeat("ab", nonceSize), Steps: int64(len(job.steps))})
	st, err := w.b.Host.NewStream(ctx, w.tr.id(), Protocol)
	if err != nil {
		t.Fatal(err)
	}
	st.SetDeadline(time.Now().Add(10 * time.Second))
	st.Write(append(head, job.steps...))
	var rep reply
	br := bufio.NewReader(st)
	if _, err := readMsg(br, &rep); err != nil || rep.Status != statusRefused {
		t.Errorf("the victim's request replayed: %+v, %v", rep, err)
	}
	io.Copy(io.Discard, br)
	st.Close()
	if f.count() != 0 {
		t.Fatalf("the trainer trained %d jobs for a device asking as another", f.count())
	}

	// What B sends as itself is trained for B, never as A.
	honest := Client{Host: w.b.Host, Mesh: w.b.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	if _, err := honest.Train(ctx, core.PersonalJob{Steps: steps(2, "victim"), Out: out}); err != nil {
		t.Fatal(err)
	}
	if call := f.last(); call.from != w.b.id() {
		t.Errorf("B's job ran for %s", call.from)
	}
	if !emptyDir(t, srv.cfg.TempDir) {
		t.Error("the trainer kept something of the job")
	}
}

// TestStepsOnlyToTrustedTrainers: a device sends its steps only to a
// trainer its user trusts, and only if the mesh admitted it as a trainer:
// a volunteer trainer that serves the protocol, a member device that
// does, a trusted trainer that is not there, never receive anything.
func TestStepsOnlyToTrustedTrainers(t *testing.T) {
	w := newWorld(t)
	trusted, volunteer, device := &fake{}, &fake{}, &fake{}
	serve(t, w.tr, trusted, ServerConfig{})
	serve(t, w.vol, volunteer, ServerConfig{})
	serve(t, w.b, device, ServerConfig{})
	ctx := context.Background()
	_, away, err := peer.Identity(t.TempDir()) // a trainer the user trusts, not in the mesh now
	if err != nil {
		t.Fatal(err)
	}

	c := Client{Host: w.a.Host, Mesh: w.a.Mesh, Trainers: []mesh.PeerID{away, w.b.id(), w.tr.id()}}
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(3, "a"), Out: filepath.Join(t.TempDir(), "p")}); err != nil {
		t.Fatal(err)
	}
	if trusted.count() != 1 || volunteer.count() != 0 || device.count() != 0 {
		t.Errorf("jobs: %d on the trusted trainer, %d on the volunteer, %d on a member device", trusted.count(), volunteer.count(), device.count())
	}

	// The trusted trainer away: no one else gets the steps.
	c.Trainers = []mesh.PeerID{away, w.b.id()}
	_, err = c.Train(ctx, core.PersonalJob{Steps: steps(3, "a"), Out: filepath.Join(t.TempDir(), "p")})
	if !errors.Is(err, ErrNoTrainer) || !strings.Contains(err.Error(), "not a trainer") || !strings.Contains(err.Error(), "not admitted") {
		t.Errorf("no trusted trainer reachable: %v", err)
	}
	c.Trainers = nil
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(3, "a"), Out: filepath.Join(t.TempDir(), "p")}); !errors.Is(err, ErrNoTrainer) {
		t.Errorf("no trainer trusted: %v", err)
	}
	if trusted.count() != 1 || volunteer.count() != 0 || device.count() != 0 {
		t.Errorf("jobs: %d on the trusted trainer, %d on the volunteer, %d on a member device", trusted.count(), volunteer.count(), device.count())
	}
}

// openGate admits everyone: the gate of a host outside any mesh.
type openGate struct{}

func (openGate) Blocked(mesh.PeerID) bool  { return false }
func (openGate) Admitted(mesh.PeerID) bool { return true }

// TestOnlyMemberDevices: a trainer, admitted but not a device, is refused;
// a host outside the mesh is cut before the server sees its stream.
func TestOnlyMemberDevices(t *testing.T) {
	w := newWorld(t)
	f := &fake{}
	serve(t, w.tr, f, ServerConfig{})
	ctx := context.Background()

	c := Client{Host: w.vol.Host, Mesh: w.vol.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(1, "v"), Out: filepath.Join(t.TempDir(), "p")}); !errors.Is(err, ErrRefused) {
		t.Errorf("a trainer asking: %v, want ErrRefused", err)
	}

	y, err := p2p.New(ctx, p2p.Options{DataDir: t.TempDir(), Listen: loopback, Gate: openGate{}, Open: mesh.OpenProtocols})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	if _, err := y.Connect(ctx, w.tr.Host.Addrs()); err != nil {
		t.Fatal(err)
	}
	job, err := Client{}.prepare(core.PersonalJob{Steps: steps(1, "y"), Out: "x"}, Limits{}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	head, _ := encodeMsg(request{Device: string(y.ID()), Nonce: strings.Repeat("cd", nonceSize), Steps: int64(len(job.steps))})
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if st, err := y.NewStream(sctx, w.tr.id(), Protocol); err == nil {
		st.Write(append(head, job.steps...))
		st.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := st.Read(make([]byte, 1)); err == nil || n > 0 {
			t.Error("a host outside the mesh got an answer")
		}
		st.Close()
	}
	if f.count() != 0 {
		t.Errorf("the trainer trained %d jobs for peers that are not member devices", f.count())
	}
}

// TestOversizeRefused: a request whose header declares parts over the
// trainer's limits is refused before any of them is read, as is a header
// longer than its bound; a device refuses an adapter over its own limits.
func TestOversizeRefused(t *testing.T) {
	w := newWorld(t)
	f := &fake{}
	srv := serve(t, w.tr, f, ServerConfig{Limits: Limits{MaxStepBytes: 4 << 10}})
	ctx := context.Background()

	ask := func(frame []byte) reply {
		t.Helper()
		st, err := w.a.Host.NewStream(ctx, w.tr.id(), Protocol)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		st.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := st.Write(frame); err != nil {
			t.Fatal(err)
		}
		var rep reply
		br := bufio.NewReader(st)
		if _, err := readMsg(br, &rep); err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the answer: %v", err)
		}
		return rep
	}
	nonce := strings.Repeat("ef", nonceSize)
	for name, req := range map[string]request{
		"weights":  {Steps: 100, Config: 10, Weights: 1 << 40},
		"config":   {Steps: 100, Config: 1 << 30, Weights: 10},
		"steps":    {Steps: 5 << 10},
		"held":     {Steps: 100, HeldBack: 1 << 40},
		"negative": {Steps: 100, HeldBack: -1},
	} {
		req.Device, req.Nonce = string(w.a.id()), nonce
		head, _ := encodeMsg(req)
		// Only the header is sent: the answer comes without the parts.
		rep := ask(head)
		want := statusTooLarge
		if name == "negative" {
			want = statusBad
		}
		if rep.Status != want {
			t.Errorf("%s: %+v, want %s", name, rep, want)
		}
	}
	// A header that says it is a megabyte long.
	if rep := ask(binary.AppendUvarint(nil, 1<<20)); rep.Status != statusTooLarge {
		t.Errorf("a long header: %+v", rep)
	}

	// Steps over the trainer's limit, from a client with the default ones.
	big := steps(2, "big")
	big[0].Request.Messages[0].Content = randomText()
	c := Client{Host: w.a.Host, Mesh: w.a.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	if _, err := c.Train(ctx, core.PersonalJob{Steps: big, Out: filepath.Join(t.TempDir(), "p")}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("steps over the trainer's limit: %v", err)
	}
	if f.count() != 0 {
		t.Errorf("the trainer trained %d oversize jobs", f.count())
	}

	// An adapter over the device's limit.
	c.Limits = Limits{MaxWeights: 64}
	out := filepath.Join(t.TempDir(), "p")
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(1, "s"), Out: out}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("an adapter over the device's limit: %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Error("an adapter over the limit was written")
	}
	// The device hung up on the reply: the trainer finds out as it sends.
	waitFor(t, "the trainer to clear the job away", func() bool { return emptyDir(t, srv.cfg.TempDir) })
}

// randomText is 16 KiB of hex that does not compress below 8 KiB.
func randomText() string {
	var out []byte
	sum := sha256.Sum256([]byte("seed"))
	for range 256 {
		out = append(out, sum[:]...)
		sum = sha256.Sum256(sum[:])
	}
	return hex.EncodeToString(out)
}

// forgery is what a rogue trainer changes in what it signs and sends.
type forgery struct {
	device mesh.PeerID
	nonce  string
	req    [sha256.Size]byte
	key    ed25519.PrivateKey
	// tamper changes the adapter after it was signed; replay sends, in
	// place of the reply, one sent before.
	tamper bool
	replay []byte
}

// rogue is a trainer's stream handler that answers a job with a reply
// forged by forge (nil: an honest one), signed by key unless forge
// changes it; sent gets each reply's bytes.
func rogue(trainer mesh.PeerID, key ed25519.PrivateKey, forge func(*forgery), sent func([]byte)) mesh.StreamHandler {
	return func(st mesh.Stream) {
		defer st.Close()
		st.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(st)
		var req request
		frame, err := readMsg(br, &req)
		if err != nil {
			st.Reset()
			return
		}
		ok, _ := encodeMsg(reply{Status: statusAccepted})
		st.Write(ok)
		dir, err := os.MkdirTemp("", "rogue-")
		if err != nil {
			st.Reset()
			return
		}
		defer os.RemoveAll(dir)
		d := sha256.New()
		d.Write(frame)
		j, err := readJob(io.TeeReader(br, d), &req, Limits{}, dir)
		if err != nil || writeAdapter(j.Out, "rogue") != nil {
			st.Reset()
			return
		}
		cfg, _ := os.ReadFile(filepath.Join(j.Out, ConfigFile))
		weights, _ := os.ReadFile(filepath.Join(j.Out, WeightsFile))
		fg := forgery{device: st.RemotePeer(), nonce: req.Nonce, req: sumOf(d), key: key}
		if forge != nil {
			forge(&fg)
		}
		res := core.PersonalResult{Trained: len(j.Steps), HeldBack: len(j.HeldBack), ScoreBefore: -1, ScoreAfter: -1}
		sig := ed25519.Sign(fg.key, signedReply(trainer, fg.device, fg.nonce, fg.req, sha256.Sum256(cfg), sha256.Sum256(weights), res))
		if fg.tamper {
			weights[len(weights)-1] ^= 1
		}
		head, _ := encodeMsg(reply{Status: statusOK, Result: &res, Config: int64(len(cfg)), Weights: int64(len(weights)), Sig: hexSig(sig)})
		out := append(append(head, cfg...), weights...)
		if fg.replay != nil {
			out = fg.replay
		}
		if sent != nil {
			sent(out)
		}
		st.Write(out)
		st.CloseWrite()
	}
}

// TestReplyBoundToJob: a device takes an adapter only with the trusted
// trainer's signature over this device, this job's nonce, the request
// it sent and the adapter it received.
func TestReplyBoundToJob(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	key, volKey := w.tr.key(t), w.vol.key(t)
	c := Client{Host: w.a.Host, Mesh: w.a.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}

	var mu sync.Mutex
	var honest []byte
	w.tr.Host.Handle(Protocol, rogue(w.tr.id(), key, nil, func(b []byte) { mu.Lock(); honest = b; mu.Unlock() }))
	outs := t.TempDir()
	if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(2, "a"), Out: filepath.Join(outs, "honest")}); err != nil {
		t.Fatalf("an honest reply: %v", err)
	}
	mu.Lock()
	old := honest
	mu.Unlock()

	for _, tc := range []struct {
		name  string
		forge func(*forgery)
	}{
		{"for another device", func(f *forgery) { f.device = w.b.id() }},
		{"for another nonce", func(f *forgery) { f.nonce = strings.Repeat("00", nonceSize) }},
		{"for another request", func(f *forgery) { f.req[0] ^= 1 }},
		{"by another trainer's key", func(f *forgery) { f.key = volKey }},
		{"over another adapter", func(f *forgery) { f.tamper = true }},
		{"replayed from an earlier job", func(f *forgery) { f.replay = old }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.tr.Host.Handle(Protocol, rogue(w.tr.id(), key, tc.forge, nil))
			out := filepath.Join(outs, "p")
			if _, err := c.Train(ctx, core.PersonalJob{Steps: steps(2, "a"), Out: out}); !errors.Is(err, ErrSignature) {
				t.Errorf("%v, want ErrSignature", err)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Error("the adapter was written")
			}
			if es, _ := os.ReadDir(outs); len(es) != 1 {
				t.Errorf("%d entries left beside the adapters", len(es)-1)
			}
		})
	}
}

// clock is a settable time.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestBoundsOnJobs: a device runs one job at a time, the trainer MaxJobs
// in all and a device PerHour an hour; a device that gives up cancels its
// job on the trainer.
func TestBoundsOnJobs(t *testing.T) {
	w := newWorld(t)
	f := &fake{block: make(chan struct{}), entered: make(chan struct{}, 8)}
	clk := &clock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	srv := serve(t, w.tr, f, ServerConfig{MaxJobs: 1, PerHour: 3, Now: clk.Now})
	ctx := context.Background()
	a := Client{Host: w.a.Host, Mesh: w.a.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	b := Client{Host: w.b.Host, Mesh: w.b.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	job := func() core.PersonalJob {
		return core.PersonalJob{Steps: steps(1, "s"), Out: filepath.Join(t.TempDir(), "p")}
	}

	jctx, giveUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := a.Train(jctx, job()); done <- err }()
	<-f.entered
	if _, err := a.Train(ctx, job()); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "has a job here already") {
		t.Errorf("a second job of the same device: %v, want ErrBusy", err)
	}
	if _, err := b.Train(ctx, job()); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "1 jobs running") {
		t.Errorf("another device's job over MaxJobs: %v, want ErrBusy", err)
	}
	giveUp()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("a job given up: %v", err)
	}
	waitFor(t, "the job given up cancelled on the trainer", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return f.count() == 1 && len(srv.active) == 0
	})
	if err := f.last().ctxErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the trainer's job went on: %v", err)
	}

	close(f.block)
	for i := range 2 {
		if _, err := a.Train(ctx, job()); err != nil {
			t.Fatalf("job %d: %v", i+2, err)
		}
		<-f.entered
	}
	if _, err := a.Train(ctx, job()); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "last hour") {
		t.Errorf("a fourth job in an hour: %v", err)
	}
	if _, err := b.Train(ctx, job()); err != nil {
		t.Errorf("another device's job: %v", err)
	}
	<-f.entered
	clk.add(time.Hour)
	if _, err := a.Train(ctx, job()); err != nil {
		t.Errorf("a job an hour later: %v", err)
	}
}

// TestNotReadyNotCounted: the jobs a trainer could not take (not ready
// yet) do not count against the device's hour, and the refusal says why
// once.
func TestNotReadyNotCounted(t *testing.T) {
	w := newWorld(t)
	f := &fake{notReady: 5}
	serve(t, w.tr, f, ServerConfig{PerHour: 2})
	a := Client{Host: w.a.Host, Mesh: w.a.Mesh, Trainers: []mesh.PeerID{w.tr.id()}}
	ctx := context.Background()
	for i := range 5 {
		_, err := a.Train(ctx, core.PersonalJob{Steps: steps(1, "s"), Out: filepath.Join(t.TempDir(), "p")})
		if !errors.Is(err, ErrBusy) || strings.Count(err.Error(), ErrBusy.Error()) != 1 {
			t.Fatalf("job %d on a trainer not ready: %v", i+1, err)
		}
	}
	for i := range 2 {
		if _, err := a.Train(ctx, core.PersonalJob{Steps: steps(1, "s"), Out: filepath.Join(t.TempDir(), "p")}); err != nil {
			t.Fatalf("job %d once ready: %v", i+1, err)
		}
	}
}

// handleOnly is a host that only registers handlers.
type handleOnly struct{ mesh.Host }

func (handleOnly) Handle(string, mesh.StreamHandler) {}

// signing is a membership that signs.
type signing struct{ fixedMesh }

func (signing) Sign([]byte) []byte { return nil }

// TestServeClearsCrashedJobs: the steps of a job a crash interrupted do
// not outlive the trainer's restart; nothing else in the directory goes.
func TestServeClearsCrashedJobs(t *testing.T) {
	dir := t.TempDir()
	job := filepath.Join(dir, jobPrefix+"123", "prev")
	if err := os.MkdirAll(job, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(job, ConfigFile), []byte("{}"), 0o600)
	os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600)
	s, err := Serve(ServerConfig{Host: handleOnly{}, Mesh: signing{"p"}, Handler: (&fake{}).handle, TempDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es, _ := os.ReadDir(dir)
	if len(es) != 1 || es[0].Name() != "other" {
		t.Errorf("after Serve, %s holds %v", dir, es)
	}
}
