// Package harness runs trainer peers for tests and `clawmesh bench`:
// clusters of one device and n trainers, on loopback (libp2p hosts on
// 127.0.0.1) or in memory (the simulated network mesh/memnet), whose
// trainers can be killed, isolated and restarted; and the benchmarks of
// the mesh's batch path (BenchMesh), the trainers' group (BenchGroup) and
// a task set's rollouts (BenchRollouts), and what a compressed delta
// between consecutive adapter versions would save (BenchDelta).
package harness
