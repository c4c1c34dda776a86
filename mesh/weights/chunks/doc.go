// Package chunks owns what an adapter version is on the wire and how it is
// fetched, as pure code: the signed Manifest that describes a bundle by its
// 1 MiB chunks' SHA-256 and places the version in the trainers' raft log
// (NewManifest, Sign, Marshal, ParseManifest, Verify, Fence, and the
// version's evaluations, Eval), the Certification that makes a version
// the mesh's (the votes of a quorum of the admin's voter set over the
// version's Claim: Claim, VoteFor, Certify, VerifyCertified), and the Plan that decides which chunks a
// fetch asks of which source. The name is what both are about: a bundle
// as the chunks it travels in.
//
// Nothing here does I/O, reads a clock or links a transport: times come in
// as arguments, bytes as slices. Package weights carries bundles over QUIC
// and libp2p streams and runs a Plan per fetch; the simulator (package sim)
// builds, signs, parses, verifies and fences the same manifests and runs
// the same Plan in virtual time, without linking quic-go or go-libp2p.
//
// The sentinels keep the prefix "weights:" they had before this code left
// package weights: their text is what commands and logs print.
package chunks
