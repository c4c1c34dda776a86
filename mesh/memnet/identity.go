package memnet

import (
	"crypto/ed25519"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/mesh"
)

// IDFromKey is the peer id of an Ed25519 public key: its libp2p peer id,
// the one mesh/p2p gives a host with that key (p2p.PeerIDFromEd25519).
func IDFromKey(pub ed25519.PublicKey) (mesh.PeerID, error) {
	k, err := crypto.UnmarshalEd25519PublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadPeer, err)
	}
	id, err := peer.IDFromPublicKey(k)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadPeer, err)
	}
	return mesh.PeerID(id.String()), nil
}

// KeyOf is the Ed25519 public key a peer id made by IDFromKey embeds, as
// mesh/p2p's PublicKey: what mesh.Config.KeyOf needs.
func KeyOf(p mesh.PeerID) (ed25519.PublicKey, error) {
	id, err := peer.Decode(string(p))
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadPeer, p, err)
	}
	k, err := id.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: %s embeds no key: %v", ErrBadPeer, p, err)
	}
	if k.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("%w: %s is a %s key, not Ed25519", ErrBadPeer, p, k.Type())
	}
	raw, err := k.Raw()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPeer, err)
	}
	return ed25519.PublicKey(raw), nil
}
