package trainer

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// BenchmarkCertifyVersion is what certification adds to a version, with 3
// contributors' deltas of a 1.5M-parameter adapter (a rank-8 LoRA on a
// 21-layer model of hidden size 512, as adapter's BenchmarkAggregate):
// publish, the baseline, is the leader's own work (aggregate, apply,
// write, hash); check is one voter's (the same, plus the deltas'
// signatures checked and the bundle packed and described, and its vote
// signed).
func BenchmarkCertifyVersion(b *testing.B) {
	const layers, hidden, mlp, rank = 21, 512, 1408, 8
	dims := [][2]int{{hidden, hidden}, {hidden, hidden / 4}, {hidden, hidden / 4}, {hidden, hidden},
		{hidden, mlp}, {hidden, mlp}, {mlp, hidden}}
	r := mrand.New(mrand.NewPCG(1, 2))
	fill := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * scale)
		}
		return v
	}
	parent := &adapter.Bundle{Config: []byte(`{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj"]}`)}
	for l := range layers {
		for m, d := range dims {
			parent.Tensors = append(parent.Tensors,
				adapter.Tensor{Name: fmt.Sprintf("base_model.model.layers.%02d.m%d.lora_A.weight", l, m), Shape: []int{rank, d[0]}, Data: fill(rank*d[0], 0.02)},
				adapter.Tensor{Name: fmt.Sprintf("base_model.model.layers.%02d.m%d.lora_B.weight", l, m), Shape: []int{d[1], rank}, Data: fill(d[1]*rank, 0.02)})
		}
	}
	dir := b.TempDir()
	parentDir := filepath.Join(dir, "parent")
	if err := parent.Write(parentDir); err != nil {
		b.Fatal(err)
	}
	parentHash, err := adapter.Hash(parentDir)
	if err != nil {
		b.Fatal(err)
	}
	type signed struct {
		key     ed25519.PublicKey
		batches []core.BatchID
		payload []byte
		sig     []byte
		part    adapter.Contribution
	}
	var subs []signed
	for i := range 3 {
		d := &adapter.Delta{Parent: parentHash}
		for _, t := range parent.Tensors {
			d.Tensors = append(d.Tensors, adapter.Tensor{Name: t.Name, Shape: t.Shape, Data: fill(len(t.Data), 1e-3)})
		}
		payload, err := d.MarshalBinary()
		if err != nil {
			b.Fatal(err)
		}
		pub, key, _ := ed25519.GenerateKey(rand.Reader)
		batches := []core.BatchID{core.BatchID(fmt.Sprintf("%064x", i))}
		claim := deltaClaim("mesh", 1, 0, 8, batches, nil, payload)
		subs = append(subs, signed{key: pub, batches: batches, payload: payload, sig: ed25519.Sign(key, claim),
			part: adapter.Contribution{From: fmt.Sprint("t", i), Weight: 8, Delta: d}})
	}
	_, adminKey, _ := ed25519.GenerateKey(rand.Reader)
	voterPub, voterKey, _ := ed25519.GenerateKey(rand.Reader)
	vs, err := member.NewVoterSet(adminKey, 1, []member.Voter{{Peer: "voter", Key: voterPub}}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	opts := aggOptions(group.Config{MaxNorm: 1}.WithDefaults())
	own := make([]adapter.Contribution, len(subs))
	for i, s := range subs {
		own[i] = s.part
	}
	publish := func(parts []adapter.Contribution, out string) string {
		agg, _, err := adapter.Aggregate(parts, opts)
		if err != nil {
			b.Fatal(err)
		}
		child, err := adapter.Apply(parent, agg)
		if err != nil {
			b.Fatal(err)
		}
		if err := child.Write(out); err != nil {
			b.Fatal(err)
		}
		h, err := adapter.Hash(out)
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	n := 0
	b.Run("publish", func(b *testing.B) {
		for b.Loop() {
			n++
			publish(own, filepath.Join(dir, fmt.Sprint("p", n)))
		}
	})
	b.Run("check", func(b *testing.B) {
		for b.Loop() {
			n++
			parts := make([]adapter.Contribution, len(subs))
			for i, s := range subs {
				if !ed25519.Verify(s.key, deltaClaim("mesh", 1, 0, 8, s.batches, nil, s.payload), s.sig) {
					b.Fatal("a delta's signature")
				}
				d, err := adapter.UnmarshalDelta(s.payload, adapter.Limits{})
				if err != nil {
					b.Fatal(err)
				}
				parts[i] = adapter.Contribution{From: s.part.From, Weight: s.part.Weight, Delta: d}
			}
			out := filepath.Join(dir, fmt.Sprint("c", n))
			h := publish(parts, out)
			bundle, err := weights.Pack(out)
			if err != nil {
				b.Fatal(err)
			}
			m, err := chunks.NewManifest(bundle)
			if err != nil {
				b.Fatal(err)
			}
			m.AdapterHash, m.ParentHash = h, parentHash
			ed25519.Sign(voterKey, m.Claim(vs))
		}
	})
}
