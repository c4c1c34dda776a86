// Package memnet is a simulated network of mesh hosts in one process: each
// Host implements mesh.Host over in-memory connections, so that the mesh's
// protocol code (admission, invites, gossip, the batch pull, a raft group
// over mesh/raftnet) runs between many peers without sockets, and faults are
// injected on purpose: partitions, isolation, crashes, lost gossip.
//
// It copies the semantics of mesh/p2p, the real Host on go-libp2p:
//
//   - Identity: a Host's id is the libp2p peer id of its Ed25519 key, as
//     mesh/p2p derives it (IDFromKey, KeyOf), so that mesh certificates
//     verify; a host may also be named by any id, for tests that need no
//     keys. Addresses are multiaddr strings ending in /p2p/<id>: a host
//     listens at its id's usual address, the same when it is made again
//     after a crash (a device on a fixed port), unless
//     HostOptions.NewAddr gives it a fresh one (a port of the system's
//     choosing). A host dials a peer by id only at an address it has of
//     it: one given to Connect, or learnt on connecting (as libp2p's
//     identify tells each end the other's listen addresses).
//   - Admission: a peer the Gate calls Blocked can neither connect nor be
//     connected to; a connected peer that is not Admitted may open only
//     the open protocols (HostOptions.Open), and its streams of other
//     protocols are reset before the handler sees them. Gossip goes only
//     to admitted peers and is taken only from them.
//   - Streams: full-duplex, buffered (a writer blocks once
//     Options.StreamBuffer bytes wait to be read), with yamux's half-close:
//     CloseWrite gives the peer io.EOF after the data, Close is CloseWrite
//     plus CloseRead, Reset fails both ends. Deadlines time out with
//     os.ErrDeadlineExceeded (a net.Error whose Timeout is true). A stream
//     is also a net.Conn.
//   - Gossip: a message carries its author, the host that published it
//     (Message.Author: the network itself vouches for it, as mesh/p2p's
//     signatures do), is identified by its topic, author and content, and
//     is delivered once per host within Options.SeenTTL, from whichever
//     neighbour forwarded it first (Message.From); every host that receives
//     a message forwards it to its own admitted, subscribed neighbours, so
//     gossip crosses hosts that are not directly connected. Publishing what
//     a host has already seen does nothing. This is flooding, not
//     GossipSub's mesh of a few peers per topic with heartbeats and
//     scores: the same messages reach the same hosts, with more copies
//     sent on the way.
//   - Notify: calls come in order, on a goroutine of the Host's own, and
//     none after Close or Crash.
//
// Faults are the Network's: Partition, Isolate and Heal decide which hosts
// can reach which (connections across a new cut are closed at once, their
// streams reset, both ends notified); Crash makes a host vanish as under
// kill -9; SetDrop and Options.Drop lose gossip on a link. Latency and
// jitter delay each stream opened and each gossip message on each hop;
// connecting, and the bytes on an open stream, take no time. Stats counts
// what the network carried.
//
// Determinism: every random draw is a pure function of Options.Seed and
// of what is drawn: a gossip message's drop and delay on a link depend on
// the link and the message's id, a stream's delay on the link, its
// protocol and how many streams that link has opened before, a key on how
// many keys the Network made before. The same seed and the same calls give
// the same faults and delays, however goroutines are scheduled (but
// streams opened at once on one link may swap their draws).
//
// Time: memnet uses the time package only (timers, time.Now) and waits on
// channels only, so a network built inside a testing/synctest bubble runs
// on the bubble's virtual clock.
//
// Why not go-libp2p's mocknet or simnet (x/simlibp2p): mesh/p2p builds
// its own libp2p host with its own transports, so neither can be put
// under it without changing mesh/p2p, and neither draws its faults from a
// seed. memnet implements the mesh's small Host interface instead; mesh/p2p's
// own tests keep the real stack honest, and the semantics above are what
// the two must share.
package memnet
