package loss

import (
	"encoding/json"
	"fmt"
	"math"
)

// groupEps keeps group normalisation finite when a group's rewards barely
// differ: (r − mean) / (std + groupEps).
const groupEps = 1e-6

// Baseline is a running mean of recent rewards, subtracted from the reward
// of a sample that has no group to be normalised against. The zero value is
// ready to use (an exponential moving average with DefaultDecay). It is a
// plain value, deterministic, and serialisable with encoding/json so that
// replicated trainer state can hold it; it is not safe for concurrent use.
type Baseline struct {
	// Decay is the weight of the past in the exponential moving average,
	// in (0, 1). Zero or out of range means DefaultDecay (0.9). Set it before
	// the first Observe.
	Decay float64
	// Window, when positive, replaces the moving average by the plain mean
	// of the last Window rewards. Set it before the first Observe.
	Window int

	n      uint64    // rewards observed
	ema    float64   // Σ (1−d)·d^k·r, uncorrected
	weight float64   // Σ (1−d)·d^k = 1 − d^n: the bias correction
	recent []float64 // ring buffer of the last Window rewards
	head   int       // next slot of recent to overwrite once full
}

func (b *Baseline) decay() float64 {
	if b.Decay > 0 && b.Decay < 1 {
		return b.Decay
	}
	return DefaultDecay
}

// Observe adds a reward. NaN and ±Inf rewards are ignored.
func (b *Baseline) Observe(r float64) {
	if !finite(r) {
		return
	}
	b.n++
	if b.Window > 0 {
		if len(b.recent) > b.Window || b.head != 0 && len(b.recent) != b.Window {
			// Window changed after use: keep the newest, oldest first.
			b.recent, b.head = b.window(), 0
		}
		if len(b.recent) < b.Window {
			b.recent = append(b.recent, r)
			return
		}
		b.recent[b.head] = r
		b.head = (b.head + 1) % b.Window
		return
	}
	d := b.decay()
	b.ema = d*b.ema + (1-d)*r
	b.weight = d*b.weight + (1 - d)
}

// Value is the current baseline: 0 before any reward, else the bias-corrected
// moving average (every observed reward weighted by Decay^age, weights
// normalised to sum to one) or the mean of the window.
func (b *Baseline) Value() float64 {
	if b.Window > 0 {
		w := b.window()
		if len(w) == 0 {
			return 0
		}
		var sum float64
		for _, r := range w {
			sum += r
		}
		return sum / float64(len(w))
	}
	if b.weight <= 0 {
		return 0
	}
	return b.ema / b.weight
}

// window returns a copy of the last Window rewards, oldest first (nil when
// Window is not positive).
func (b *Baseline) window() []float64 {
	if b.Window <= 0 || len(b.recent) == 0 {
		return nil
	}
	out := make([]float64, 0, len(b.recent))
	out = append(append(out, b.recent[b.head:]...), b.recent[:b.head]...)
	if len(out) > b.Window {
		out = out[len(out)-b.Window:]
	}
	return out
}

// Count is the number of rewards observed.
func (b *Baseline) Count() uint64 { return b.n }

type baselineJSON struct {
	Decay  float64   `json:"decay,omitempty"`
	Window int       `json:"window,omitempty"`
	N      uint64    `json:"n"`
	EMA    float64   `json:"ema"`
	Weight float64   `json:"weight"`
	Recent []float64 `json:"recent,omitempty"` // oldest first
}

