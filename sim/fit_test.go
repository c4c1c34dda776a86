package sim

import (
	"math"
	"math/rand/v2"
	"testing"
)

// modelScores is the learning model alone, as the native engine was
// measured: one trainer, each round one batch of samples honest samples,
// over runs targets and noises. It returns the mean score after each round.
func (m model) modelScores(samples, rounds, runs int) []float64 {
	return m.meanScores(m.distances(samples, rounds, runs))
}

// distances is the distance to the target after each round of each run.
func (m model) distances(samples, rounds, runs int) [][]float64 {
	r := rand.New(rand.NewPCG(1, uint64(samples)))
	out := make([][]float64, runs)
	for run := range out {
		l := newLearner(r, m)
		v := l.vectors[0]
		for range rounds {
			dir := l.batchDir(r, v, honest, samples)
			d := l.trainerDelta([][]float64{dir}, []int{samples}, false)
			next := make([]float32, dim)
			var dist float64
			for i := range next {
				next[i] = v[i] + d[i]
				e := float64(next[i]) - l.target[i]
				dist += e * e
			}
			out[run] = append(out[run], math.Sqrt(dist))
			v = next
		}
	}
	return out
}

func (m model) meanScores(dists [][]float64) []float64 {
	mean := make([]float64, len(dists[0]))
	for _, run := range dists {
		for k, d := range run {
			mean[k] += m.scoreAt(d) / float64(len(dists))
		}
	}
	return mean
}

// progress is a measured curve as the model's score: the probability of
// the preferred reply after each round as a share of the way from the
// start's to 1.
func progress(c nativeCurve) []float64 {
	p0 := c.Preferred[0]
	out := make([]float64, 0, len(c.Preferred)-1)
	for _, p := range c.Preferred[1:] {
		out = append(out, (p-p0)/(1-p0))
	}
	return out
}

// fitError is the root mean square distance between the measured curves
// and the model's mean curve at their sizes.
func fitError(curves []nativeCurve, model map[int][]float64) float64 {
	var sum float64
	var n int
	for _, c := range curves {
		m := model[c.Samples]
		for k, p := range progress(c) {
			sum += (p - m[k]) * (p - m[k])
			n++
		}
	}
	return math.Sqrt(sum / float64(n))
}

const fitRuns = 100

// TestLearningFit checks that the learning model's constants are the best
// fit to the native engine's measured curves: over a grid of the step, the
// noise and the gain, none fits them noticeably better, and the fit is
// close. It also reports how the model this one replaced fitted them: the
// adapter moving half its distance to the target each round, with noise of
// 0.5/√samples per coordinate, and a score of 1 − distance.
func TestLearningFit(t *testing.T) {
	nc := loadCurves(t)
	var p0 float64
	for _, c := range nc.Curves {
		if len(c.Preferred) != curveRounds+1 {
			t.Fatalf("a curve of %d points, want %d", len(c.Preferred), curveRounds+1)
		}
		p0 += c.Preferred[0] / float64(len(nc.Curves))
	}
	if l := math.Log(p0 / (1 - p0)); math.Abs(l-startLogit) > 0.05 {
		t.Errorf("startLogit %v, the curves start at %.3f, logit %.3f", startLogit, p0, l)
	}
	curve := func(m model) map[int][]float64 {
		out := map[int][]float64{}
		for _, s := range curveSamples {
			out[s] = m.modelScores(s, curveRounds, fitRuns)
		}
		return out
	}
	got := fitError(nc.Curves, curve(fitted))

	best, bestErr := fitted, got
	for step := 0.05; step <= 0.601; step += 0.025 {
		for noise := 0.0; noise <= 1.501; noise += 0.05 {
			m := model{step: step, noise: noise, startLogit: startLogit}
			dists := map[int][][]float64{}
			for _, s := range curveSamples {
				dists[s] = m.distances(s, curveRounds, fitRuns)
			}
			for g := 3.0; g <= 10.01; g += 0.25 {
				m.gain = g
				mc := map[int][]float64{}
				for _, s := range curveSamples {
					mc[s] = m.meanScores(dists[s])
				}
				if e := fitError(nc.Curves, mc); e < bestErr {
					best, bestErr = m, e
				}
			}
		}
	}

	old := func() map[int][]float64 {
		out := map[int][]float64{}
		for _, s := range curveSamples {
			r := rand.New(rand.NewPCG(1, uint64(s)))
			mean := make([]float64, curveRounds)
			for range fitRuns {
				l := newLearner(r, fitted)
				v := make([]float64, dim)
				for k := range curveRounds {
					var d float64
					for i := range v {
						v[i] += 0.5 * (l.target[i] - v[i] + 0.5/math.Sqrt(float64(s))*r.NormFloat64())
						e := v[i] - l.target[i]
						d += e * e
					}
					mean[k] += math.Max(0, 1-math.Sqrt(d)) / fitRuns
				}
			}
			out[s] = mean
		}
		return out
	}()
	t.Logf("fitted: step %.3f, noise %.2f, gain %.2f: error %.4f; the best on the grid: step %.3f, noise %.2f, gain %.2f: error %.4f; the model before: error %.4f",
		fitted.step, fitted.noise, fitted.gain, got, best.step, best.noise, best.gain, bestErr, fitError(nc.Curves, old))
	for _, s := range curveSamples {
		var meas []float64
		for _, c := range nc.Curves {
			if c.Samples == s {
				p := progress(c)
				if meas == nil {
					meas = make([]float64, len(p))
				}
				for k := range p {
					meas[k] += p[k] / float64(len(curveSeeds))
				}
			}
		}
		t.Logf("%3d samples a round: measured %.2f", s, meas)
		t.Logf("%3d samples a round: model    %.2f", s, fitted.modelScores(s, curveRounds, fitRuns))
		t.Logf("%3d samples a round: before   %.2f", s, old[s])
	}
	if got > bestErr*1.03+0.002 {
		t.Errorf("the constants fit the curves with error %.4f; step %.3f, noise %.2f, gain %.2f fit with %.4f", got, best.step, best.noise, best.gain, bestErr)
	}
	// The model is as close to the measured curves as the measure allows:
	// its mean curves are nearer the measured mean curves than the
	// measured curves are to their mean, seed to seed.
	means := map[int][]float64{}
	for _, c := range nc.Curves {
		m := means[c.Samples]
		if m == nil {
			m = make([]float64, curveRounds)
			means[c.Samples] = m
		}
		for k, p := range progress(c) {
			m[k] += p / float64(len(curveSeeds))
		}
	}
	spread := fitError(nc.Curves, means)
	var off float64
	mc := curve(fitted)
	for _, s := range curveSamples {
		for k := range means[s] {
			off += (means[s][k] - mc[s][k]) * (means[s][k] - mc[s][k])
		}
	}
	off = math.Sqrt(off / float64(len(curveSamples)*curveRounds))
	t.Logf("the model's mean curves are %.4f from the measured mean curves; the measured curves are %.4f from their mean", off, spread)
	if off > spread {
		t.Errorf("the model's mean curves are %.4f from the measured mean curves, more than the measured curves' spread %.4f", off, spread)
	}
}
