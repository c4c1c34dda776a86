// Package trainer is a trainer peer: a volunteer's machine in the mesh that
// trains the mesh's adapter from the devices' scrubbed batches. It joins the
// mesh with its trainer certificate, pulls every batch announced on it
// from the device that signed the announcement (within the bounds of
// mesh.Collect and Config.PullBudget), verifies it, keeps it in its batch
// store (trainer/store) credited to that device and acknowledges it, which
// lets the device that made it mark it shipped. Another trainer's streams
// of Protocol are served 4 at a time, their payloads read as they arrive.
//
// Trainers form a raft group (hashicorp/raft over the mesh's streams,
// mesh/raftnet; its log on Pebble, trainer/raftstore) whose replicated state
// is trainer/group's: the recipe and base model, the adapter lineage, the
// batch ledger and the trainer registry. The first trusted trainer
// bootstraps the group, later ones join through its leader (the trainers
// the mesh's admin trusts as voters, up to Timing.MaxVoters, then
// non-voters, promoted when a voter leaves or stops answering; the others,
// volunteers, always non-voters). The
// leader runs rounds (rounds.go): it adds the stored batches to the ledger
// (a follower offers it those it stored that the ledger lacks, which the
// leader then pulls: it may have missed their announcement), refuses the
// stale, shares the pending among the live trainers by speed; each trainer
// trains K steps from the current version on its share and hands its delta
// to the leader (again to a new leader after a failover), which aggregates
// the deltas (trainer/adapter) into the next version, writes it as a PEFT
// bundle under DATA/adapters/vN and commits it with the raft term and index
// that fence it. Trainers fetch versions from each other over Protocol and
// check them against the lineage (versions.go). A task set (`clawmesh tasks
// add`, tasksets.go; its format is trainer/tasks') adds its prompts to the
// ledger: a trainer whose share holds some samples G rollouts of each from
// the round's version, scores them with the set's verifier plugin and
// trains them with its batches (rollouts.go); the leader scores every
// version on the set's held-out split and records it in the lineage.
//
// The trainers the mesh's admin trusts are voters: they certify versions
// (certify.go). Every trainer signs the delta it hands in; before a
// version reaches a device, each voter fetches the round's signed deltas
// from its publisher (kept under DATA/deltas, so a restart keeps them),
// recomputes the version and, if it is the same, votes for it; the leader
// records a quorum of votes in the log (group.Certify), and only then is
// the version shared with the devices or trained from. One no quorum
// certifies within Timing.CertifyWait (sooner once its publisher is gone)
// is retracted (group.Retract), its batches trained again. The others are
// volunteers, kept honest by spot
// re-execution (spot.go): before it publishes a round, the leader
// retrains a sample of the volunteers' deltas (Config.SpotCheck, 0.1 by
// default, at least one a round) from the same share, base and seed, and
// compares (the native engine exactly, the torch engine within a
// tolerance). A delta that is not what its share makes is left out, its
// batches go back to pending, and its trainer is benched in the ledger
// with the evidence, with no share until the admin clears it. A check
// costs the leader the training time of the share it retrains
// (docs/benchmarks.md). Norm clipping and the robust aggregation stay as a
// second wall.
//
// With Config.Personal on (`clawmesh trainer --personal`), it also trains
// the personal adapters of the member devices that trust it
// (personal_serve.go, over mesh/personal): each device's own steps, on
// the trainer's copy of the certified version the device serves, the
// adapter sent back to that device alone and kept nowhere, in no round,
// aggregate, store or weights service.
//
// It serves the `clawmesh mesh ...` admin API as a node does, and
// `clawmesh trainer status|leave|config|clear` and `clawmesh tasks ...`,
// on a loopback listener of its own.
//
// trainer/harness runs clusters of trainers, on loopback or in memory, for
// tests and `clawmesh bench`.
package trainer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/private"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	meshpersonal "github.com/clawmesh/clawmesh/mesh/personal"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/store"
	"github.com/clawmesh/clawmesh/trainer/verify"
)

