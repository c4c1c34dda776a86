package memnet_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/memnet"
)

// BenchmarkStream measures a stream's throughput (MB/s) between two hosts,
// the writer writing chunks of the given size, the reader reading 256 KiB
// at a time, through the default 256 KiB buffer.
func BenchmarkStream(b *testing.B) {
	for _, chunk := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("write=%dKiB", chunk>>10), func(b *testing.B) {
			n := newNet(b, memnet.Options{})
			src, dst := newHost(b, n, nil), newHost(b, n, nil)
			got := make(chan int64, 1)
			dst.Handle("/bench/sink", func(s mesh.Stream) {
				buf := make([]byte, 256<<10)
				var total int64
				for {
					k, err := s.Read(buf)
					total += int64(k)
					if err != nil {
						break
					}
				}
				s.Close()
				got <- total
			})
			connect(b, src, dst)
			s := open(b, src, dst.ID(), "/bench/sink")
			data := make([]byte, chunk)
			b.SetBytes(int64(chunk))
			b.ResetTimer()
			for range b.N {
				if _, err := s.Write(data); err != nil {
					b.Fatal(err)
				}
			}
			s.CloseWrite()
			if total := <-got; total != int64(b.N*chunk) {
				b.Fatalf("read %d bytes of %d", total, b.N*chunk)
			}
		})
	}
}

// BenchmarkGossip measures gossip messages (256 bytes) published per
// second: to one subscriber, and on a full mesh of 8 hosts where every
// host forwards what it gets (each message reaches the 7 others once,
// however many copies are sent). The publisher publishes 100 messages,
// then waits for every subscriber to have them all, so that no Topic's
// buffer overflows.
func BenchmarkGossip(b *testing.B) {
	const window = 100
	for _, hosts := range []int{2, 8} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			n := newNet(b, memnet.Options{})
			hs := make([]*memnet.Host, hosts)
			for i := range hs {
				hs[i] = newHost(b, n, nil)
				for _, prev := range hs[:i] {
					connect(b, hs[i], prev)
				}
			}
			pub, err := hs[0].Join("bench")
			if err != nil {
				b.Fatal(err)
			}
			total := int64(b.N)
			reached := make(chan struct{}, hosts) // a subscriber has the window
			var delivered atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for _, h := range hs[1:] {
				topic, err := h.Join("bench")
				if err != nil {
					b.Fatal(err)
				}
				go func() {
					var got int64
					for {
						if _, err := topic.Next(ctx); err != nil {
							return
						}
						got++
						delivered.Add(1)
						if got%window == 0 || got == total {
							reached <- struct{}{}
						}
					}
				}()
			}
			msg := make([]byte, 256)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				binary.LittleEndian.PutUint64(msg, uint64(i))
				if err := pub.Publish(ctx, msg); err != nil {
					b.Fatal(err)
				}
				if (i+1)%window != 0 && i+1 != b.N {
					continue
				}
				for range hosts - 1 {
					select {
					case <-reached:
					case <-time.After(waitFor):
						b.Fatalf("%d deliveries of %d messages to %d subscribers", delivered.Load(), i+1, hosts-1)
					}
				}
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(delivered.Load())/elapsed.Seconds(), "deliveries/s")
		})
	}
}
