// Package adapters is a node's side of the weights coming back: it follows
// the mesh's newest adapter version (or the one the owner pinned), fetches
// it through the weights service (mesh/weights: verified chunk by chunk
// against a manifest certified by a quorum of the mesh's voters and
// fenced by the raft term and index that committed it), installs it atomically under DATA/adapters/vN,
// and hot-swaps it into the model server with a swap.Driver: load under a
// new name, one warm-up request, then the gateway's route flips (Route).
// Where the driver tells the base model its server serves
// (swap.BaseIdentifier), a version trained on another base (model/baseid)
// is refused, not loaded.
// Requests in flight finish on the version they started with; each
// recorded step names the version that served it.
//
// An install is a fresh temporary directory beside the versions, the
// bundle's two files written and synced, the directory synced, then one
// rename: a crash leaves the old versions and perhaps a temporary
// directory (removed at the next start), never a half-written version.
package adapters

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/node/swap"
)

// Base is the version name of the base model, no adapter.
const Base = swap.BaseVersion

// stateFile keeps the pin and the version serving, in Config.Dir.
const stateFile = "state.json"

// ErrVersion is a version name that is not "base", "latest" or vN.
var ErrVersion = errors.New("adapters: a version is vN (v3), base or latest")

// Weights is what a follower needs of the weights service
// (*weights.Service).
type Weights interface {
	// Latest is the newest manifest accepted (verified and fenced).
	Latest() *chunks.Manifest
	// Dir holds the bundles fetched.
	Dir() *weights.Dir
	// Fetch fetches a bundle into Dir.
	Fetch(ctx context.Context, m *chunks.Manifest, progress func(weights.Progress)) error
	// Sources are the peers known to hold a bundle.
	Sources(m *chunks.Manifest) []weights.Source
}

// Config configures a Follower.
type Config struct {
	// Dir holds the installed versions (Dir/v3) and the follower's state.
	Dir     string
	Weights Weights
	// Driver loads versions into the model server; nil installs them
	// without serving them (an upstream that cannot hot-swap).
	Driver swap.Driver
	// Retry is how long after a failed attempt the next one starts
	// (default 5s).
	Retry time.Duration
	// Keep is how many of the newest versions stay on disk, installed and
	// held for other devices, besides the one serving and the one pinned
	// (default 3); older ones are removed once a newer one serves.
	Keep int
	// Personal, if set, is the device's personal adapter: it is stacked
	// on each version served (node/personal).
	Personal Layer
	Logger   *slog.Logger
}

// Layer is a personal adapter served on top of the shared versions.
type Layer interface {
	// Current is the personal version to stack and its directory ("",
	// "" when none).
	Current() (name, dir string)
	// Stacked returns the directory of one adapter that is the shared
	// version (installed in sharedDir) with the personal version p
	// (directory pdir) on top.
	Stacked(version, sharedDir, p, pdir string) (string, error)
}

// StackName names a version with a personal version stacked on it:
// "v12-p3" ("base-p3" on the base model alone).
func StackName(version, p string) string {
	if p == "" {
		return version
	}
	return version + "-" + p
}

// SplitStack splits a name StackName made into the shared version and the
// personal one ("" when the name has no personal part).
func SplitStack(name string) (version, p string) {
	v, p, _ := strings.Cut(name, "-")
	return v, p
}

type state struct {
	Pin     string `json:"pin,omitempty"` // "" follows the newest; "base" or "vN"
	Serving string `json:"serving,omitempty"`
}

// Follower keeps the model server on the wanted version.
type Follower struct {
	cfg   Config
	log   *slog.Logger
	route atomic.Pointer[swap.Target]
	kick  chan struct{}

	mu       sync.Mutex
	st       state
	progress map[string]weights.Progress // bundle id → a fetch in progress
	lastErr  string
	failed   map[string]string // version → why it could not be served

	// at, in tests, runs at each step of an install (to crash there).
	at func(step string)
}

