// Package p2p is the mesh's Host on go-libp2p: a persistent Ed25519
// identity in the node's data dir, QUIC and TCP transports secured by Noise
// or TLS and multiplexed by yamux, a resource manager sized for a small
// device, admission through a connection gater and per-protocol checks
// (mesh.Gate), one GossipSub router whose messages are signed by their
// author and identified by their author and content, local discovery by
// mDNS, NAT traversal (AutoNAT, hole punching, relays) and a small cache of
// the peers seen, so that a restarted node finds its mesh without its
// bootstrap addresses.
//
// Admission works in layers. A peer the Gate calls Blocked is refused by
// the connection gater as soon as its identity is known, in both
// directions, unless the Gate is a mesh.Teller that lets it connect in to
// be told why (a revoked peer): then only the open protocols serve it. A peer that is connected but not Admitted may only use the
// open protocols (Options.Open): streams of other protocols are reset before
// the mesh's handler sees them, and NewStream refuses to open them. In
// gossip, a peer not admitted is never sent a message (peer filter, peer
// score), and every message and control frame it sends is dropped; only its
// subscription announcements are kept, so that the router knows its topics
// the moment the Gate admits it.
package p2p
