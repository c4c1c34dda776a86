// Package raftnet carries hashicorp/raft's transport over the mesh's streams.
package raftnet

import "github.com/hashicorp/raft"

var _ raft.StreamLayer
