package adapter

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/tokenizer"
)

var ctx = context.Background()

// The tiny model every test engine shares: same base weights, same
// adapter shape, so any engine can load any other's adapter.
const (
	modelSeed   = 11
	adapterSeed = 5
)

var tiny = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.Tiny(tokenizer.TinyOptions{})
})

// newEngine builds a tiny native engine with a fresh adapter (rank 4 on
// the q, v and down projections unless lc says otherwise).
func newEngine(t testing.TB, lc native.LoRAConfig) *native.Engine {
	t.Helper()
	tok, err := tiny()
	if err != nil {
		t.Fatal(err)
	}
	if lc.Rank == 0 {
		lc = native.LoRAConfig{Rank: 4, Targets: []string{"q_proj", "v_proj", "down_proj"}}
	}
	e, err := native.NewTiny(native.TinyConfig(tok.VocabSize()), modelSeed, native.Options{Seed: adapterSeed, LoRA: lc, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// texts are what the contributors of a round train on, one each.
var texts = []string{
	"The cat sat on the mat and looked at the door.",
	"Please open the file and read the first line.",
	"A quick brown fox jumps over the lazy dog.",
	"Run the tests again, then commit the change.",
	"The weather is fine today; we will walk to the river.",
}

// train takes steps optimizer steps on text, pushing its tokens after the
// first two up with advantage adv.
func train(t testing.TB, e *native.Engine, text string, adv float32, steps int) {
	t.Helper()
	tok, _ := tiny()
	ids := tok.Encode(text)
	s := engine.TrainSample{Tokens: ids, LossMask: make([]bool, len(ids)), Advantages: make([]float32, len(ids))}
	for i := 2; i < len(ids); i++ {
		s.LossMask[i], s.Advantages[i] = true, adv
	}
	for range steps {
		if _, err := e.TrainStep(ctx, []engine.TrainSample{s}, engine.Recipe{LR: 1e-2}); err != nil {
			t.Fatal(err)
		}
	}
}

// export writes e's adapter to a new directory and reads it back.
func export(t testing.TB, e *native.Engine) (string, *Bundle) {
	t.Helper()
	dir := t.TempDir()
	if err := e.ExportAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	b, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, b
}

// round is one round of real training: the parent version, and for each
// text a contributor that loaded the parent, trained on the text and
// exported its child.
type round struct {
	parentDir string
	parent    *Bundle
	children  []*Bundle
	deltas    []*Delta
}

func newRound(t testing.TB, e *native.Engine, steps int) *round {
	t.Helper()
	r := &round{}
	r.parentDir, r.parent = export(t, e)
	for i, text := range texts {
		if err := e.LoadAdapter(ctx, r.parentDir); err != nil {
			t.Fatal(err)
		}
		train(t, e, text, float32(1+i%2), steps)
		_, child := export(t, e)
		d, err := Diff(child, r.parent)
		if err != nil {
			t.Fatal(err)
		}
		r.children = append(r.children, child)
		r.deltas = append(r.deltas, d)
	}
	if err := e.LoadAdapter(ctx, r.parentDir); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *round) parts() []Contribution {
	ps := make([]Contribution, len(r.deltas))
	for i, d := range r.deltas {
		ps[i] = Contribution{From: "trainer-" + string(rune('a'+i)), Weight: float64(8 + 4*i), Delta: d}
	}
	return ps
}

// sameBits reports whether two tensor lists are equal bit for bit.
func sameBits(a, b []Tensor) bool {
	return slices.EqualFunc(a, b, func(x, y Tensor) bool {
		return x.Name == y.Name && slices.Equal(x.Shape, y.Shape) &&
			slices.EqualFunc(x.Data, y.Data, func(p, q float32) bool { return math.Float32bits(p) == math.Float32bits(q) })
	})
}

// distance is the global L2 distance between two deltas of one layout.
func distance(a, b *Delta) float64 {
	var s float64
	for i, t := range a.Tensors {
		for j, x := range t.Data {
			d := float64(x) - float64(b.Tensors[i].Data[j])
			s += d * d
		}
	}
	return math.Sqrt(s)
}

// scaled returns d with every value multiplied by f.
func scaled(d *Delta, f float32) *Delta {
	out := &Delta{Parent: d.Parent}
	for _, t := range d.Tensors {
		v := slices.Clone(t.Data)
		for j := range v {
			v[j] *= f
		}
		out.Tensors = append(out.Tensors, Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Data: v})
	}
	return out
}

// randomLike returns a delta of d's layout with values uniform in ±mag.
func randomLike(d *Delta, mag float64, seed uint64) *Delta {
	r := rand.New(rand.NewPCG(seed, 1))
	out := &Delta{Parent: d.Parent}
	for _, t := range d.Tensors {
		v := make([]float32, len(t.Data))
		for j := range v {
			v[j] = float32((2*r.Float64() - 1) * mag)
		}
		out.Tensors = append(out.Tensors, Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Data: v})
	}
	return out
}

// logprobs is e's policy on a fixed probe.
func logprobs(t testing.TB, e engine.Engine) []float32 {
	t.Helper()
	tok, _ := tiny()
	lp, err := e.Logprobs(ctx, [][]int{tok.Encode("The cat opened the file and read the weather.")}, false)
	if err != nil {
		t.Fatal(err)
	}
	return lp[0]
}

// nativeDefault asks newEngine for its default adapter shape.
var nativeDefault native.LoRAConfig
