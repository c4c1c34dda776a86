package group_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

var benchTrainers = []mesh.PeerID{"t1", "t2", "t3", "t4", "t5"}

// benchState is a state at v0 with five trainers (speeds 1..5) and n
// pending batches of 1..16 steps from 100 devices, added 64 an entry,
// their steps from the adapters named (none if empty).
func benchState(b *testing.B, ids []core.BatchID, adapters ...string) *State {
	s := New()
	var idx uint64
	apply := func(e *Entry) {
		idx++
		if err := s.Apply(e, 1, idx); err != nil {
			b.Fatal(err)
		}
	}
	apply(&Entry{Genesis: &Genesis{Hash: grouptest.HashN(0)}})
	for i, t := range benchTrainers {
		apply(&Entry{Register: &Trainer{ID: t, Speed: float64(i + 1)}})
	}
	for i := 0; i < len(ids); i += 64 {
		refs := make([]BatchRef, 0, 64)
		for j := i; j < min(i+64, len(ids)); j++ {
			refs = append(refs, BatchRef{ID: ids[j], From: mesh.PeerID(fmt.Sprintf("d%d", j%100)), Steps: 1 + j%16, Adapters: adapters})
		}
		apply(&Entry{At: grouptest.T0.Add(time.Duration(i) * time.Millisecond), Add: refs})
	}
	return s
}

func benchIDs(n int) []core.BatchID {
	ids := make([]core.BatchID, n)
	for i := range ids {
		ids[i] = grouptest.Bid(i)
	}
	return ids
}

func BenchmarkApply(b *testing.B) {
	const ledger = 100_000
	ids := benchIDs(ledger)

	// Add 64 new batches to a ledger growing to 100k batches.
	b.Run("add64", func(b *testing.B) {
		s := benchState(b, nil)
		next, idx := 0, uint64(100)
		refs := make([]BatchRef, 64)
		b.ReportAllocs()
		for b.Loop() {
			if next+64 > ledger {
				b.StopTimer()
				s, next = benchState(b, nil), 0
				b.StartTimer()
			}
			for j := range refs {
				refs[j] = BatchRef{ID: ids[next], From: "d1", Steps: 4, Adapters: []string{"v0"}}
				next++
			}
			idx++
			if err := s.Apply(&Entry{At: grouptest.T0, Add: refs}, 1, idx); err != nil {
				b.Fatal(err)
			}
		}
	})

	// One Start and its Publish on a ledger of 100k batches: 64 batches
	// shared among 5 trainers, or 1024 (a round of one-step batches) all
	// to one trainer.
	for _, c := range []struct {
		name     string
		batches  int
		trainers []mesh.PeerID
	}{{"start+publish64", 64, benchTrainers}, {"start+publish1024", 1024, benchTrainers[:1]}} {
		b.Run(c.name, func(b *testing.B) {
			s := benchState(b, ids, "v0")
			cursor, idx := 0, s.Index
			b.ReportAllocs()
			for b.Loop() {
				if cursor+c.batches > ledger {
					b.StopTimer()
					s, cursor = benchState(b, ids, "v0"), 0
					idx = s.Index
					b.StartTimer()
				}
				shares := map[mesh.PeerID][]core.BatchID{}
				for j := range c.batches {
					t := c.trainers[j%len(c.trainers)]
					shares[t] = append(shares[t], ids[cursor+j])
				}
				cursor += c.batches
				cur, _ := s.Current()
				idx++
				if err := s.Apply(&Entry{At: grouptest.T0, Start: &Start{Round: s.Rounds + 1, Base: cur.Version, Leader: "t1", Shares: shares}}, 1, idx); err != nil {
					b.Fatal(err)
				}
				cs := make([]Contribution, 0, len(shares))
				for _, t := range c.trainers {
					cs = append(cs, Contribution{Trainer: t, Batches: shares[t], Samples: 64})
				}
				idx++
				if err := s.Apply(&Entry{At: grouptest.T0, Publish: &Publish{Round: s.Rounds, Version: cur.Version + 1, Parent: cur.Version, Hash: grouptest.HashN(int(idx)), Publisher: "t1", Contributors: cs}}, 1, idx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkPlan(b *testing.B) {
	// 100k pending batches, 5 live trainers.
	b.Run("pending100k", func(b *testing.B) {
		s := benchState(b, benchIDs(100_000), "v0")
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := s.Plan(grouptest.T0, "t1", benchTrainers); !ok {
				b.Fatal("no plan")
			}
		}
	})
	// A long-lived ledger: 100k batches trained, 1k pending.
	b.Run("trained100k+pending1k", func(b *testing.B) {
		ids := benchIDs(101_000)
		s := benchState(b, ids)
		idx := s.Index
		for i := 0; i < 100_000; i += 1000 {
			idx++
			if err := s.Apply(&Entry{Start: &Start{Round: s.Rounds + 1, Base: uint64(i / 1000), Shares: map[mesh.PeerID][]core.BatchID{"t1": ids[i : i+1000]}}}, 1, idx); err != nil {
				b.Fatal(err)
			}
			idx++
			if err := s.Apply(&Entry{Publish: &Publish{Round: s.Rounds, Version: uint64(i/1000) + 1, Parent: uint64(i / 1000), Hash: grouptest.HashN(i), Contributors: []Contribution{{Trainer: "t1", Batches: ids[i : i+1000]}}}}, 1, idx); err != nil {
				b.Fatal(err)
			}
		}
		if s.Counts[Pending] != 1000 {
			b.Fatalf("counts %v", s.Counts)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := s.Plan(grouptest.T0, "t1", benchTrainers); !ok {
				b.Fatal("no plan")
			}
		}
	})
}
