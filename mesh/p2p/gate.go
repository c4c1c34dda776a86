package p2p

import (
	"log/slog"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/clawmesh/clawmesh/mesh"
)

// gater is the libp2p connection gater: it refuses blocked peers as soon
// as their identity is known, dialling (InterceptPeerDial) or after the
// security handshake (InterceptSecured), in both directions. Admission
// (mesh.Gate.Admitted) is not checked here: a peer that is not admitted yet
// must be able to connect to redeem an invite or show its certificate.
type gater struct {
	gate mesh.Gate
	log  *slog.Logger
}

var _ connmgr.ConnectionGater = (*gater)(nil)

func (g *gater) blocked(p peer.ID, dir string) bool {
	if g.gate.Blocked(meshID(p)) {
		g.log.Debug("connection refused: peer blocked", "peer", p, "direction", dir)
		return true
	}
	return false
}

func (g *gater) InterceptPeerDial(p peer.ID) bool { return !g.blocked(p, "outbound") }

func (g *gater) InterceptAddrDial(peer.ID, ma.Multiaddr) bool { return true }

func (g *gater) InterceptAccept(network.ConnMultiaddrs) bool { return true }

func (g *gater) InterceptSecured(dir network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	if dir == network.DirInbound && mayTell(g.gate, meshID(p)) {
		g.log.Debug("connection from a blocked peer let in: it is told why", "peer", p)
		return true
	}
	return !g.blocked(p, dir.String())
}

// mayTell reports a blocked peer the gate lets connect in, to be told why
// it is refused (mesh.Teller).
func mayTell(gate mesh.Gate, p mesh.PeerID) bool {
	t, ok := gate.(mesh.Teller)
	return ok && t.MayTell(p)
}

func (g *gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// relayACL limits the relay service (Options.NAT) to the mesh: only
// admitted peers may reserve a slot (be reachable through us), and anyone
// not blocked may connect to them through us, since a device that is
// joining must reach its inviter to redeem its invite.
type relayACL struct{ gate mesh.Gate }

var _ relayv2.ACLFilter = relayACL{}

func (a relayACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool {
	return a.gate.Admitted(meshID(p)) && !a.gate.Blocked(meshID(p))
}

func (a relayACL) AllowConnect(src peer.ID, _ ma.Multiaddr, dst peer.ID) bool {
	return !a.gate.Blocked(meshID(src)) && a.gate.Admitted(meshID(dst)) && !a.gate.Blocked(meshID(dst))
}
