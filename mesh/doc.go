// Package mesh is what makes devices a mesh: peer identity and the Host
// interface that protocol code runs on (the real one in mesh/p2p wraps
// go-libp2p), membership by invite token and certificate (mesh/member),
// admission, the gossip of batch announcements and the batch pull protocol,
// and the batch wire format (mesh/batch).
package mesh