// New opens the follower's directory: it removes what an interrupted
// install left and reads the pin.
func New(cfg Config) (*Follower, error) {
	if cfg.Weights == nil || cfg.Dir == "" {
		return nil, errors.New("adapters: a follower needs a directory and the weights service")
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 5 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("adapters: %w", err)
	}
	ents, _ := os.ReadDir(cfg.Dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".install-") {
			os.RemoveAll(filepath.Join(cfg.Dir, e.Name()))
		}
	}
	f := &Follower{cfg: cfg, log: cfg.Logger.With("component", "adapters"), kick: make(chan struct{}, 1),
		progress: map[string]weights.Progress{}, failed: map[string]string{}}
	if b, err := os.ReadFile(filepath.Join(cfg.Dir, stateFile)); err == nil {
		if err := json.Unmarshal(b, &f.st); err != nil {
			f.log.Warn("the adapters state file does not read; following the newest version", "err", err)
			f.st = state{}
		}
	}
	// Until a version is loaded (the model server may have restarted
	// too), requests go as the client sent them.
	f.route.Store(&swap.Target{Version: Base})
	if cfg.Driver == nil && f.st.Serving != "" {
		f.route.Store(&swap.Target{Version: f.st.Serving})
	}
	return f, nil
}

// SetPersonal sets the personal adapter stacked on the versions served
// (Config.Personal); call it before Run.
func (f *Follower) SetPersonal(l Layer) { f.cfg.Personal = l }

// Route is where requests go now; the gateway reads it once per request.
func (f *Follower) Route() swap.Target { return *f.route.Load() }

// Notify wakes the follower (a new manifest arrived).
func (f *Follower) Notify() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Run keeps the wanted version serving until ctx is done.
func (f *Follower) Run(ctx context.Context) {
	tk := time.NewTicker(f.cfg.Retry)
	defer tk.Stop()
	for {
		if err := f.sync(ctx); err != nil && ctx.Err() == nil {
			f.mu.Lock()
			if f.lastErr != err.Error() {
				f.log.Warn("adapter version not serving yet", "err", err)
			}
			f.lastErr = err.Error()
			f.mu.Unlock()
		} else {
			f.mu.Lock()
			f.lastErr = ""
			f.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		case <-f.kick:
		}
	}
}

// ParseVersion parses the name of a version, vN with N at least 1, into N
// (Pin also takes "base" and "latest").
func ParseVersion(v string) (uint64, error) {
	n, ok := strings.CutPrefix(v, "v")
	if !ok {
		return 0, fmt.Errorf("%w, not %q", ErrVersion, v)
	}
	u, err := strconv.ParseUint(n, 10, 64)
	if err != nil || u == 0 {
		return 0, fmt.Errorf("%w, not %q", ErrVersion, v)
	}
	return u, nil
}

// want is the version to serve: the pin, or the newest accepted; "" when
// none is known yet.
func (f *Follower) want() string {
	f.mu.Lock()
	pin := f.st.Pin
	f.mu.Unlock()
	if pin != "" {
		return pin
	}
	if m := f.cfg.Weights.Latest(); m != nil {
		return m.Name()
	}
	return ""
}

// manifest finds the manifest of version name among those accepted or
// held.
func (f *Follower) manifest(name string) (*chunks.Manifest, bool) {
	if m := f.cfg.Weights.Latest(); m != nil && m.Name() == name {
		return m, true
	}
	for _, m := range f.cfg.Weights.Dir().Held() {
		if m.Name() == name {
			return m, true
		}
	}
	return nil, false
}

func (f *Follower) sync(ctx context.Context) error {
	want := f.want()
	var p, pdir string
	if f.cfg.Personal != nil && f.cfg.Driver != nil {
		p, pdir = f.cfg.Personal.Current()
	}
	cur := f.Route()
	if want == "" || (StackName(want, p) == cur.Version && (f.cfg.Driver != nil || f.serving() == want)) {
		return nil
	}
	if want == Base {
		if f.cfg.Driver == nil {
			return f.serve(swap.Target{Version: Base})
		}
		if p != "" {
			// The personal adapter alone, on the base model.
			return f.load(ctx, StackName(Base, p), pdir)
		}
		t, err := f.cfg.Driver.Base(ctx)
		if err != nil {
			return err
		}
		return f.flip(ctx, t)
	}
	m, ok := f.manifest(want)
	if !ok {
		return fmt.Errorf("adapters: %s is not a version this node has heard of", want)
	}
	dir, err := f.Get(ctx, m)
	if err != nil {
		return err
	}
	if f.cfg.Driver == nil {
		if f.serving() != want {
			f.log.Info("version installed; the upstream cannot hot-swap adapters, so it keeps serving what it serves", "version", want, "dir", dir)
		}
		return f.serve(swap.Target{Version: want})
	}
	if err := checkBase(ctx, f.cfg.Driver, dir); err != nil {
		f.fail(want, err)
		return fmt.Errorf("adapters: %s: %w", want, err)
	}
	if p != "" {
		stacked, err := f.cfg.Personal.Stacked(want, dir, p, pdir)
		if err == nil {
			return f.load(ctx, StackName(want, p), stacked)
		}
		// The shared version still serves, alone.
		f.log.Warn("the personal adapter does not stack on this version; serving the version alone", "version", want, "personal", p, "err", err)
	}
	return f.load(ctx, want, dir)
}

