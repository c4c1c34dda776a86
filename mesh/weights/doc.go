// Package weights owns the adapter versions' way back from the trainers to
// every peer of a mesh.
//
// A version is a PEFT bundle (adapter_config.json and
// adapter_model.safetensors, packed by Pack) described by a manifest
// (package chunks: its version, base model, parent, the bundle's SHA-256,
// its 1 MiB chunks' hashes, the raft term and index that committed it,
// signed by the leading trainer, whose certificate the mesh's admin
// issued). This package moves the bundles and keeps them; chunks holds
// the pure parts: the manifest, its signature, its certification, its
// fencing, and the plan of which chunks to ask of which source.
//
// A Service accepts a manifest only if a trainer of the mesh signed it and
// it is certified: it carries the votes of a majority of the voter set in
// force (the admin's signed list of the trainers that vote) over the
// version, its parent, its bundle and the term and index that committed
// it. One trainer's key is not enough: a trainer that is not a voter, or a
// voter alone, cannot make the devices take a version, whatever numbers it
// writes. A certification that carries a newer set the admin signed makes
// the peer adopt that set first (mesh.Mesh.AdoptVoters); one made under a
// set no longer in force is refused until the version is certified again
// under the new one, and that new certification then replaces the one
// kept, so that what the peer offers is what its peers accept. Fencing is
// against the last certified version (kept in accepted.manifest): an
// uncertified manifest an older release accepted fences nothing, and the
// next certified version is taken whatever its number. Refusals are
// counted by reason in Metrics, "uncertified" among them.
//
// The bundles travel over QUIC (ALPN clawmesh-weights/1) on TLS bound to the
// peers' libp2p identities: a Server serves the bundles a peer holds (a Dir)
// to the mesh's admitted peers, and a Fetcher pulls a bundle's chunks from
// several of them at once, verifying each chunk, resuming a fetch a crash
// stopped and leaving a stalled or lying source. A peer QUIC cannot reach
// (behind NAT, its listener on a private address) is asked the same over
// the mesh host's streams (ProtocolID), which run on the direct connections
// hole punching makes and never through a relay. A Service ties them to
// the mesh: it offers what its peer holds on gossip, accepts the manifests
// offered, and so makes every holder a source for the others, including
// for fetches already running. Bench measures
// the transfer against bare quic-go and TLS over TCP.
package weights
