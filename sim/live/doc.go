// Package live runs the demo's mesh, real and whole, on one machine
// (`clawmesh demo`): a model server per simulated user, a node in front of
// each, joined into one mesh with invite tokens, and three trainers in a
// raft group. The users (package scenario) talk to their nodes over HTTP
// with the OpenAI wire protocol and react to the replies; the nodes record,
// score, scrub and ship the steps; the trainers train rounds and publish
// adapter versions, which the nodes fetch and hot-swap into their model
// servers. Half way, the trainers' leader is stopped.
//
// Run runs the demo's recipes and returns its Report: the personalization
// score (scenario.Score) before training and after every version, measured
// on replies sampled from the model servers themselves. BaseModel makes
// the model every recipe starts from: the tiny model taught to follow a
// hint in its context, so that on-policy distillation has a teacher.
// Loop times the whole loop on the same mesh with one user: from a
// version's commit to the first reply a node serves with it (`clawmesh
// bench weights`).
//
// Everything runs in this process, on loopback, in temporary directories;
// the package is the real code's, with no simulated time or network (for
// those, see package sim).
package live