// load loads the adapter in dir into the model server as name, warms it
// up and routes new requests to it.
func (f *Follower) load(ctx context.Context, name, dir string) error {
	start := time.Now()
	t, err := f.cfg.Driver.Load(ctx, name, dir)
	if err != nil {
		f.fail(name, err)
		return fmt.Errorf("adapters: loading %s: %w", name, err)
	}
	f.log.Info("version loaded", "version", name, "model", t.Model, "took", time.Since(start).Round(time.Millisecond))
	if err := f.cfg.Driver.Warm(ctx, t); err != nil {
		f.fail(name, err)
		return fmt.Errorf("adapters: warming %s up: %w", name, err)
	}
	return f.flip(ctx, t)
}

// checkBase refuses the adapter in dir where the driver tells the base
// model its server serves (swap.BaseIdentifier) and the adapter was
// trained on another (model/baseid). Where either cannot be told, the
// server has the last word.
func checkBase(ctx context.Context, d swap.Driver, dir string) error {
	bi, ok := d.(swap.BaseIdentifier)
	if !ok {
		return nil
	}
	served, err := bi.BaseIdentity(ctx)
	if err != nil {
		return nil
	}
	trained, err := baseid.FromAdapter(dir)
	if err != nil {
		return nil
	}
	if err := baseid.Same(trained, served); err != nil {
		return fmt.Errorf("trained on another base than the model server serves, so it is not loaded: %w", err)
	}
	return nil
}

func (f *Follower) fail(version string, err error) {
	f.mu.Lock()
	f.failed[version] = err.Error()
	f.mu.Unlock()
}

// flip routes new requests to t, then frees the version they left.
func (f *Follower) flip(ctx context.Context, t swap.Target) error {
	old := f.route.Swap(&t)
	if err := f.serve(t); err != nil {
		f.log.Warn("keeping the serving version", "err", err)
	}
	f.log.Info("serving", "version", t.Version, "previous", old.Version)
	if old.Version != t.Version && old.Version != Base && old.Model != t.Model {
		if err := f.cfg.Driver.Unload(ctx, *old); err != nil {
			f.log.Debug("freeing the previous version", "version", old.Version, "err", err)
		}
	}
	return nil
}

func (f *Follower) serving() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.Serving
}

// serve records t as the version serving.
func (f *Follower) serve(t swap.Target) error {
	if f.cfg.Driver == nil {
		f.route.Store(&t)
	}
	f.mu.Lock()
	f.st.Serving = t.Version
	delete(f.failed, t.Version)
	st := f.st
	f.mu.Unlock()
	err := f.save(st)
	f.prune(st)
	return err
}

// prune removes the versions older than the newest Keep, except the one
// serving and the one pinned: their bundles and their installed copies.
func (f *Follower) prune(st state) {
	held := f.cfg.Weights.Dir().Held() // newest first
	serving, _ := SplitStack(st.Serving)
	for i, m := range held {
		if i < f.cfg.Keep || m.Name() == serving || m.Name() == st.Pin {
			continue
		}
		if err := f.cfg.Weights.Dir().Remove(m.BundleID()); err != nil {
			f.log.Warn("removing an old version's bundle", "version", m.Name(), "err", err)
		}
		if err := os.RemoveAll(f.VersionDir(m.Name())); err != nil {
			f.log.Warn("removing an old version", "version", m.Name(), "err", err)
		}
		f.log.Info("old version removed", "version", m.Name())
	}
}

func (f *Follower) save(st state) error {
	b, _ := json.Marshal(st)
	return atomicfile.Write(filepath.Join(f.cfg.Dir, stateFile), b, 0o600)
}

