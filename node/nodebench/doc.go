// Package nodebench measures a node run as its own process, the clawmesh
// binary started the way a user starts it: Soak puts it under load in front
// of a scripted upstream (clients in a closed loop, or a steady open-loop
// rate) and then leaves it idle, sampling its resident memory, CPU and
// scorer counters, against the goal of a bounded and flat RSS (`clawmesh
// bench soak`); Footprint measures a fresh node left idle after a few
// calls, its RSS and its data and cache directories against their goals
// (`clawmesh bench idle`); Idle measures what an idle node costs, alone and
// as a mesh peer (`clawmesh bench mesh`).
//
// The binary is an option (SoakOptions.Binary, FootprintOptions.Binary,
// IdleOptions.Binary): the command passes its own executable. The
// process's figures come from /proc, so all three run on Linux only.
package nodebench
