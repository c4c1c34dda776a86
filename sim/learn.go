package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/clawmesh/clawmesh/trainer/adapter"
)

// The learning model (see the package documentation).
const (
	dim = 32 // the adapter's size in the model
	// lr is the step a round's aggregate takes toward what its batches
	// point at.
	lr = 0.5
	// sampleNoise is the noise of one sample's direction, per coordinate.
	sampleNoise = 0.5
	// hugeFactor is how much larger than an honest delta a malicious
	// trainer's is (and of the opposite sign).
	hugeFactor = 100
	// maxNorm is the cap on a delta's norm under norm clipping: twice the
	// largest honest delta (lr times the distance from the start).
	maxNorm = 2 * lr
)

// Kinds of batch.
const (
	honest    = iota
	flipped   // rewards flipped: the opposite direction
	forged    // forged scores: a random direction
	oversized // refused at intake
	malformed // refused at intake
)

var kindNames = []string{"honest", "flipped", "forged", "oversized", "malformed"}

// Defences, the aggregation and intake rules a run trains with.
type Defences struct {
	Name string `json:"name"`
	// Reverify re-verifies batches' scores before training: flipped and
	// forged batches fail.
	Reverify bool `json:"reverify"`
	// Quota bounds one contributor's steps in a round (group.Config.Quota).
	Quota bool `json:"quota"`
	// Aggregate: "mean" (no defence: the plain sample-weighted mean),
	// "clipped" (adapter.Aggregate's ClippedMean with MaxNorm) or
	// "trimmed" (adapter.Aggregate's TrimmedMean with MaxNorm when Clip).
	Aggregate string `json:"aggregate"`
	Clip      bool   `json:"clip"`
}

// The defence sets the poison scenario compares.
var (
	DefNone     = Defences{Name: "none", Aggregate: "mean"}
	DefReverify = Defences{Name: "reverify", Reverify: true, Aggregate: "mean"}
	DefQuota    = Defences{Name: "quotas", Quota: true, Aggregate: "mean"}
	DefClip     = Defences{Name: "clipping", Aggregate: "clipped", Clip: true}
	DefTrimmed  = Defences{Name: "trimmed-mean", Aggregate: "trimmed"}
	DefAll      = Defences{Name: "all", Reverify: true, Quota: true, Aggregate: "trimmed", Clip: true}
)

// honestQuota is the per-contributor quota with the quota defence: two
// honest batches' steps.
const honestQuota = 2 * honestSteps

// learner is the hidden target and the adapters of the run.
type learner struct {
	target  []float64
	vectors [][]float32 // by version
	hashes  []string
}

func newLearner(r *rand.Rand) *learner {
	t := make([]float64, dim)
	var n float64
	for i := range t {
		t[i] = r.NormFloat64()
		n += t[i] * t[i]
	}
	n = math.Sqrt(n)
	for i := range t {
		t[i] /= n
	}
	l := &learner{target: t}
	l.add(make([]float32, dim))
	return l
}

// add appends the next version's adapter and returns its hash.
func (l *learner) add(v []float32) string {
	s := hashOf(uint64(len(l.vectors)), v)
	l.vectors = append(l.vectors, v)
	l.hashes = append(l.hashes, s)
	return s
}

// hashOf is the hash version n with adapter v has in the lineage.
func hashOf(n uint64, v []float32) string {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, n)
	binary.Write(h, binary.LittleEndian, v)
	return hex.EncodeToString(h.Sum(nil))
}

func norm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// score is how close adapter v is to the target: 1 − ‖v − t‖/‖t‖, at
// least 0 (0 at the start, 1 at the target).
func (l *learner) score(v []float32) float64 {
	var d float64
	for i, x := range v {
		e := float64(x) - l.target[i]
		d += e * e
	}
	return math.Max(0, 1-math.Sqrt(d))
}

// batchDir is where one batch of steps points from adapter base.
func (l *learner) batchDir(r *rand.Rand, base []float32, kind, steps int) []float64 {
	d := make([]float64, dim)
	var dist float64
	for i := range d {
		d[i] = l.target[i] - float64(base[i])
		dist += d[i] * d[i]
	}
	dist = math.Sqrt(dist)
	noise := sampleNoise / math.Sqrt(float64(max(steps, 1)))
	switch kind {
	case flipped:
		for i := range d {
			d[i] = -d[i]
		}
	case forged:
		var n float64
		for i := range d {
			d[i] = r.NormFloat64()
			n += d[i] * d[i]
		}
		n = math.Sqrt(n)
		for i := range d {
			d[i] *= 2 * dist / n
		}
	}
	for i := range d {
		d[i] += noise * r.NormFloat64()
	}
	return d
}

// trainerDelta is a trainer's delta over its batches: lr times the
// steps-weighted mean of their directions; a malicious trainer returns a
// huge one pointing the other way.
func trainerDelta(dirs [][]float64, steps []int, malicious bool) []float32 {
	out := make([]float32, dim)
	var total float64
	for _, s := range steps {
		total += float64(s)
	}
	if total == 0 {
		return out
	}
	for k, d := range dirs {
		wgt := float64(steps[k]) / total
		for i := range out {
			out[i] += float32(lr * wgt * d[i])
		}
	}
	if malicious {
		for i := range out {
			out[i] *= -hugeFactor
		}
	}
	return out
}

// part is one trainer's contribution to a round.
type part struct {
	from    string
	samples int
	delta   []float32
}

// aggregate combines a round's parts under def: the real
// trainer/adapter.Aggregate for clipping and the trimmed mean; with no
// defence the plain sample-weighted mean (Aggregate always clips at the
// round's lower median norm, which is a defence).
func aggregate(parts []part, parent string, def Defences) ([]float32, error) {
	if def.Aggregate == "mean" {
		out := make([]float32, dim)
		var total float64
		for _, p := range parts {
			total += float64(p.samples)
		}
		for _, p := range parts {
			for i := range out {
				out[i] += float32(float64(p.samples) / total * float64(p.delta[i]))
			}
		}
		return out, nil
	}
	cs := make([]adapter.Contribution, len(parts))
	for k, p := range parts {
		cs[k] = adapter.Contribution{From: p.from, Weight: float64(max(p.samples, 1)), Delta: &adapter.Delta{
			Parent:  parent,
			Tensors: []adapter.Tensor{{Name: "lora_A", Shape: []int{dim}, Data: p.delta}},
		}}
	}
	o := adapter.AggOptions{Method: adapter.ClippedMean}
	if def.Aggregate == "trimmed" {
		o.Method = adapter.TrimmedMean
	}
	if def.Clip {
		o.MaxNorm = maxNorm
	}
	d, _, err := adapter.Aggregate(cs, o)
	if err != nil {
		return nil, fmt.Errorf("sim: aggregate: %w", err)
	}
	return d.Tensors[0].Data, nil
}
