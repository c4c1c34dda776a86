// Package peer runs a mesh peer on a data directory: the libp2p host
// (mesh/p2p), with the membership (mesh.Mesh) as its gate and its
// protocols on it. A node and a trainer each run one; `clawmesh join`
// runs a host for as long as it takes to redeem a token.
package peer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/p2p"
)

// Options configure a Peer. The zero value of each field but DataDir means
// its default.
type Options struct {
	// DataDir holds the identity, the peer cache and the membership.
	DataDir string
	// Listen are libp2p multiaddrs; default p2p's (QUIC and TCP, port 4001
	// or a free one).
	Listen []string
	// Bootstrap are peers to dial at start.
	Bootstrap []string
	// MDNS finds peers on the local network; NAT turns on NAT traversal.
	MDNS, NAT bool
	// AdmitTimeout, RefuseFor and Stall: see mesh.Config.
	AdmitTimeout, RefuseFor, Stall time.Duration
	Logger                         *slog.Logger
}

// Peer is a running mesh peer.
type Peer struct {
	Mesh *mesh.Mesh
	Host *p2p.Host
}

// Identity returns the data directory's identity key (made if missing) as
// an Ed25519 key, and its peer id.
func Identity(dataDir string) (ed25519.PrivateKey, mesh.PeerID, error) {
	k, id, err := p2p.LoadIdentity(dataDir)
	if err != nil {
		return nil, "", err
	}
	raw, err := k.Raw()
	if err != nil || len(raw) != ed25519.PrivateKeySize {
		return nil, "", fmt.Errorf("peer: the identity in %s is not an Ed25519 key", dataDir)
	}
	return ed25519.PrivateKey(raw), id, nil
}

// Start starts the peer of a data directory that is in a mesh; it returns
// an error wrapping mesh.ErrNotJoined for one that is not.
func Start(ctx context.Context, o Options) (*Peer, error) {
	key, _, err := Identity(o.DataDir)
	if err != nil {
		return nil, err
	}
	m, err := mesh.New(mesh.Config{
		DataDir: o.DataDir, Key: key, KeyOf: p2p.PublicKey, Bootstrap: o.Bootstrap,
		AdmitTimeout: o.AdmitTimeout, RefuseFor: o.RefuseFor, Stall: o.Stall, Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	h, err := p2p.New(ctx, p2p.Options{
		DataDir: o.DataDir, Listen: o.Listen, Gate: m, Open: mesh.OpenProtocols, MDNS: o.MDNS, NAT: o.NAT, Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx, h); err != nil {
		h.Close()
		return nil, err
	}
	return &Peer{Mesh: m, Host: h}, nil
}

// Run runs the membership's work (and reconnects to the peers the host
// remembers) until ctx is done.
func (p *Peer) Run(ctx context.Context) error {
	go p.Host.ConnectKnown(ctx)
	return p.Mesh.Run(ctx)
}

// Close closes the host.
func (p *Peer) Close() error { return p.Host.Close() }

// nobody admits no one: the gate of a host that has not joined yet.
type nobody struct{}

func (nobody) Blocked(mesh.PeerID) bool  { return false }
func (nobody) Admitted(mesh.PeerID) bool { return false }

// Join redeems an invite token with its inviter, on a host started for
// the purpose, and records the membership in dataDir.
func Join(ctx context.Context, dataDir, token string, listen []string, log *slog.Logger) (*mesh.State, error) {
	return JoinWith(ctx, dataDir, token, JoinOptions{Listen: listen, Logger: log})
}

// JoinOptions tune JoinWith. The zero value is the default.
type JoinOptions struct {
	// Listen are the libp2p addresses of the host that joins; default any
	// free QUIC and TCP port.
	Listen []string
	Logger *slog.Logger
	// Progress is told of each try to reach the inviter (mesh.JoinOptions).
	Progress func(mesh.JoinAttempt)
}

// JoinWith is Join with options.
func JoinWith(ctx context.Context, dataDir, token string, o JoinOptions) (*mesh.State, error) {
	listen, log := o.Listen, o.Logger
	if _, err := mesh.LoadState(dataDir); err == nil {
		return nil, fmt.Errorf("%w: %s is in a mesh already", mesh.ErrJoined, dataDir)
	} else if !errors.Is(err, mesh.ErrNotJoined) {
		return nil, err
	}
	if listen == nil {
		listen = []string{"/ip4/0.0.0.0/udp/0/quic-v1", "/ip4/0.0.0.0/tcp/0"}
	}
	h, err := p2p.New(ctx, p2p.Options{DataDir: dataDir, Listen: listen, Gate: nobody{}, Open: mesh.OpenProtocols, Logger: log})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return mesh.JoinWith(ctx, h, dataDir, token, time.Now(), mesh.JoinOptions{Progress: o.Progress})
}
