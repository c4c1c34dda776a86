package raftstore

import (
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
)

// BenchmarkStoreLogs appends batches of 512-byte entries, for each store in
// impls (raft.InmemStore is the baseline), compacting the oldest entries
// every compactEvery entries as raft does after a snapshot, so that a long
// run holds a bounded log.
func BenchmarkStoreLogs(b *testing.B) {
	const (
		entryBytes   = 512
		compactEvery = 1 << 14
	)
	data := make([]byte, entryBytes)
	for _, impl := range impls {
		for _, n := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/batch=%d", impl.name, n), func(b *testing.B) {
				s := impl.open(b)
				b.SetBytes(int64(n * entryBytes))
				next, compacted := uint64(1), uint64(0)
				for b.Loop() {
					logs := make([]*raft.Log, n)
					for i := range logs {
						logs[i] = &raft.Log{Index: next, Term: 1, Data: data}
						next++
					}
					if err := s.StoreLogs(logs); err != nil {
						b.Fatal(err)
					}
					if next-compacted > 2*compactEvery {
						if err := s.DeleteRange(compacted+1, compacted+compactEvery); err != nil {
							b.Fatal(err)
						}
						compacted += compactEvery
					}
				}
			})
		}
	}
}

// BenchmarkGetLog reads 512-byte entries back from a log of 4096.
func BenchmarkGetLog(b *testing.B) {
	const entries = 4096
	data := make([]byte, 512)
	for _, impl := range impls {
		b.Run(impl.name, func(b *testing.B) {
			s := impl.open(b)
			logs := make([]*raft.Log, entries)
			for i := range logs {
				logs[i] = &raft.Log{Index: uint64(i + 1), Term: 1, Data: data}
			}
			if err := s.StoreLogs(logs); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(512)
			var l raft.Log
			i := uint64(0)
			for b.Loop() {
				if err := s.GetLog(i%entries+1, &l); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
