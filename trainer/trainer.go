// Package trainer is a trainer peer: a volunteer's machine in the mesh that
// receives the devices' scrubbed batches to train the mesh's adapter. It
// joins the mesh with its trainer certificate, pulls every batch announced
// on it, verifies it, keeps it in its batch store (trainer/store) and
// acknowledges it, which lets the device that made it mark it shipped. It
// serves the same `clawmesh mesh ...` admin API as a node, on a loopback
// listener of its own. Training rounds over those batches, in a raft group
// of trainers, build on this.
package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/trainer/store"
)

// Files in a trainer's data directory, beside the mesh peer's.
const (
	// StoreDir holds the batch store.
	StoreDir = "batches"
	// AddrFile holds the running trainer's admin address.
	AddrFile = "trainer.addr"
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
	Admin string
	// Limits bound the batches accepted (mesh/batch defaults).
	Limits batch.Limits
	// Stall is how long a pull may make no progress (mesh default).
	Stall  time.Duration
	Logger *slog.Logger
}

// Trainer is a running trainer peer.
type Trainer struct {
	cfg   Config
	log   *slog.Logger
	peer  *peer.Peer
	store *store.Store

	mu   sync.Mutex
	addr net.Addr
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
	st, err := mesh.LoadState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if c, _ := st.Certificate(); c.Role() != member.RoleTrainer {
		return nil, ErrNotTrainer
	}
	s, err := store.Open(filepath.Join(cfg.DataDir, StoreDir), nil)
	if err != nil {
		return nil, err
	}
	p, err := peer.Start(ctx, peer.Options{DataDir: cfg.DataDir, Listen: cfg.Listen, Bootstrap: cfg.Bootstrap, MDNS: cfg.MDNS, NAT: cfg.NAT, Stall: cfg.Stall, Logger: cfg.Logger})
	if err != nil {
		s.Close()
		return nil, err
	}
	return &Trainer{cfg: cfg, log: cfg.Logger.With("component", "trainer"), peer: p, store: s}, nil
}

// Peer is the trainer's mesh peer.
func (t *Trainer) Peer() *peer.Peer { return t.peer }

// Store is the trainer's batch store.
func (t *Trainer) Store() *store.Store { return t.store }

// Addr is the admin API's address once Run has bound it, else nil.
func (t *Trainer) Addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

// Run serves the admin API and collects batches until ctx is done.
func (t *Trainer) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", t.cfg.Admin)
	if err != nil {
		return fmt.Errorf("trainer: admin listener: %w", err)
	}
	t.mu.Lock()
	t.addr = ln.Addr()
	t.mu.Unlock()
	addrPath := filepath.Join(t.cfg.DataDir, AddrFile)
	if err := adminapi.WriteAddr(t.cfg.DataDir, AddrFile, ln.Addr().String()); err != nil {
		t.log.Warn("cannot write the address file", "err", err)
	}
	defer os.Remove(addrPath)
	srv := &http.Server{Handler: peer.Handler(t.peer, Batches{t.store}), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); srv.Serve(ln) }()
	go func() { defer wg.Done(); t.peer.Run(ctx) }()
	var collectErr error
	go func() {
		defer wg.Done()
		collectErr = t.peer.Mesh.Collect(ctx, t.store, mesh.PullOptions{Limits: t.cfg.Limits})
	}()
	t.log.Info("trainer running", "peer", t.peer.Mesh.ID(), "mesh", t.peer.Mesh.MeshID(), "admin", ln.Addr().String(), "p2p", strings.Join(t.peer.Host.Addrs(), " "))
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	srv.Shutdown(sctx)
	cancel()
	wg.Wait()
	return collectErr
}

// Close stops the peer and closes the store.
func (t *Trainer) Close() error {
	return errors.Join(t.peer.Close(), t.store.Close())
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
