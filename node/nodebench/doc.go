// Package nodebench measures a node run as its own process, the clawmesh
// binary started the way a user starts it: Soak puts it under a steady
// open-loop load in front of a scripted upstream and then leaves it idle,
// sampling its resident memory, CPU and scorer counters (`clawmesh bench
// soak`); Idle measures what an idle node costs, alone and as a mesh peer
// (`clawmesh bench mesh`).
//
// The binary is an option (SoakOptions.Binary, IdleOptions.Binary): the
// command passes its own executable. The process's figures come from
// /proc, so both run on Linux only.
package nodebench
