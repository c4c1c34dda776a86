package raftnet

import (
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
)

// entrySize is the size of a benchmark command: a small replicated
// record, as the trainer's are (a batch assigned, a version published).
const entrySize = 256

// pipelineDepth is how many applies the pipelined benchmarks keep in
// flight.
const pipelineDepth = 64

// BenchmarkApply measures Apply on the leader of three raft servers on
// libp2p hosts on loopback, over QUIC and over TCP (yamux): serial is one
// apply at a time (ns/op is a commit's latency), pipelined keeps
// pipelineDepth in flight (entries/s is the throughput). Compare with
// BenchmarkApplyTCP, raft's own TCP transport, from the same run.
func BenchmarkApply(b *testing.B) {
	for _, tc := range []struct{ name, listen string }{
		{"quic", "/ip4/127.0.0.1/udp/0/quic-v1"},
		{"tcp", "/ip4/127.0.0.1/tcp/0"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			nodes := cluster(b, 3, quietLogger(b), []string{tc.listen})
			benchApply(b, nodes)
		})
	}
}

// BenchmarkApplyTCP is BenchmarkApply's baseline: the same three servers
// on raft.NewTCPTransport, on 127.0.0.1.
func BenchmarkApplyTCP(b *testing.B) {
	log := quietLogger(b)
	var nodes []*node
	for i := range 3 {
		trans, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, DefaultMaxPool, DefaultTimeout, HCLog(log))
		if err != nil {
			b.Fatalf("NewTCPTransport: %v", err)
		}
		nodes = append(nodes, startRaft(b, raft.ServerID(fmt.Sprintf("n%d", i)), trans, log))
	}
	bootstrap(b, nodes)
	benchApply(b, nodes)
}

func benchApply(b *testing.B, nodes []*node) {
	leader := waitLeader(b, nodes)
	data := make([]byte, entrySize)
	b.Run("serial", func(b *testing.B) {
		b.SetBytes(entrySize)
		b.ReportAllocs()
		for range b.N {
			if err := leader.raft.Apply(data, 0).Error(); err != nil {
				b.Fatalf("Apply: %v", err)
			}
		}
		reportRate(b)
	})
	b.Run("pipelined", func(b *testing.B) {
		b.SetBytes(entrySize)
		b.ReportAllocs()
		var inflight [pipelineDepth]raft.ApplyFuture
		for i := range b.N {
			if f := inflight[i%pipelineDepth]; f != nil {
				if err := f.Error(); err != nil {
					b.Fatalf("Apply: %v", err)
				}
			}
			inflight[i%pipelineDepth] = leader.raft.Apply(data, 0)
		}
		// The last ones are waited for inside the timing.
		for _, f := range inflight {
			if f != nil {
				if err := f.Error(); err != nil {
					b.Fatalf("Apply: %v", err)
				}
			}
		}
		reportRate(b)
	})
}

func reportRate(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "entries/s")
	}
}
