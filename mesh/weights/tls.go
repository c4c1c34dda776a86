package weights

import (
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/quic-go/quic-go"

	"github.com/clawmesh/clawmesh/mesh"
)

// ALPN is the weight service's TLS application protocol.
const ALPN = "clawmesh-weights/1"

// identity is a peer's libp2p TLS identity: certificates that carry the
// peer's libp2p key, so that each side of a connection learns the other's
// peer id from the handshake, as libp2p's own TLS transport does.
type identity struct {
	id  mesh.PeerID
	tls *libp2ptls.Identity
}

func newIdentity(key ed25519.PrivateKey) (*identity, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("weights: not an Ed25519 private key")
	}
	sk, err := ic.UnmarshalEd25519PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("weights: identity: %w", err)
	}
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, fmt.Errorf("weights: identity: %w", err)
	}
	ti, err := libp2ptls.NewIdentity(sk)
	if err != nil {
		return nil, fmt.Errorf("weights: identity: %w", err)
	}
	return &identity{id: mesh.PeerID(id.String()), tls: ti}, nil
}

// config returns a TLS config that accepts only remote ("" on a server:
// any peer, checked after the handshake) and speaks ALPN.
func (i *identity) config(remote mesh.PeerID) (*tls.Config, error) {
	var pid peer.ID
	if remote != "" {
		var err error
		if pid, err = peer.Decode(string(remote)); err != nil {
			return nil, fmt.Errorf("weights: peer id %q: %w", remote, err)
		}
	}
	c, _ := i.tls.ConfigForPeer(pid)
	c.NextProtos = []string{ALPN}
	return c, nil
}

// remotePeer returns the peer id the handshake proved.
func remotePeer(c *quic.Conn) (mesh.PeerID, error) {
	pk, err := libp2ptls.PubKeyFromCertChain(c.ConnectionState().TLS.PeerCertificates)
	if err != nil {
		return "", err
	}
	id, err := peer.IDFromPublicKey(pk)
	if err != nil {
		return "", err
	}
	return mesh.PeerID(id.String()), nil
}

// quicConfig tunes quic-go for large transfers: windows big enough that a
// few streams keep a fast link busy.
func quicConfig() *quic.Config {
	return &quic.Config{
		InitialStreamReceiveWindow:     2 << 20,
		MaxStreamReceiveWindow:         16 << 20,
		InitialConnectionReceiveWindow: 8 << 20,
		MaxConnectionReceiveWindow:     64 << 20,
		MaxIncomingStreams:             64,
		MaxIdleTimeout:                 30 * time.Second,
		KeepAlivePeriod:                10 * time.Second,
	}
}
