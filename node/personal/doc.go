// Package personal keeps a device's personal adapter: one trained on the
// device's own steps only, stacked on the mesh's shared version, so that
// the device serves base + shared + personal as one adapter (model/peft
// stacks them; node/adapters loads the stack and rebuilds it when either
// part changes).
//
// A Manager decides when a personal version is trained (mode local: while
// the agent has been idle a while, and a call of the agent stops the job;
// mode mesh: the same, the job going to a trainer the user trusts), picks
// its steps (the device's scored steps with a signal since the last
// version, less a fixed share held back by a hash of their id to score
// each version on), hands the job to a Trainer (the node never trains in
// its own process), and keeps the versions (Dir/pN), the stacks
// (Dir/stacked/vM-pN) and its state. Reset forgets the adapter; SetEnabled
// turns it off and on. RATIONALE.md says what was traded.
package personal