// Pin makes version ("vN", "base", or "latest" to follow the newest
// again) the one to serve.
func (f *Follower) Pin(version string) error {
	switch version {
	case "latest", "":
		version = ""
	case Base:
	default:
		if _, err := ParseVersion(version); err != nil {
			return err
		}
		if _, ok := f.manifest(version); !ok {
			return fmt.Errorf("adapters: %s is not a version this node has heard of (`clawmesh weights ls` lists them)", version)
		}
	}
	f.mu.Lock()
	f.st.Pin = version
	st := f.st
	f.mu.Unlock()
	if err := f.save(st); err != nil {
		return fmt.Errorf("adapters: %w", err)
	}
	f.Notify()
	return nil
}

// VersionDir is where version name is installed.
func (f *Follower) VersionDir(name string) string { return filepath.Join(f.cfg.Dir, name) }

// Get fetches m's bundle (if not held) and installs it (if not
// installed), returning its directory.
func (f *Follower) Get(ctx context.Context, m *chunks.Manifest) (string, error) {
	dir := f.VersionDir(m.Name())
	if err := checkInstalled(dir, m); err == nil {
		return dir, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		f.log.Warn("an installed version does not match its manifest: installing it again", "version", m.Name(), "err", err)
		if err := os.RemoveAll(dir); err != nil {
			return "", fmt.Errorf("adapters: %w", err)
		}
	}
	id := m.BundleID()
	if _, err := f.cfg.Weights.Dir().Manifest(id); err != nil {
		f.log.Info("fetching a version", "version", m.Name(), "bytes", m.Size, "sources", len(f.cfg.Weights.Sources(m)))
		start := time.Now()
		next := int64(0)
		err := f.cfg.Weights.Fetch(ctx, m, func(p weights.Progress) {
			f.mu.Lock()
			f.progress[id] = p
			f.mu.Unlock()
			if p.Bytes >= next && p.Total > 0 {
				f.log.Info("fetching", "version", m.Name(), "percent", p.Bytes*100/p.Total, "sources", p.Sources)
				next += p.Total / 4
			}
		})
		f.mu.Lock()
		delete(f.progress, id)
		f.mu.Unlock()
		if err != nil {
			return "", fmt.Errorf("adapters: fetching %s: %w", m.Name(), err)
		}
		f.log.Info("version fetched and verified", "version", m.Name(), "bytes", m.Size, "took", time.Since(start).Round(time.Millisecond))
	}
	if err := f.install(m); err != nil {
		return "", err
	}
	return dir, nil
}

// install unpacks a held bundle into a temporary directory, syncs it, and
// renames it into place.
func (f *Follower) install(m *chunks.Manifest) error {
	b, err := os.ReadFile(f.cfg.Weights.Dir().BundlePath(m.BundleID()))
	if err != nil {
		return fmt.Errorf("adapters: %w", err)
	}
	if sha256.Sum256(b) != m.Bundle {
		f.cfg.Weights.Dir().Remove(m.BundleID())
		return fmt.Errorf("adapters: the bundle of %s changed on disk; it will be fetched again", m.Name())
	}
	tmp, err := os.MkdirTemp(f.cfg.Dir, ".install-"+m.Name()+"-")
	if err != nil {
		return fmt.Errorf("adapters: %w", err)
	}
	defer os.RemoveAll(tmp)
	f.step("made")
	if err := weights.Unpack(b, tmp); err != nil {
		return fmt.Errorf("adapters: %w", err)
	}
	f.step("unpacked")
	if err := os.Rename(tmp, f.VersionDir(m.Name())); err != nil {
		return fmt.Errorf("adapters: %w", err)
	}
	f.step("renamed")
	atomicfile.SyncDir(f.cfg.Dir)
	f.step("synced")
	f.log.Info("version installed", "version", m.Name(), "dir", f.VersionDir(m.Name()))
	return nil
}

func (f *Follower) step(name string) {
	if f.at != nil {
		f.at(name)
	}
}

// checkInstalled checks that dir holds m's bundle, byte for byte.
func checkInstalled(dir string, m *chunks.Manifest) error {
	b, err := weights.Pack(dir)
	if err != nil {
		return err
	}
	if sha256.Sum256(b) != m.Bundle {
		return fmt.Errorf("%s differs from its manifest", dir)
	}
	return nil
}

// Fetch fetches and installs version name now, without serving it.
func (f *Follower) Fetch(ctx context.Context, name string) error {
	m, ok := f.manifest(name)
	if !ok {
		return fmt.Errorf("adapters: %s is not a version this node has heard of (`clawmesh weights ls` lists them)", name)
	}
	_, err := f.Get(ctx, m)
	return err
}