// Files in a trainer's data directory, beside the mesh peer's.
const (
	// StoreDir holds the batch store; it marks a trainer's data directory.
	StoreDir = datadir.TrainerMark
	// WeightsDir holds the packed versions served to the mesh, with
	// their signed manifests.
	WeightsDir = "weights"
	// AddrFile holds the running trainer's admin address.
	AddrFile = "trainer.addr"
	// PluginsDir caches the reward plugin modules verification runs.
	PluginsDir = "plugins"
	// DeltasDir keeps the signed deltas of the newest versions this
	// trainer published, which the voters check them against: they
	// outlive a restart.
	DeltasDir = "deltas"
)

// ErrNotTrainer reports a data directory whose certificate is not a
// trainer's.
var ErrNotTrainer = errors.New("trainer: this peer's certificate is not a trainer's (join with a token made by `clawmesh invite --role trainer`)")

// Config configures a Trainer. The zero value of each field but DataDir
// means its default.
type Config struct {
	// DataDir holds the peer (identity, membership) and the batch store.
	// It must be in a mesh with a trainer certificate.
	DataDir string
	// Listen, Bootstrap, MDNS and NAT: see peer.Options.
	Listen, Bootstrap []string
	MDNS, NAT         bool
	// Admin is the admin API's address; default 127.0.0.1:0 (a free
	// port), written to DataDir/trainer.addr while the trainer runs.
	// "off" serves no admin API, neither over TCP nor on the admin socket
	// (a trainer on a simulated network that must open no real socket).
	Admin string
	// Limits bound the batches accepted (mesh/batch defaults).
	Limits batch.Limits
	// Stall is how long a pull may make no progress (mesh default).
	Stall time.Duration
	// PullBudget bounds the bytes of the batches being pulled at once,
	// from every device together (mesh.PullOptions.Budget; default
	// mesh.DefaultPullBudget).
	PullBudget int64
	// Engine is the training engine (native, or torch: the PyTorch worker
	// of model/engine/torch), Device its device (cpu, or cuda with the
	// torch engine), Base the base model: "tiny" (or "") for the tiny
	// model, or a Hugging Face model directory.
	Engine, Device, Base string
	// GPUs is how many GPUs the torch engine trains on (default 1; more
	// launches its worker with torchrun, data-parallel).
	GPUs int
	// GradCheckpoint has the torch engine recompute each layer's
	// activations in backward: less GPU memory, more compute.
	GradCheckpoint bool
	// Group is the configuration this trainer proposes if it bootstraps
	// the group (the group keeps its own afterwards).
	Group group.Config
	// Timing tunes raft and the rounds.
	Timing Timing
	// Verify, when set, checks a batch before the leader adds it to the
	// ledger: a non-empty reason refuses it, an error leaves it for later.
	// nil means the default: the batch's reward scores replayed on a
	// sample of its steps (trainer/verify), the plugin modules kept in
	// DATA/plugins and fetched from the mesh; NoVerify turns checking off
	// (batches made up for benchmarks carry no real plugin).
	Verify   func(ctx context.Context, id core.BatchID, from mesh.PeerID) (reason string, err error)
	NoVerify bool
	// Weights is the UDP address of the QUIC service that serves the
	// committed adapter versions to the mesh (default ":0": any port on
	// every interface); "off" runs none.
	Weights string
	// WeightsAnnounce is how often the newest version held is offered
	// again on gossip (mesh/weights default).
	WeightsAnnounce time.Duration
	// SpotCheck is the share of the volunteers' deltas this trainer,
	// leading, retrains to check them (from 0 to 1; default
	// DefaultSpotCheck); a round with any volunteer's delta has one
	// checked. NoSpotCheck turns checking off (spot.go).
	SpotCheck   float64
	NoSpotCheck bool
	// Personal trains the personal adapters of the devices that trust
	// this trainer (personal_serve.go); off by default.
	Personal PersonalConfig
	Logger   *slog.Logger
}

