package personal_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/pool"
)

// jobTrainer is a unit-test trainer: it remembers each job and writes a
// marker adapter directory; block makes it wait for its context.
type jobTrainer struct {
	mu    sync.Mutex
	jobs  []core.PersonalJob
	block bool
	start chan struct{}
	once  sync.Once
}

func (t *jobTrainer) Train(ctx context.Context, j core.PersonalJob) (core.PersonalResult, error) {
	t.mu.Lock()
	t.jobs = append(t.jobs, j)
	block := t.block
	t.mu.Unlock()
	if block {
		if t.start != nil {
			t.once.Do(func() { close(t.start) })
		}
		<-ctx.Done()
		return core.PersonalResult{}, ctx.Err()
	}
	if err := os.MkdirAll(j.Out, 0o700); err != nil {
		return core.PersonalResult{}, err
	}
	if err := os.WriteFile(filepath.Join(j.Out, "adapter_config.json"), []byte("{}"), 0o600); err != nil {
		return core.PersonalResult{}, err
	}
	return core.PersonalResult{Trained: len(j.Steps), HeldBack: len(j.HeldBack), ScoreBefore: 0.5, ScoreAfter: 0.75}, nil
}

func (t *jobTrainer) last() core.PersonalJob {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.jobs[len(t.jobs)-1]
}

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// put records n steps, from the i-th on, scored with reward r (0: none).
func put(t *testing.T, p *pool.Pool, from, n int, r float64) {
	t.Helper()
	for i := from; i < from+n; i++ {
		s := &core.Step{ID: core.StepID(fmt.Sprintf("s%05d", i)), SessionID: "sess", Turn: core.TurnMain, API: core.APIChat,
			State: core.StateScored, Source: "gateway",
			Request:  core.Request{Messages: []core.Message{{Role: "user", Content: fmt.Sprint("q", i)}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: "assistant", Content: fmt.Sprint("a", i)}}}},
			Timings:  core.Timings{Start: t0.Add(time.Duration(i) * time.Second)}}
		if r != 0 {
			v := r
			s.Reward = &core.Reward{Value: &v}
		}
		if err := p.Put(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

func open(t *testing.T, tr personal.Trainer, changed func()) (*personal.Manager, *pool.Pool, string) {
	t.Helper()
	root := t.TempDir()
	p, err := pool.Open(filepath.Join(root, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	shared := filepath.Join(root, "v3")
	m, err := personal.New(personal.Config{Dir: filepath.Join(root, "personal"), Mode: personal.ModeLocal, Trainer: tr, Pool: p,
		Shared: func() (string, string) { return "v3", shared }, Changed: changed, MinSteps: 8, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return m, p, root
}

// TestTrainTakesOwnNewScoredSteps: a job gets the device's scored steps
// with a signal, less the held-back ones (always the same), and only the
// new ones the next time; each version builds on the previous one.
func TestTrainTakesOwnNewScoredSteps(t *testing.T) {
	tr := &jobTrainer{}
	changes := 0
	m, p, root := open(t, tr, func() { changes++ })
	ctx := context.Background()
	put(t, p, 0, 5, 1)
	put(t, p, 5, 20, 0) // no reward: nothing to learn
	if _, err := m.Train(ctx); !errors.Is(err, personal.ErrNotEnough) {
		t.Fatalf("with 5 scored steps: %v, want ErrNotEnough", err)
	}
	put(t, p, 25, 40, -1)
	rec, err := m.Train(ctx)
	if err != nil {
		t.Fatal(err)
	}
	j := tr.last()
	if rec.Version != "p1" || j.Prev != "" || j.SharedVersion != "v3" || j.Shared != filepath.Join(root, "v3") {
		t.Fatalf("first job %+v, record %+v", j, rec)
	}
	if len(j.Steps)+len(j.HeldBack) != 45 || len(j.HeldBack) == 0 || len(j.Steps) < 30 {
		t.Fatalf("%d steps trained and %d held back, want the 45 scored ones split", len(j.Steps), len(j.HeldBack))
	}
	held := map[core.StepID]bool{}
	for _, s := range j.HeldBack {
		held[s.ID] = true
	}
	for _, s := range j.Steps {
		if held[s.ID] || s.Reward == nil || *s.Reward.Value == 0 {
			t.Fatalf("step %s trained: held back or without a signal", s.ID)
		}
	}
	if name, dir := m.Current(); name != "p1" || dir != filepath.Join(root, "personal", "p1") || changes != 1 {
		t.Fatalf("current %q %q after %d changes", name, dir, changes)
	}
	if _, err := m.Train(ctx); !errors.Is(err, personal.ErrNotEnough) {
		t.Fatalf("no new steps: %v, want ErrNotEnough", err)
	}
	put(t, p, 65, 12, 1)
	if _, err := m.Train(ctx); err != nil {
		t.Fatal(err)
	}
	j2 := tr.last()
	fresh := 0
	for _, s := range j2.Steps {
		if s.ID >= "s00065" {
			fresh++
		}
	}
	// The new steps, with the past replayed.
	if j2.Prev != filepath.Join(root, "personal", "p1") || fresh == 0 || fresh > 12 || len(j2.Steps) != len(j.Steps)+fresh {
		t.Fatalf("second job: prev %q, %d steps, %d of them new (want p1, the new ones and the first job's)", j2.Prev, len(j2.Steps), fresh)
	}
	for _, s := range j2.HeldBack {
		if !held[s.ID] && s.ID < "s00065" {
			t.Fatalf("step %s held back now but trained before", s.ID)
		}
	}
	st := m.Status()
	if st.Current != "p2" || st.Learned != len(j.Steps)+fresh || len(st.Versions) != 2 || st.Score != 0.75 {
		t.Fatalf("status %+v", st)
	}

	// Reopened, it remembers.
	m2, err := personal.New(personal.Config{Dir: filepath.Join(root, "personal"), Mode: personal.ModeLocal, Trainer: tr, Pool: p, MinSteps: 8})
	if err != nil {
		t.Fatal(err)
	}
	if name, _ := m2.Current(); name != "p2" {
		t.Fatalf("reopened: current %q", name)
	}
}

// TestResetAndOff: reset removes the versions and the device serves the
// shared version alone; off stops serving and training, on brings the
// kept version back.
func TestResetAndOff(t *testing.T) {
	tr := &jobTrainer{}
	changes := 0
	m, p, root := open(t, tr, func() { changes++ })
	ctx := context.Background()
	put(t, p, 0, 30, 1)
	if _, err := m.Train(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.SetEnabled(false); err != nil {
		t.Fatal(err)
	}
	if name, _ := m.Current(); name != "" {
		t.Fatalf("off, yet %q serves", name)
	}
	put(t, p, 30, 30, 1)
	if _, err := m.Train(ctx); !errors.Is(err, personal.ErrOff) {
		t.Fatalf("train while off: %v", err)
	}
	if err := m.SetEnabled(true); err != nil {
		t.Fatal(err)
	}
	if name, _ := m.Current(); name != "p1" {
		t.Fatalf("on again: %q serves, want p1", name)
	}
	if err := m.Reset(); err != nil {
		t.Fatal(err)
	}
	if name, _ := m.Current(); name != "" {
		t.Fatalf("reset, yet %q serves", name)
	}
	if _, err := os.Stat(filepath.Join(root, "personal", "p1")); !os.IsNotExist(err) {
		t.Fatalf("p1 still on disk after reset: %v", err)
	}
	if st := m.Status(); st.Learned != 0 || len(st.Versions) != 0 {
		t.Fatalf("status after reset %+v", st)
	}
	if changes != 4 {
		t.Fatalf("%d changes told, want 4 (train, off, on, reset)", changes)
	}
	rec, err := m.Train(ctx)
	if err != nil || rec.Version != "p2" || tr.last().Prev != "" {
		t.Fatalf("after reset: %+v %v, prev %q (want a fresh p2)", rec, err, tr.last().Prev)
	}
	for _, s := range tr.last().Steps {
		if s.ID < "s00030" {
			t.Fatalf("step %s, learned before the reset, learned again", s.ID)
		}
	}
}

// TestIdleAndPreempt: the loop trains only once the agent has been idle,
// and a call of the agent stops the job under way.
func TestIdleAndPreempt(t *testing.T) {
	tr := &jobTrainer{block: true, start: make(chan struct{})}
	root := t.TempDir()
	p, err := pool.Open(filepath.Join(root, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	put(t, p, 0, 30, 1)
	var mu sync.Mutex
	last := time.Now()
	m, err := personal.New(personal.Config{Dir: filepath.Join(root, "personal"), Mode: personal.ModeLocal, Trainer: tr, Pool: p,
		MinSteps: 8, Poll: 5 * time.Millisecond, Idle: time.Hour,
		LastCall: func() time.Time { mu.Lock(); defer mu.Unlock(); return last }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond)
	tr.mu.Lock()
	n := len(tr.jobs)
	tr.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d jobs while the agent was busy", n)
	}
	mu.Lock()
	last = time.Now().Add(-2 * time.Hour)
	mu.Unlock()
	select {
	case <-tr.start:
	case <-time.After(10 * time.Second):
		t.Fatal("no job once the agent was idle")
	}
	// The agent calls again: the node notes the call and preempts.
	mu.Lock()
	last = time.Now()
	mu.Unlock()
	m.Preempt()
	for range 1000 {
		if !m.Status().Training {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := m.Status(); st.Training || st.Current != "" {
		t.Fatalf("after preempt: %+v", st)
	}
}
