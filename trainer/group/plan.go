package group

import (
	"cmp"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// Stale lists the pending batches every step of which came from an adapter
// more than MaxLag versions older than the current one: the leader refuses
// them (Refuse entries) before it plans a round.
func (s *State) Stale() []Refusal {
	cur, ok := s.Current()
	if !ok {
		return nil
	}
	maxLag := s.Config.WithDefaults().MaxLag
	var out []Refusal
	for _, b := range s.sortedBatches(0, func(b *Batch) bool { return b.Status == Pending && StaleBatch(b, cur.Version, maxLag) }) {
		out = append(out, Refusal{ID: b.ID, Reason: ReasonStale})
	}
	return out
}

// Plan decides the next round: which pending batches it trains and which
// live trainer trains each. It takes pending batches oldest first, at most
// Quota steps from one device and RoundSteps in all (a batch larger than a
// limit still goes alone, so nothing starves), and shares them among the
// live registered trainers that are not benched, in proportion to their
// measured speed. Task sets' prompts (ledger lines with Task set, Group
// steps each) mix in: each set gives its oldest pending prompts, at most
// PerRound; while device batches are pending too, the prompts take at most
// Ratio of RoundSteps and the batches the rest. ok=false when there is no
// round to run: a round is open, no version exists, no batch is pending,
// no registered trainer is live and unbenched, or (with no task prompt
// ready) fewer than MinRoundSteps steps are pending and the oldest pending
// batch was added less than RoundWait before now. Plan is pure: the same
// state and input give the same round.
func (s *State) Plan(now time.Time, leader mesh.PeerID, live []mesh.PeerID) (*Start, bool) {
	cur, ok := s.Current()
	if !ok || s.Round != nil {
		return nil, false
	}
	var ts []*Trainer
	for _, p := range live {
		if _, benched := s.Benched[p]; benched {
			continue // a spot check caught it: no share until cleared
		}
		if t, ok := s.Trainers[p]; ok && !slices.ContainsFunc(ts, func(x *Trainer) bool { return x.ID == p }) {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return nil, false
	}
	slices.SortFunc(ts, func(a, b *Trainer) int { return cmp.Compare(a.ID, b.ID) })

	c := s.Config.WithDefaults()
	pending := s.sortedBatches(s.Counts[Pending], func(b *Batch) bool { return b.Status == Pending })
	livePending := slices.ContainsFunc(pending, func(b *Batch) bool { return b.Task == "" && !StaleBatch(b, cur.Version, c.MaxLag) })

	// Task prompts first: each set's oldest pending prompts, at most
	// PerRound, and while live batches wait, at most the set's Ratio of
	// the round's steps (one prompt at least).
	var take []*Batch
	taskSteps := 0
	maxRatio := 0.0
	for _, ts := range s.SortedTaskSets() {
		n := ts.PerRound
		if livePending {
			n = min(n, max(1, int(ts.Ratio*float64(c.RoundSteps))/max(ts.Group, 1)))
		}
		for _, b := range pending {
			if n == 0 {
				break
			}
			if b.Task == ts.Hash {
				take = append(take, b)
				taskSteps += max(b.Steps, 1)
				n--
			}
		}
		if taskSteps > 0 {
			maxRatio = max(maxRatio, ts.Ratio)
		}
	}
	budget := c.RoundSteps
	if taskSteps > 0 {
		budget = max(1, int((1-maxRatio)*float64(c.RoundSteps)))
	}
	perDevice := map[mesh.PeerID]int{}
	total := 0
	for _, b := range pending {
		if b.Task != "" || StaleBatch(b, cur.Version, c.MaxLag) {
			continue
		}
		// A batch over a limit goes alone; the comparisons are written so
		// that no sum of steps can overflow.
		n := max(b.Steps, 1)
		if perDevice[b.From] > 0 && n > c.Quota-perDevice[b.From] {
			continue
		}
		if total > 0 && n > budget-total {
			continue
		}
		perDevice[b.From] += n
		total += n
		take = append(take, b)
	}
	if taskSteps == 0 && c.MinRoundSteps > 1 {
		// Gather: wait for MinRoundSteps, or until the oldest pending
		// batch has waited RoundWait.
		steps, oldest := 0, time.Time{}
		for _, b := range pending {
			if b.Task == "" && !StaleBatch(b, cur.Version, c.MaxLag) {
				steps += min(max(b.Steps, 1), c.MinRoundSteps)
				if oldest.IsZero() || b.Added.Before(oldest) {
					oldest = b.Added
				}
			}
			if steps >= c.MinRoundSteps {
				break
			}
		}
		if steps < c.MinRoundSteps && now.Sub(oldest) < c.RoundWait {
			return nil, false
		}
	}
	total += taskSteps
	if len(take) == 0 {
		return nil, false
	}

	// Largest batches first, each to the trainer furthest below its
	// speed-proportional target.
	var speed float64
	for _, t := range ts {
		speed += t.Speed
	}
	slices.SortStableFunc(take, func(a, b *Batch) int { return cmp.Compare(b.Steps, a.Steps) })
	load := make([]float64, len(ts))
	shares := map[mesh.PeerID][]core.BatchID{}
	for _, b := range take {
		best, bestGap := 0, 0.0
		for i, t := range ts {
			gap := float64(total)*t.Speed/speed - load[i]
			if i == 0 || gap > bestGap {
				best, bestGap = i, gap
			}
		}
		load[best] += float64(max(b.Steps, 1))
		shares[ts[best].ID] = append(shares[ts[best].ID], b.ID)
	}
	for t := range shares {
		slices.Sort(shares[t])
	}
	return &Start{Round: s.Rounds + 1, Base: cur.Version, Leader: leader, Deadline: now.Add(c.Deadline), Shares: shares}, true
}

// Share is trainer t's share of the open round, nil if it has none.
func (s *State) Share(t mesh.PeerID) []core.BatchID {
	if s.Round == nil {
		return nil
	}
	return s.Round.Shares[t]
}