// Trainer is a running trainer peer.
type Trainer struct {
	cfg     Config
	log     *slog.Logger
	peer    *peer.Peer // nil when the host was given (NewOn)
	host    mesh.Host
	mesh    *mesh.Mesh
	self    mesh.PeerID
	store   *store.Store
	group   *raftMember
	work    *workLoop
	timing  Timing
	verify  func(ctx context.Context, id core.BatchID, from mesh.PeerID) (string, error)
	checker *verify.Checker
	// verifyLater: batches whose verification failed to run, and when to
	// try again (the leader's loop only).
	verifyLater map[core.BatchID]time.Time
	// ingested is the store's Puts when the leader last looked at every
	// stored batch (the leader's loop only).
	ingested uint64
	// stopped is closed, by cancel, when the trainer stops (Close, a
	// crash, or Run's ctx done): the work it does outside Run's calls
	// (stream handlers, redials) ends then.
	stopped <-chan struct{}
	cancel  context.CancelFunc

	// beforePublish, in tests, runs before the leader proposes a version;
	// isolated cuts the trainer off the group (tests of partitions).
	beforePublish func(ctx context.Context, round uint64)
	// tamper, in tests, changes a version's bundle (in dir) after the
	// leader aggregated it: a rogue leader. forgeDelta, in tests, changes
	// this trainer's delta before it signs it: a dishonest volunteer.
	tamper     func(dir string)
	forgeDelta atomic.Pointer[func([]byte) []byte]
	// declared, in tests, is the engine and device the trainer says it
	// trains with instead of its own: a lying registration.
	declared atomic.Pointer[[2]string]
	// noRetract, in tests, keeps the trainer from retracting a version
	// when it leads: a rogue leader.
	noRetract atomic.Bool
	isolated  atomic.Bool
	// cutOff holds the trainers this voter stopped answering, and until
	// when (mesh.PeerID → time.Time): a leader that published a version
	// its round's deltas do not make.
	cutOff sync.Map
	fenced atomic.Int64 // publications the group refused
	known  sync.Map     // mesh.PeerID → true: trainers admitted once

	// weights serves committed versions to the devices (nil on a
	// simulated network, or when Config.Weights is "off"); key signs
	// their manifests.
	weights *weights.Service
	key     ed25519.PrivateKey
	// personal serves the devices' personal jobs (nil unless
	// Config.Personal.On).
	personal *meshpersonal.Server
	// tinyMu guards the writing of the tiny base personal jobs open.
	tinyMu sync.Mutex
	// sharedVersion is the newest version in the weights service, so that
	// the work loop reads its directory only when a newer one commits.
	sharedVersion atomic.Uint64
	// sharedKey names the version and voter set last shared (voteKey).
	sharedKey atomicString
	// left is set once Leave has asked the leader to remove this trainer:
	// it no longer registers itself (its work loop would otherwise find
	// itself unregistered and register again).
	left atomic.Bool

	mu   sync.Mutex
	addr net.Addr

	// runtimes holds the task sets' runtimes (their verifiers);
	// evalLater the evaluations that failed and when to try them again
	// (the leader's loop only).
	runtimes  rolloutRuntimes
	evalLater map[string]time.Time

	// cert is this trainer's part in certifying versions.
	cert certState
	// pulls counts the batch pulls and what they hold; rpc bounds each
	// trainer's streams of Protocol.
	pulls mesh.PullStats
	rpc   rpcBounds
	// spotBits holds the spot check rate (math.Float64bits); spot what
	// the open round's checks found (the leader's loop only); spotRuns
	// counts the deltas retrained and compared.
	spotBits atomic.Uint64
	spot     spotMemo
	spotRuns atomic.Int64

	// metrics are made on first use (metricsOf).
	metricsOnce sync.Once
	metrics     *metrics
}

