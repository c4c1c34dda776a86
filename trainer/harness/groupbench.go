package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// GroupBenchOptions configure BenchGroup; the zero value of each field
// means its default.
type GroupBenchOptions struct {
	// Kills is how many times the leader is killed (default 10).
	Kills int
	// Trainers in the failover group (default 3).
	Trainers int
	// Timing is the group's raft timing (default: the trainer's, tuned for
	// a WAN-ish mesh).
	Timing trainer.Timing
	// Rounds measured for the overhead, each of RoundBatches batches of
	// BatchSteps steps, trained by a lone trainer (defaults 5, 8, 16).
	Rounds, RoundBatches, BatchSteps int
}

func (o GroupBenchOptions) withDefaults() GroupBenchOptions {
	if o.Kills == 0 {
		o.Kills = 10
	}
	if o.Trainers == 0 {
		o.Trainers = 3
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.RoundBatches == 0 {
		o.RoundBatches = 8
	}
	if o.BatchSteps == 0 {
		o.BatchSteps = 16
	}
	return o
}

// Goals of the trainers' group.
const (
	// FailoverGoal bounds the p99 time from a leader's death to a new
	// leader.
	FailoverGoal = 3 * time.Second
	// OverheadGoal bounds a round's overhead against its pure training
	// time.
	OverheadGoal = 0.10
)

// GroupBenchResult is what BenchGroup measured.
type GroupBenchResult struct {
	Trainers int            `json:"trainers"`
	Timing   trainer.Timing `json:"timing"`
	Kills    int            `json:"kills"`
	Failover []float64      `json:"failover_seconds"`
	P50, P99 time.Duration  `json:"-"`
	P50s     float64        `json:"failover_p50_seconds"`
	P99s     float64        `json:"failover_p99_seconds"`
	// Rounds: each round's wall time (start to commit) and its training
	// time (the trainer's), in seconds, and the overhead
	// (wall − training) / training over them all.
	Rounds   []RoundTime `json:"rounds"`
	Overhead float64     `json:"overhead"`
}

// RoundTime is one measured round.
type RoundTime struct {
	Round    uint64  `json:"round"`
	Steps    int     `json:"steps"`
	Wall     float64 `json:"wall_seconds"`
	Training float64 `json:"training_seconds"`
}

// BenchGroup measures, on loopback, how long the trainers' group takes to
// elect a new leader when its leader is killed (repeatedly: each killed
// trainer restarts and catches up before the next kill), and how much a
// round adds to the training it runs (a lone trainer on the tiny model).
func BenchGroup(ctx context.Context, o GroupBenchOptions) (*GroupBenchResult, error) {
	o = o.withDefaults()
	if o.Kills < 1 || o.Trainers < 2 || o.Rounds < 1 || o.RoundBatches < 1 || o.BatchSteps < 1 {
		return nil, errors.New("trainer: bench: kills, rounds, batches and steps must be positive, trainers at least 2")
	}
	res := &GroupBenchResult{Trainers: o.Trainers, Timing: o.Timing.WithDefaults(), Kills: o.Kills}
	if err := benchFailover(ctx, o, res); err != nil {
		return nil, err
	}
	if err := benchRounds(ctx, o, res); err != nil {
		return nil, err
	}
	return res, nil
}

func benchFailover(ctx context.Context, o GroupBenchOptions, res *GroupBenchResult) error {
	c, err := NewCluster(ctx, ClusterOptions{Trainers: o.Trainers, Timing: o.Timing})
	if err != nil {
		return err
	}
	defer c.Close()
	settled := func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		if len(st.Voters) != o.Trainers {
			return false
		}
		for k := range c.Len() {
			t := c.Trainer(k)
			if t == nil || t.Status().Leader != st.Leader {
				return false
			}
		}
		return true
	}
	for range o.Kills {
		if err := c.WaitUntil(ctx, 2*time.Minute, "settled group", settled); err != nil {
			return err
		}
		li, _ := c.Leader()
		start := time.Now()
		if err := c.Kill(li); err != nil {
			return err
		}
		if err := c.WaitUntil(ctx, time.Minute, "new leader", func() bool { _, ok := c.Leader(); return ok }); err != nil {
			return err
		}
		res.Failover = append(res.Failover, time.Since(start).Seconds())
		if err := c.Start(ctx, li); err != nil {
			return err
		}
	}
	s := slices.Sorted(slices.Values(res.Failover))
	res.P50s, res.P99s = quantile(s, 0.5), quantile(s, 0.99)
	res.P50, res.P99 = time.Duration(res.P50s*float64(time.Second)), time.Duration(res.P99s*float64(time.Second))
	return nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

func benchRounds(ctx context.Context, o GroupBenchOptions, res *GroupBenchResult) error {
	// A long deadline: the round closes when its one share is in.
	c, err := NewCluster(ctx, ClusterOptions{Trainers: 1, Timing: o.Timing, Group: group.Config{RoundSteps: o.RoundBatches * o.BatchSteps}})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.WaitUntil(ctx, 2*time.Minute, "genesis", func() bool {
		t := c.Trainer(0)
		return t != nil && t.Status().Versions == 1
	}); err != nil {
		return err
	}
	// Every batch at once: rounds take RoundBatches of them each (the
	// first, started as they arrive, may take fewer).
	total := o.Rounds * o.RoundBatches
	for k := range total {
		p, err := SyntheticBatch(uint64(1000+k), o.BatchSteps, "")
		if err != nil {
			return err
		}
		c.Ship(p)
	}
	if err := c.WaitUntil(ctx, 10*time.Minute, "every batch trained", func() bool {
		return c.Trainer(0).Status().Batches.Trained == total
	}); err != nil {
		return err
	}
	var wall, train float64
	for _, v := range c.Trainer(0).Lineage()[1:] {
		if len(v.Contributors) == 0 || v.Started.IsZero() {
			continue
		}
		rt := RoundTime{Round: v.Round, Wall: v.At.Sub(v.Started).Seconds()}
		for _, cb := range v.Contributors {
			rt.Training = max(rt.Training, cb.Seconds)
			rt.Steps += cb.Samples
		}
		res.Rounds = append(res.Rounds, rt)
		wall += rt.Wall
		train += rt.Training
	}
	if train > 0 {
		res.Overhead = (wall - train) / train
	}
	return nil
}

// Print writes r for people.
func (r *GroupBenchResult) Print(w io.Writer) {
	fmt.Fprintf(w, "trainers' group on loopback (heartbeat %s, election %s, lease %s):\n", r.Timing.Heartbeat, r.Timing.Election, r.Timing.LeaderLease)
	verdict := "met"
	if r.P99 > FailoverGoal {
		verdict = "NOT MET"
	}
	fmt.Fprintf(w, "  failover, %d leader kills in a group of %d: new leader p50 %s  p99 %s  (goal p99 <= %s: %s)\n",
		r.Kills, r.Trainers, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), FailoverGoal, verdict)
	fmt.Fprintf(w, "  rounds of a lone trainer (tiny model):\n")
	for _, rt := range r.Rounds {
		fmt.Fprintf(w, "    round %d: %d samples, %.3f s training, %.3f s start to commit\n", rt.Round, rt.Steps, rt.Training, rt.Wall)
	}
	verdict = "met"
	if r.Overhead > OverheadGoal {
		verdict = "NOT MET"
	}
	fmt.Fprintf(w, "  a round's overhead against pure training: %.1f%%  (goal <= %.0f%%: %s)\n", 100*r.Overhead, 100*OverheadGoal, verdict)
}
