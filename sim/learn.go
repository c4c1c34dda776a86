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

// The learning model (see the package documentation). Its constants are
// fitted to the native engine's measured learning curves
// (testdata/native_curves.json; TestLearningFit checks the fit).
const (
	dim = 32 // the adapter's size in the model
	// stepLen is how far one round's update moves the adapter: AdamW moves
	// every weight by about the learning rate whatever the gradient's size,
	// so a round moves the adapter a fixed distance, along its batches'
	// mean direction. The target is at distance 1 from the start.
	stepLen = 0.3
	// sampleNoise is the noise of one sample's direction, per coordinate,
	// against a direction of length 1.
	sampleNoise = 0.85
	// gain is the logit of the preferred reply gained over the whole way
	// to the target, and startLogit its logit at the start (the measured
	// curves' mean probability before training, 0.248).
	gain       = 9.25
	startLogit = -1.11
	// hugeFactor is how much larger than an honest delta a malicious
	// trainer's is (and of the opposite sign).
	hugeFactor = 100
	// maxNorm is the cap on a delta's norm under norm clipping: twice an
	// honest delta's.
	maxNorm = 2 * stepLen
)

// model is the learning model's constants; a run learns with fitted.
type model struct {
	step, noise, gain, startLogit float64
}

var fitted = model{step: stepLen, noise: sampleNoise, gain: gain, startLogit: startLogit}

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
	m       model
	target  []float64
	vectors [][]float32 // by version
	hashes  []string
}

func newLearner(r *rand.Rand, m model) *learner {
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
	l := &learner{m: m, target: t}
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

// score is how far adapter v has learnt: the probability that the
// policy's reply is the preferred one, σ(startLogit + gain·(1 − ‖v − t‖)),
// as a share of the way from the start's to 1 (0 at the start, 1 past the
// target's logit), at least 0.
func (l *learner) score(v []float32) float64 {
	var d float64
	for i, x := range v {
		e := float64(x) - l.target[i]
		d += e * e
	}
	return l.m.scoreAt(math.Sqrt(d))
}

// scoreAt is the score of an adapter at distance d from the target.
func (m model) scoreAt(d float64) float64 {
	p0 := sigmoid(m.startLogit)
	p := sigmoid(m.startLogit + m.gain*(1-d))
	return math.Max(0, (p-p0)/(1-p0))
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// batchDir is where one batch of steps points from adapter base: toward the
// target (a direction of length 1) plus noise of sampleNoise/√steps per
// coordinate; with flipped rewards the other way, with forged scores in a
// random direction twice as long.
func (l *learner) batchDir(r *rand.Rand, base []float32, kind, steps int) []float64 {
	d := make([]float64, dim)
	var dist float64
	for i := range d {
		d[i] = l.target[i] - float64(base[i])
		dist += d[i] * d[i]
	}
	dist = math.Sqrt(dist)
	for i := range d {
		if dist > 0 {
			d[i] /= dist
		}
	}
	noise := l.m.noise / math.Sqrt(float64(max(steps, 1)))
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
			d[i] *= 2 / n
		}
	}
	for i := range d {
		d[i] += noise * r.NormFloat64()
	}
	return d
}

// trainerDelta is a trainer's delta over its batches: stepLen along the
// steps-weighted mean of their directions; a malicious trainer returns a
// huge one pointing the other way.
func (l *learner) trainerDelta(dirs [][]float64, steps []int, malicious bool) []float32 {
	out := make([]float32, dim)
	var total float64
	for _, s := range steps {
		total += float64(s)
	}
	if total == 0 {
		return out
	}
	mean := make([]float64, dim)
	for k, d := range dirs {
		wgt := float64(steps[k]) / total
		for i := range mean {
			mean[i] += wgt * d[i]
		}
	}
	var n float64
	for _, x := range mean {
		n += x * x
	}
	if n = math.Sqrt(n); n == 0 {
		return out
	}
	f := l.m.step / n
	if malicious {
		f *= -hugeFactor
	}
	for i := range out {
		out[i] = float32(f * mean[i])
	}
	return out
}

// part is one trainer's contribution to a round.
type part struct {
	from    string
	trainer int
	samples int
	delta   []float32
	forged  bool // a rogue volunteer's (trust scenario)
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