// New opens the batch store and starts the trainer's mesh peer.
func New(ctx context.Context, cfg Config) (*Trainer, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("trainer: no data directory")
	}
	if cfg.Admin == "" {
		cfg.Admin = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := mesh.CheckBudget(cfg.PullBudget, cfg.Limits); err != nil {
		return nil, err
	}
	// A node's directory is not a trainer's, whatever its certificate: a
	// trainer there would take the node's identity beside its pool.
	if datadir.Is(cfg.DataDir, datadir.NodeMark) {
		return nil, fmt.Errorf("trainer: %w", &datadir.KindError{Dir: cfg.DataDir, Want: "trainer", Is: "node", Why: "it holds a device's DataPool, " + datadir.NodeMark + "/"})
	}
	st, err := mesh.LoadState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if c, _ := st.Certificate(); c.Role() != member.RoleTrainer {
		return nil, ErrNotTrainer
	}
	python, err := checkEngine(ctx, cfg.Engine, cfg.Device, cfg.GPUs)
	if err != nil {
		return nil, err
	}
	if err := cfg.Group.Validate(); err != nil {
		return nil, err
	}
	if _, _, err := BaseID(cfg.Base); err != nil {
		return nil, err
	}
	p, err := peer.Start(ctx, peer.Options{DataDir: cfg.DataDir, Listen: cfg.Listen, Bootstrap: cfg.Bootstrap, MDNS: cfg.MDNS, NAT: cfg.NAT, Stall: cfg.Stall, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	t, err := newTrainer(cfg, p.Host, p.Mesh, python)
	if err != nil {
		p.Close()
		return nil, err
	}
	t.peer = p
	if cfg.Weights != "off" {
		if err := t.startWeights(); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// startWeights starts the QUIC service that serves committed versions.
func (t *Trainer) startWeights() error {
	key, _, err := peer.Identity(t.cfg.DataDir)
	if err != nil {
		return err
	}
	listen := t.cfg.Weights
	if listen == "" {
		listen = ":0"
	}
	t.key = key
	t.weights, err = weights.New(weights.Config{Dir: filepath.Join(t.cfg.DataDir, WeightsDir), Key: key, Mesh: t.mesh, Host: t.host,
		Listen: listen, AnnounceEvery: t.cfg.WeightsAnnounce, Logger: t.cfg.Logger, Metrics: t.metricsOf().weights})
	return err
}

// NewOn makes a trainer on a host and mesh the caller made, started and
// runs (a simulated network's, say); Run then runs only the trainer's own
// work.
func NewOn(cfg Config, h mesh.Host, m *mesh.Mesh) (*Trainer, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("trainer: no data directory")
	}
	if cfg.Admin == "" {
		cfg.Admin = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if m.Cert().Role() != member.RoleTrainer {
		return nil, ErrNotTrainer
	}
	python, err := checkEngine(context.Background(), cfg.Engine, cfg.Device, cfg.GPUs)
	if err != nil {
		return nil, err
	}
	if err := cfg.Group.Validate(); err != nil {
		return nil, err
	}
	return newTrainer(cfg, h, m, python)
}

// newTrainer makes the trainer; python is the torch engine's interpreter
// (checkEngine's).
func newTrainer(cfg Config, h mesh.Host, m *mesh.Mesh, python string) (*Trainer, error) {
	if err := checkSpotCheck(cfg.SpotCheck); err != nil {
		return nil, err
	}
	if note, err := private.CheckDataDir(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	} else if note != "" {
		cfg.Logger.Warn("data directory was open to other accounts", "fixed", note)
	}
	s, err := store.Open(filepath.Join(cfg.DataDir, StoreDir), nil)
	if err != nil {
		return nil, err
	}
	t := &Trainer{cfg: cfg, log: cfg.Logger.With("component", "trainer"), host: h, mesh: m, self: m.ID(), store: s,
		timing: cfg.Timing.WithDefaults(), verify: cfg.Verify, verifyLater: map[core.BatchID]time.Time{}, evalLater: map[string]time.Time{}}
	t.cert.init()
	switch {
	case cfg.NoSpotCheck:
	case cfg.SpotCheck == 0:
		t.spotBits.Store(math.Float64bits(DefaultSpotCheck))
	default:
		t.spotBits.Store(math.Float64bits(cfg.SpotCheck))
	}
	stop, cancel := context.WithCancel(context.Background())
	t.stopped, t.cancel = stop.Done(), cancel
	if t.verify == nil && !cfg.NoVerify {
		t.checker, err = verify.New(verify.Config{CacheDir: filepath.Join(cfg.DataDir, PluginsDir), Fetch: t.fetchPlugin, Logger: t.log})
		if err != nil {
			s.Close()
			return nil, err
		}
		t.verify = t.check
	}
	if t.group, err = openRaftMember(t, t.timing); err != nil {
		s.Close()
		return nil, err
	}
	t.work = newWorkLoop(t, &worker{log: t.log, baseDir: baseDir(cfg.Base), engineID: cfg.Engine,
		device: cfg.Device, gpus: cfg.GPUs, gradCheckpoint: cfg.GradCheckpoint, python: python})
	h.Handle(Protocol, t.serveRPC)
	if cfg.Personal.On {
		if err := t.servePersonal(); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

func baseDir(base string) string {
	if base == group.DefaultBase {
		return ""
	}
	return base
}

// ID is the trainer's peer id.
func (t *Trainer) ID() mesh.PeerID { return t.self }

// Peer is the trainer's mesh peer (nil for a trainer made by NewOn).
func (t *Trainer) Peer() *peer.Peer { return t.peer }

// Store is the trainer's batch store.
func (t *Trainer) Store() *store.Store { return t.store }

// Addr is the admin API's address once Run has bound it, else nil.
func (t *Trainer) Addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

// AdminOff as Config.Admin serves no admin API.
const AdminOff = "off"

// Run serves the admin API and collects batches until ctx is done.
func (t *Trainer) Run(ctx context.Context) error {
	token, err := adminapi.LoadOrCreateToken(t.cfg.DataDir)
	if err != nil {
		return err
	}
	var ln net.Listener
	adminAddr := "off"
	if t.cfg.Admin != AdminOff {
		if ln, err = net.Listen("tcp", t.cfg.Admin); err != nil {
			return fmt.Errorf("trainer: admin listener: %w", err)
		}
		t.mu.Lock()
		t.addr = ln.Addr()
		t.mu.Unlock()
		adminAddr = ln.Addr().String()
		addrPath := filepath.Join(t.cfg.DataDir, AddrFile)
		if err := adminapi.WriteAddr(t.cfg.DataDir, AddrFile, adminAddr); err != nil {
			t.log.Warn("cannot write the address file", "err", err)
		}
		defer os.Remove(addrPath)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	context.AfterFunc(ctx, t.cancel)
	go func() { // Close and a crash stop Run too
		select {
		case <-t.stopped:
			stop()
		case <-ctx.Done():
		}
	}()
	// Only the data directory's owner reads the trainer's state.
	srv := &http.Server{Handler: adminapi.RequireToken(token, t.handler(stop)), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	goRun := func(fn func()) {
		wg.Add(1)
		go func() { defer wg.Done(); fn() }()
	}
	if ln != nil {
		goRun(func() { srv.Serve(ln) })
		if sock, err := adminapi.ServeSocket(ctx, t.cfg.DataDir, t.handler(stop)); err != nil {
			t.log.Warn("no admin socket: commands reach the trainer over TCP with DATA/admin.token", "err", err)
		} else {
			goRun(func() { <-sock })
		}
	}
	if t.peer != nil {
		goRun(func() { t.peer.Run(ctx) })
	}
	if t.weights != nil {
		goRun(func() { t.weights.Run(ctx) })
	}
	var collectErr error
	goRun(func() {
		collectErr = t.mesh.Collect(ctx, t.store, mesh.PullOptions{Limits: t.cfg.Limits, Budget: t.cfg.PullBudget, Stats: &t.pulls})
	})
	goRun(func() { t.group.watchObservations(ctx) })
	goRun(func() {
		if err := t.group.join(ctx); err != nil {
			if ctx.Err() == nil {
				t.log.Error("cannot join or make the trainers' group", "err", err)
			}
			return
		}
		goRun(func() { t.lead(ctx) })
		goRun(func() { t.work.run(ctx) })
	})
	t.log.Info("trainer running", "peer", t.self, "mesh", t.mesh.MeshID(), "admin", adminAddr, "p2p", strings.Join(t.host.Addrs(), " "))
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	srv.Shutdown(sctx)
	cancel()
	wg.Wait()
	return collectErr
}

// Close stops the group's member, the peer (when New made it), the
// engine, and closes the store.
func (t *Trainer) Close() error {
	t.cancel()
	var errs []error
	if t.personal != nil {
		errs = append(errs, t.personal.Close())
	}
	errs = append(errs, t.group.close(), t.work.w.close(), t.runtimes.close())
	if t.checker != nil {
		errs = append(errs, t.checker.Close(context.Background()))
	}
	if t.weights != nil {
		errs = append(errs, t.weights.Close())
	}
	if t.peer != nil {
		errs = append(errs, t.peer.Close())
	}
	return errors.Join(append(errs, t.store.Close())...)
}

// detached returns a context for work the trainer does outside Run's
// calls (a stream handler, a redial): it is done once the trainer stops,
// or cancel is called.
func (t *Trainer) detached() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-t.stopped:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Batches is a batch store as the admin API lists it.
type Batches struct{ S *store.Store }

// List lists the stored batches.
func (b Batches) List(ctx context.Context) ([]peer.BatchInfo, error) {
	es, err := b.S.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]peer.BatchInfo, 0, len(es))
	for _, e := range es {
		out = append(out, peer.BatchInfo{ID: e.ID, Size: int64(e.Size), Steps: e.Header.Steps, Sessions: e.Header.Sessions, Created: e.Header.Created, Received: e.Received})
	}
	return out, nil
}

// Get returns a stored batch, decoded.
func (b Batches) Get(ctx context.Context, id core.BatchID) (*batch.Batch, error) {
	return b.S.Batch(ctx, id)
}

// ReadAddr returns the admin address a running trainer wrote in dataDir.
func ReadAddr(dataDir string) (string, error) { return adminapi.ReadAddr(dataDir, AddrFile) }

// check replays a stored batch's scores (the default Verify).
func (t *Trainer) check(ctx context.Context, id core.BatchID, from mesh.PeerID) (string, error) {
	b, err := t.store.Batch(ctx, id)
	if err != nil {
		return "", err
	}
	res, err := t.checker.Check(ctx, b, from)
	if err != nil {
		return "", err
	}
	if res.Verified {
		return "", nil
	}
	return "verification: " + res.Reason, nil
}

// fetchPlugin fetches a plugin module from the peer that announced the
// batch, else from any admitted peer that has it (the built-in plugins are
// on every device).
func (t *Trainer) fetchPlugin(ctx context.Context, from mesh.PeerID, hash string, maxBytes int64) ([]byte, error) {
	peers := []mesh.PeerID{from}
	for _, p := range t.mesh.Peers() {
		if p.ID != from && p.ID != t.self {
			peers = append(peers, p.ID)
		}
	}
	var errs []error
	for _, p := range peers {
		if p == "" {
			continue
		}
		b, err := t.mesh.FetchPlugin(ctx, p, hash, maxBytes)
		if err == nil {
			return b, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}