// MarshalJSON encodes the full state; UnmarshalJSON restores a Baseline that
// behaves identically.
func (b Baseline) MarshalJSON() ([]byte, error) {
	j := baselineJSON{Decay: b.Decay, Window: max(b.Window, 0), N: b.n, EMA: b.ema, Weight: b.weight, Recent: b.window()}
	if !(j.Decay > 0 && j.Decay < 1) {
		j.Decay = 0 // same behaviour (DefaultDecay), and always encodable
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote. State that no sequence of
// Observe calls could produce is rejected with ErrBadBaseline.
func (b *Baseline) UnmarshalJSON(data []byte) error {
	var j baselineJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("%w: %w", ErrBadBaseline, err)
	}
	switch {
	case !(j.Decay >= 0 && j.Decay < 1) || j.Window < 0:
		return fmt.Errorf("%w: decay %v, window %d", ErrBadBaseline, j.Decay, j.Window)
	case !finite(j.EMA) || !(j.Weight >= 0 && j.Weight <= 1) || math.Abs(j.EMA) > j.Weight*bigValue:
		return fmt.Errorf("%w: ema %v, weight %v", ErrBadBaseline, j.EMA, j.Weight)
	case len(j.Recent) > j.Window || uint64(len(j.Recent)) > j.N:
		return fmt.Errorf("%w: %d recent rewards, window %d, count %d", ErrBadBaseline, len(j.Recent), j.Window, j.N)
	}
	for _, r := range j.Recent {
		if !finite(r) {
			return fmt.Errorf("%w: recent reward %v", ErrBadBaseline, r)
		}
	}
	*b = Baseline{Decay: j.Decay, Window: j.Window, n: j.N, ema: j.EMA, weight: j.Weight}
	if len(j.Recent) > 0 {
		b.recent = j.Recent
	}
	return nil
}

// RLAdvantages turns one scalar reward per sample into one advantage per
// sample (Binary RL). Samples that share a non-empty group name with at least
// one other sample are normalised within the group: (r − mean) / (std + 1e-6)
// with the population std, and a group whose rewards are all equal gets zeros.
// A sample alone (empty group, a group of one, or groups shorter than
// rewards) gets r − b.Value(), the baseline as it stood before this batch;
// b == nil means a baseline of 0. Afterwards every finite reward is observed
// by b in order, so the advantages of a batch do not depend on the order of
// its samples (the baseline's next state does, through the moving average).
// A NaN or ±Inf reward gets advantage 0 and is neither grouped nor observed.
func RLAdvantages(rewards []float64, groups []string, b *Baseline) []float64 {
	return RLEpisodeAdvantages(rewards, groups, nil, b)
}

// RLEpisodeAdvantages is RLAdvantages where samples may be turns of
// multi-turn episodes: the samples of one group that share a non-empty
// episode name are one episode, whose reward is the mean of its turns'.
// A group's members are its episodes (a sample with no episode name is an
// episode of its own): the episodes' rewards are normalised as
// RLAdvantages normalises samples' (each episode counts once, however many
// turns it took), every turn gets its episode's advantage, and b observes
// each episode's reward once. A group of one episode, or an episode with no
// group, gets its reward − b.Value(). With no episode names it is
// RLAdvantages.
func RLEpisodeAdvantages(rewards []float64, groups, episodes []string, b *Baseline) []float64 {
	out := make([]float64, len(rewards))
	name := func(xs []string, i int) string {
		if i < len(xs) {
			return xs[i]
		}
		return ""
	}
	// Episodes: the finite samples that share a group and an episode name;
	// every other finite sample is an episode alone.
	type key struct{ group, episode string }
	var eps [][]int
	index := map[key]int{}
	for i, r := range rewards {
		if !finite(r) {
			continue
		}
		k := key{name(groups, i), name(episodes, i)}
		if k.episode == "" {
			eps = append(eps, []int{i})
			continue
		}
		e, ok := index[k]
		if !ok {
			e = len(eps)
			index[k] = e
			eps = append(eps, nil)
		}
		eps[e] = append(eps[e], i)
	}
	epReward := make([]float64, len(eps))
	for e, idx := range eps {
		var mean float64
		for k, i := range idx {
			mean += (rewards[i] - mean) / float64(k+1) // running mean: no overflow
		}
		epReward[e] = mean
	}
	members := map[string][]int{}
	for e, idx := range eps {
		if g := name(groups, idx[0]); g != "" {
			members[g] = append(members[g], e)
		}
	}
	var base float64
	if b != nil {
		base = b.Value()
	}
	epAdv := make([]float64, len(eps))
	for e, idx := range eps {
		if g := name(groups, idx[0]); g != "" && len(members[g]) >= 2 {
			continue // normalised below
		}
		epAdv[e] = epReward[e] - base
	}
	for _, es := range members {
		if len(es) < 2 {
			continue
		}
		normalise(epReward, es, epAdv)
	}
	for e, idx := range eps {
		for _, i := range idx {
			out[i] = epAdv[e]
		}
	}
	if b != nil {
		for _, r := range epReward {
			b.Observe(r)
		}
	}
	return out
}

// normalise writes (r − mean)/(std + groupEps) for the rewards at idx.
func normalise(rewards []float64, idx []int, out []float64) {
	lo, hi := rewards[idx[0]], rewards[idx[0]]
	var mean float64
	for k, i := range idx {
		r := rewards[i]
		lo, hi = min(lo, r), max(hi, r)
		mean += (r - mean) / float64(k+1) // running mean: no overflow
	}
	if lo == hi {
		return // std 0: no preference inside the group
	}
	var m2 float64
	for _, i := range idx {
		d := (rewards[i] - mean) / (hi - lo) // scaled: no overflow
		m2 += d * d
	}
	std := math.Sqrt(m2/float64(len(idx))) * (hi - lo)
	for _, i := range idx {
		out[i] = (rewards[i] - mean) / (std + groupEps)
	}
}

// OPDAdvantages is the On-Policy Distillation advantage of one response:
// per token, teacherLogp[t] − oldLogp[t] clipped to [−bound, bound], where
// the teacher log-prob was computed under the hint-enhanced context. bound
// zero, negative or NaN means DefaultOPDBound (2); +Inf means no clipping.
// The result has len(mask) entries (len(oldLogp) when mask is nil, meaning
// every token); a token that is masked, missing from either slice, or has a
// NaN/±Inf log-prob gets 0.
func OPDAdvantages(teacherLogp, oldLogp []float64, mask []bool, bound float64) []float64 {
	if !(bound > 0) {
		bound = DefaultOPDBound
	}
	n := len(mask)
	if mask == nil {
		n = len(oldLogp)
	}
	out := make([]float64, n)
	for t := range out {
		if mask != nil && !mask[t] || t >= len(teacherLogp) || t >= len(oldLogp) {
			continue
		}
		te, od := teacherLogp[t], oldLogp[t]
		if !finite(te) || !finite(od) {
			continue
		}
		out[t] = min(max(te-od, -bound), bound)
	}
	return out
}

// Weights mixes the two signals of the Combined recipe. Both zero (the zero
// value) means DefaultWeights; a NaN or ±Inf weight counts as 0.
type Weights struct{ RL, OPD float64 }

// DefaultWeights weighs the evaluative and the directive signal equally,
// 1 and 1 as OpenClaw-RL does. Under AdamW only their ratio matters: a
// common factor scales every gradient alike, and Adam's update does not
// see it.
var DefaultWeights = Weights{RL: 1, OPD: 1}

// WithDefaults returns DefaultWeights for the zero value, else w with
// non-finite weights set to 0.
func (w Weights) WithDefaults() Weights {
	if w.RL == 0 && w.OPD == 0 {
		return DefaultWeights
	}
	if !finite(w.RL) {
		w.RL = 0
	}
	if !finite(w.OPD) {
		w.OPD = 0
	}
	return w
}

// Combined is the advantage of the combined recipe for one response:
// A_t = w.RL·rlAdv + w.OPD·opd[t] on selected tokens, 0 elsewhere. rlAdv is
// the sample's RL advantage (already baseline- or group-corrected), opd its
// OPDAdvantages (nil when the sample had no hint). A non-finite rlAdv or
// opd[t] contributes 0. The result has len(mask) entries.
func Combined(rlAdv float64, opd []float64, mask []bool, w Weights) []float64 {
	w = w.WithDefaults()
	if !finite(rlAdv) {
		rlAdv = 0
	}
	out := make([]float64, len(mask))
	for t, m := range mask {
		if !m {
			continue
		}
		a := w.RL * rlAdv
		if t < len(opd) && finite(opd[t]) {
			a += w.OPD * opd[t]
		}
		if finite(a) {
			out[t] = a
		}
	}
	return out
}

// Broadcast spreads one scalar advantage over the selected tokens of a
// response: a where mask is true, 0 elsewhere (everywhere if a is NaN/±Inf).
func Broadcast(a float64, mask []bool) []float64 {
	out := make([]float64, len(mask))
	if !finite(a) {
		return out
	}
	for t, m := range mask {
		if m {
			out[t] = a
		}
	}
	return out
}
