package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"
)

// personalWorld is a small world with every device's personal adapter
// on, PersonalMesh of them in mesh mode.
func personalWorld(t *testing.T, seed uint64, mesh float64, trainers int) *world {
	t.Helper()
	w, err := newWorld(Options{Seed: seed, Nodes: 200, Trainers: trainers, Versions: 2, Personal: 1, PersonalMesh: mesh}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func runPersonal(w *world, m personalModel) *PersonalReport {
	p := w.newPersonalRun(m)
	p.run()
	return p.report()
}

func TestPersonalDeterministic(t *testing.T) {
	o := Options{Seed: 11, Nodes: 40, Versions: 2, Personal: 0.6, PersonalMesh: 0.5}
	enc := func(o Options) []byte {
		r, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		if r.Personal == nil {
			t.Fatal("no personal section")
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := enc(o), enc(o)
	if !bytes.Equal(a, b) {
		t.Error("the same options gave different reports")
	}
	var r Report
	if err := json.Unmarshal(a, &r); err != nil {
		t.Fatal(err)
	}
	p := r.Personal
	if p.Devices != 24 || p.Local != 12 || p.Mesh != 12 || p.Hours != 72 || p.Jobs == 0 || p.Recorded == 0 || p.Trained > p.Recorded || len(p.Groups) == 0 {
		t.Errorf("personal: %+v", p)
	}
	o.Seed = 12
	if c := enc(o); bytes.Equal(a, c) {
		t.Error("another seed gave the same report")
	}
}

// Turning personal adapters on adds the personal section and changes
// nothing else in the report.
func TestPersonalOffChangesNothing(t *testing.T) {
	for _, sc := range []string{Baseline, Churn} {
		o := Options{Seed: 4, Nodes: 40, Versions: 2, Scenario: sc}
		off, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		o.Personal, o.PersonalMesh = 1, 0.3
		on, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		if off.Personal != nil || on.Personal == nil {
			t.Fatalf("%s: personal section off %v, on %v", sc, off.Personal, on.Personal)
		}
		a, _ := json.Marshal(off)
		if bytes.Contains(a, []byte(`"personal"`)) {
			t.Errorf("%s: the report without personal adapters has a personal field", sc)
		}
		on.Personal = nil
		b, _ := json.Marshal(on)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: personal adapters changed the rest of the report:\n%s\n%s", sc, a, b)
		}
	}
}

// Faster devices keep up more, and lag less.
func TestPersonalFasterKeepsUp(t *testing.T) {
	w := personalWorld(t, 5, 0, 3)
	var prev *PersonalReport
	for _, scale := range []float64{0.1, 0.3, 1, 3, 10} {
		m := personalDefaults
		m.speedScale = scale
		r := runPersonal(w, m)
		t.Logf("speed ×%v: keep up %.3f, lag p90 %.1f h, %d steps, preempted %.3f", scale, r.KeepUp, r.LagHours90, r.LagSteps90, r.PreemptedShare)
		if prev != nil && (r.KeepUp < prev.KeepUp || r.LagHours90 > prev.LagHours90 || r.Trained < prev.Trained) {
			t.Errorf("speed ×%v: keep up %.3f (slower: %.3f), lag p90 %.1f h (%.1f), trained %d (%d)", scale, r.KeepUp, prev.KeepUp, r.LagHours90, prev.LagHours90, r.Trained, prev.Trained)
		}
		prev = r
	}
	m := personalDefaults
	m.speedScale = 0.1
	slow := runPersonal(w, m)
	if !(slow.KeepUp < prev.KeepUp) || prev.KeepUp < 0.95 || slow.Preempted == 0 {
		t.Errorf("keep up %.3f at ×0.1, %.3f at ×10; %d preempted at ×0.1", slow.KeepUp, prev.KeepUp, slow.Preempted)
	}
}

// Longer idle windows (the same sessions, further apart) keep up more.
func TestPersonalIdleKeepsUp(t *testing.T) {
	w := personalWorld(t, 6, 0, 3)
	var prev *PersonalReport
	for _, idle := range []time.Duration{10 * time.Minute, 30 * time.Minute, time.Hour, 3 * time.Hour} {
		m := personalDefaults
		m.idleMean = idle
		r := runPersonal(w, m)
		t.Logf("idle %v: keep up %.3f, lag p90 %.1f h, preempted %.3f", idle, r.KeepUp, r.LagHours90, r.PreemptedShare)
		if prev != nil && (r.KeepUp < prev.KeepUp || r.PreemptedShare > prev.PreemptedShare) {
			t.Errorf("idle %v: keep up %.3f (shorter: %.3f), preempted %.3f (%.3f)", idle, r.KeepUp, prev.KeepUp, r.PreemptedShare, prev.PreemptedShare)
		}
		prev = r
	}
}

// In mesh mode a larger slice of the trainers keeps up more, and no job
// is preempted.
func TestPersonalMeshSlice(t *testing.T) {
	w := personalWorld(t, 7, 1, 1)
	var prev *PersonalReport
	for _, slice := range []float64{0.02, 0.1, 0.2, 0.3, 0.5} {
		m := personalDefaults
		m.slice = slice
		r := runPersonal(w, m)
		t.Logf("slice %v: keep up %.3f, busy %.3f, lag p90 %.1f h", slice, r.KeepUp, r.TrainerBusy, r.LagHours90)
		if r.Mesh != 200 || r.Preempted != 0 || r.TrainerBusy > 1 {
			t.Errorf("slice %v: %d mesh devices, %d preempted, busy %.3f", slice, r.Mesh, r.Preempted, r.TrainerBusy)
		}
		if prev != nil && (r.KeepUp < prev.KeepUp || r.TrainerBusy > prev.TrainerBusy) {
			t.Errorf("slice %v: keep up %.3f (smaller: %.3f), busy %.3f (%.3f)", slice, r.KeepUp, prev.KeepUp, r.TrainerBusy, prev.TrainerBusy)
		}
		prev = r
	}
	m := personalDefaults
	m.slice = 0.005
	if small := runPersonal(w, m); !(small.KeepUp < prev.KeepUp) || small.TrainerBusy < 0.9 {
		t.Errorf("keep up %.3f on a 0.5%% slice (busy %.3f), %.3f on half", small.KeepUp, small.TrainerBusy, prev.KeepUp)
	}
}

func TestStepsTake(t *testing.T) {
	s := steps{{from: 0, to: 100 * time.Second, steps: 10}, {from: 200 * time.Second, to: 300 * time.Second, steps: 10}}
	got := s.take(14)
	if got.count() != 14 || s.count() != 6 || len(got) != 2 || got[1].to != 240*time.Second || s[0].from != 240*time.Second {
		t.Errorf("took %+v, left %+v", got, s)
	}
	if rest := s.take(100); rest.count() != 6 || len(s) != 0 {
		t.Errorf("took %+v, left %+v", rest, s)
	}
}

func TestPersonalSessions(t *testing.T) {
	m := personalDefaults
	horizon := 72 * time.Hour
	for phase := time.Duration(0); phase < day; phase += 5 * time.Hour {
		ss := m.sessions(stream(1, "test"), phase, horizon)
		if len(ss) == 0 {
			t.Fatalf("phase %v: no sessions", phase)
		}
		var last time.Duration
		for _, s := range ss {
			l := (s[0] + phase) % day
			if s[0] < last || s[1] < s[0] || s[1] > horizon || l < m.dayStart || l >= m.dayEnd || s[1]-s[0] > m.dayEnd-l {
				t.Errorf("phase %v: session %v-%v (local %v) after %v", phase, s[0], s[1], l, last)
			}
			last = s[1]
		}
	}
}

func TestPersonalOptions(t *testing.T) {
	for _, o := range []Options{
		{Personal: 1.5}, {Personal: -0.1}, {Personal: math.NaN()}, {Personal: 0.5, PersonalMesh: 2},
		{Personal: 0.5, PersonalMesh: -1}, {Personal: 0.5, PersonalFor: time.Minute}, {Personal: 0.5, PersonalFor: 40 * day},
	} {
		if err := o.Validate(); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if err := (Options{Personal: 0.5, PersonalMesh: 1, PersonalFor: 24 * time.Hour}).Validate(); err != nil {
		t.Error(err)
	}
}

// BenchmarkPersonal runs the personal adapters of 1,000 devices over three
// days, a fifth of them in mesh mode.
func BenchmarkPersonal(b *testing.B) {
	w, err := newWorld(Options{Seed: 1, Personal: 1, PersonalMesh: 0.2}, DefAll)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		p := w.newPersonalRun(personalDefaults)
		p.run()
		p.report()
	}
}
