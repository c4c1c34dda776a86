// Package modelserver runs the model server a node stands in front of
// when the owner asks the node to run one (`clawmesh node --serve`):
// llama.cpp's llama-server, mlx-lm's mlx_lm.server, or `clawmesh serve`.
//
// Each server process listens on a free 127.0.0.1 port and is reached
// through a small reverse proxy of its own on another loopback port, the
// address the gateway is given: the process may be started again on
// another port, the proxy stays, and it counts the calls in flight. The
// supervisor polls the server's health path, restarts a process that
// exits or stops answering (waiting longer after each failure in a row,
// and giving up, with the end of its log in the error, after a bounded
// number of restarts that never answered), appends its stdout and stderr
// to a log file (Config.Dir/logs), and stops it with SIGTERM, then
// SIGKILL, on Close.
//
// Server.Driver puts adapter versions into service as a swap.Driver, for
// node/adapters.Follower. `clawmesh serve` and mlx_lm.server load
// adapters while they run (swap's drivers for them do the work).
// llama-server applies adapters only when it starts, so versions go
// blue/green: the version is exported as a GGUF adapter, a second process
// is started with --lora, the Target returned names that process as its
// Upstream (each call goes wholly to one process), and the process the
// gateway's route left is stopped once no call has been in flight on it
// for Timing.Settle. Both processes map the same model file. RATIONALE.md
// explains the choices.
package modelserver
