package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Personal adapters (see the package documentation, "Personal adapters").
const (
	// DefaultPersonalFor is the virtual time the personal adapters' run
	// covers: three days, so that nights and days both count.
	DefaultPersonalFor = 72 * time.Hour
	// PersonalJobSteps is one job's worth: a personal job trains at most
	// this many of the device's oldest untrained steps.
	PersonalJobSteps = 256
	// PersonalKeepUp is how old the oldest step not yet trained into a
	// device's personal adapter may be, at the end of the run, for the
	// adapter to keep up.
	PersonalKeepUp = 6 * time.Hour

	day = 24 * time.Hour
)

// deviceClass is a kind of device and the speed of its personal training,
// in scored steps a second, drawn log-uniform in [lo, hi].
type deviceClass struct {
	name   string
	share  float64
	lo, hi float64
}

// personalModel is the personal adapters' model: the devices' classes,
// the agent's activity, the jobs and the trainers' slice. The run uses
// personalDefaults; tests vary it.
type personalModel struct {
	classes []deviceClass
	// speedScale multiplies every device's drawn speed (1 in the run).
	speedScale float64
	// The agent's day, in the device's local time: active sessions
	// (exponential, mean sessionMean) separated by idle gaps (exponential,
	// mean idleMean) from dayStart to dayEnd; idle through the night.
	dayStart, dayEnd      time.Duration
	sessionMean, idleMean time.Duration
	// stepsPerMinute: scored steps the agent records while active.
	stepsPerMinute float64
	// trainerSpeed: a trainer's personal training in steps a second, of
	// which slice goes to personal jobs (the rest to the mesh's rounds).
	trainerSpeed, slice float64
}

var personalDefaults = personalModel{
	classes: []deviceClass{
		// An Apple M-series laptop or mini training through MLX.
		{name: "apple-m", share: 0.5, lo: 0.5, hi: 4},
		// A small CPU box (a mini PC, a single-board computer).
		{name: "cpu", share: 0.5, lo: 0.02, hi: 0.2},
	},
	speedScale:  1,
	dayStart:    7 * time.Hour,
	dayEnd:      23 * time.Hour,
	sessionMean: 15 * time.Minute,
	idleMean:    45 * time.Minute,
	// The mesh model's device: a 16-step batch every 2 minutes.
	stepsPerMinute: honestSteps / honestEvery.Minutes(),
	trainerSpeed:   20,
	slice:          0.25,
}

// stepBlock is steps recorded evenly over [from, to).
type stepBlock struct {
	from, to time.Duration
	steps    int
}

// steps is a queue of untrained steps, oldest first.
type steps []stepBlock

func (s steps) count() int {
	n := 0
	for _, b := range s {
		n += b.steps
	}
	return n
}

// take removes up to k of the oldest steps and returns them.
func (s *steps) take(k int) steps {
	var out steps
	for k > 0 && len(*s) > 0 {
		b := &(*s)[0]
		if b.steps <= k {
			out = append(out, *b)
			k -= b.steps
			*s = (*s)[1:]
			continue
		}
		split := b.from + time.Duration(float64(b.to-b.from)*float64(k)/float64(b.steps))
		out = append(out, stepBlock{from: b.from, to: split, steps: k})
		b.from, b.steps, k = split, b.steps-k, 0
	}
	return out
}

// personalDevice is one device with its personal adapter on.
type personalDevice struct {
	id       int
	mesh     bool
	class    int
	speed    float64 // local: steps a second
	trainer  int     // mesh: the trainer it trusts
	sessions [][2]time.Duration
	active   bool
	session  time.Duration // when the current session began

	pending steps
	job     steps // the job running (local) or away (mesh); nil: none
	gen     int   // invalidates a preempted job's completion

	recorded, trained, jobs, started, preempted int
}

// personalRun is the personal adapters' run: its own clock, over
// PersonalFor, on the world's devices and links.
type personalRun struct {
	clock
	w       *world
	m       personalModel
	devices []*personalDevice
	// Trainers: when each is next free for a personal job, and the
	// seconds of its slice spent.
	free []time.Duration
	busy float64
}

// sessions draws a device's active sessions over [0, horizon): its local
// time is virtual time plus phase.
func (m personalModel) sessions(r *rand.Rand, phase, horizon time.Duration) [][2]time.Duration {
	var out [][2]time.Duration
	local := func(t time.Duration) time.Duration { return (t + phase) % day }
	night := func(t time.Duration) bool { l := local(t); return l < m.dayStart || l >= m.dayEnd }
	for t := time.Duration(0); t < horizon; {
		if night(t) {
			next := m.dayStart - local(t)
			if next <= 0 {
				next += day
			}
			t += next
			continue
		}
		t += expDur(r, m.idleMean)
		if t >= horizon || night(t) {
			continue
		}
		e := min(t+expDur(r, m.sessionMean), t+m.dayEnd-local(t), horizon)
		out = append(out, [2]time.Duration{t, e})
		// The next gap starts a moment after, so that time moves on.
		t = e + time.Second
	}
	return out
}

// newPersonalRun picks the devices with a personal adapter (Options.
// Personal of them, PersonalMesh of those in mesh mode) and draws their
// class, speed, local time, trusted trainer and activity, each from its
// own stream, so that the model's parameters change none of the draws.
func (w *world) newPersonalRun(m personalModel) *personalRun {
	o := w.o
	s := o.Seed
	p := &personalRun{w: w, m: m, free: make([]time.Duration, o.Trainers)}
	k := int(o.Personal*float64(o.Nodes) + 0.5)
	on := stream(s, "personal").Perm(o.Nodes)[:k]
	nm := int(max(0, o.PersonalMesh)*float64(k) + 0.5)
	mesh := make(map[int]bool, nm)
	for _, i := range on[:nm] {
		mesh[i] = true
	}
	slices.Sort(on)
	rClass, rSpeed, rPhase, rTrust, rAct := stream(s, "personal-class"), stream(s, "personal-speed"),
		stream(s, "personal-phase"), stream(s, "personal-trust"), stream(s, "personal-activity")
	for _, i := range on {
		d := &personalDevice{id: i, mesh: mesh[i]}
		x := rClass.Float64()
		for c, dc := range m.classes {
			d.class = c
			if x -= dc.share; x < 0 {
				break
			}
		}
		dc := m.classes[d.class]
		d.speed = logUniform(rSpeed, dc.lo, dc.hi) * m.speedScale
		phase := time.Duration(rPhase.Int64N(int64(day)))
		d.trainer = rTrust.IntN(o.Trainers)
		d.sessions = m.sessions(rAct, phase, o.PersonalFor)
		p.devices = append(p.devices, d)
	}
	return p
}

// run plays the agents' sessions and the personal jobs until PersonalFor.
func (p *personalRun) run() {
	for _, d := range p.devices {
		for _, s := range d.sessions {
			p.at(s[0], func() { p.sessionStart(d) })
			p.at(s[1], func() { p.sessionEnd(d, s[0]) })
		}
	}
	for p.step(p.w.o.PersonalFor) {
	}
	p.now = p.w.o.PersonalFor
}

// sessionStart: the agent becomes active; a local job is preempted, its
// progress lost (the worker is stopped) and its steps back in the queue.
func (p *personalRun) sessionStart(d *personalDevice) {
	d.active, d.session = true, p.now
	if !d.mesh && d.job != nil {
		d.pending = append(d.job, d.pending...)
		d.job = nil
		d.gen++
		d.preempted++
	}
}

// sessionEnd: the agent goes idle; the session's steps join the queue and
// a job starts if none runs.
func (p *personalRun) sessionEnd(d *personalDevice, from time.Duration) {
	if n := int(p.m.stepsPerMinute*(p.now-from).Minutes() + 0.5); n > 0 {
		d.pending = append(d.pending, stepBlock{from: from, to: p.now, steps: n})
		d.recorded += n
	}
	d.active = false
	p.startJob(d)
}

// startJob starts a job of the device's oldest steps, if it has any and
// none is running or away.
func (p *personalRun) startJob(d *personalDevice) {
	if d.job != nil || d.active || len(d.pending) == 0 {
		return
	}
	d.job = d.pending.take(PersonalJobSteps)
	d.started++
	n := d.job.count()
	if !d.mesh {
		gen := d.gen
		p.after(time.Duration(float64(n)/d.speed*float64(time.Second)), func() {
			if d.gen == gen {
				p.jobDone(d)
			}
		})
		return
	}
	// Mesh: the steps go up the device's link to its trusted trainer,
	// which trains the jobs it gets one at a time, in order, on its
	// slice; the adapter comes back down the device's link.
	nd := p.w.nodes[d.id]
	t := p.w.trainers[d.trainer].n
	up := p.w.latency(nd, t) + time.Duration(float64(n*bytesPerStep)/nd.up*float64(time.Second))
	p.after(up, func() {
		train := float64(n) / (p.m.trainerSpeed * p.m.slice)
		start := max(p.free[d.trainer], p.now)
		done := start + time.Duration(train*float64(time.Second))
		p.free[d.trainer] = done
		// Busy: the part of the slice's time within the run.
		p.busy += max(0, min(done, p.w.o.PersonalFor)-start).Seconds()
		back := p.w.latency(t, nd) + time.Duration(float64(p.w.o.BundleMiB<<20)/nd.down*float64(time.Second))
		p.at(done+back, func() { p.jobDone(d) })
	})
}

// jobDone: the job's steps are in the device's personal adapter.
func (p *personalRun) jobDone(d *personalDevice) {
	d.trained += d.job.count()
	d.jobs++
	d.job = nil
	p.startJob(d)
}

// PersonalReport is what the personal adapters' run found: the devices
// with a personal adapter, whether it keeps up with their steps, and the
// jobs that trained it. Lag is measured at the end of the run: the steps
// recorded and not yet trained into the adapter (waiting, or in a job
// still running or away), and the age of the oldest of them; an adapter
// keeps up when that age is at most KeepUpH hours.
type PersonalReport struct {
	// Hours is the virtual time the run covered; KeepUpH the keep-up
	// threshold; JobSteps one job's worth.
	Hours    float64 `json:"hours"`
	KeepUpH  float64 `json:"keep_up_h"`
	JobSteps int     `json:"job_steps"`
	// Devices: with a personal adapter on; Local and Mesh by mode.
	Devices int `json:"devices"`
	Local   int `json:"local"`
	Mesh    int `json:"mesh"`
	// KeepUp: the share of Devices whose adapter keeps up.
	KeepUp float64 `json:"keep_up_share"`
	// LagSteps50/90 and LagHours50/90: the median and 90th percentile of
	// the devices' lag in steps and in hours.
	LagSteps50 int     `json:"lag_steps50"`
	LagSteps90 int     `json:"lag_steps90"`
	LagHours50 float64 `json:"lag_h50"`
	LagHours90 float64 `json:"lag_h90"`
	// Recorded and Trained: steps the agents recorded, and those trained
	// into a personal adapter.
	Recorded int `json:"recorded_steps"`
	Trained  int `json:"trained_steps"`
	// Jobs: jobs that finished; Started: jobs started; Preempted: local
	// jobs stopped because the agent became active (their progress lost),
	// PreemptedShare Preempted / Started.
	Jobs           int     `json:"jobs"`
	Started        int     `json:"started"`
	Preempted      int     `json:"preempted"`
	PreemptedShare float64 `json:"preempted_share"`
	// TrainerSlice: the share of the trainers' time given to personal
	// jobs; TrainerBusy the share of that slice the mesh-mode jobs used.
	TrainerSlice float64 `json:"trainer_slice"`
	TrainerBusy  float64 `json:"trainer_busy"`
	// Groups: the same by mode and, for local mode, by device class.
	Groups []PersonalGroup `json:"groups"`
}

// PersonalGroup is one mode and device class of PersonalReport.
type PersonalGroup struct {
	Mode  string `json:"mode"`
	Class string `json:"class"`
	// Speed: the median speed of the group's devices in steps a second
	// (local mode; 0 for mesh).
	Speed      float64 `json:"speed_steps_s"`
	Devices    int     `json:"devices"`
	KeepUp     float64 `json:"keep_up_share"`
	LagSteps50 int     `json:"lag_steps50"`
	LagHours50 float64 `json:"lag_h50"`
	LagHours90 float64 `json:"lag_h90"`
	Preempted  float64 `json:"preempted_share"`
}

// lag is a device's lag at the end: untrained steps and the age of the
// oldest.
func (p *personalRun) lag(d *personalDevice) (int, time.Duration) {
	left := append(slices.Clone(d.job), d.pending...)
	if d.active {
		if n := int(p.m.stepsPerMinute*(p.now-d.session).Minutes() + 0.5); n > 0 {
			left = append(left, stepBlock{from: d.session, to: p.now, steps: n})
		}
	}
	if len(left) == 0 {
		return 0, 0
	}
	return left.count(), p.now - left[0].from
}

// report summarises the run.
func (p *personalRun) report() *PersonalReport {
	r := &PersonalReport{Hours: p.now.Hours(), KeepUpH: PersonalKeepUp.Hours(), JobSteps: PersonalJobSteps,
		Devices: len(p.devices), TrainerSlice: p.m.slice}
	type key struct {
		mesh  bool
		class int
	}
	groups := map[key][]*personalDevice{}
	for _, d := range p.devices {
		if d.mesh {
			r.Mesh++
		} else {
			r.Local++
		}
		r.Recorded += d.recorded
		r.Trained += d.trained
		r.Jobs += d.jobs
		r.Started += d.started
		r.Preempted += d.preempted
		k := key{d.mesh, d.class}
		if d.mesh {
			k.class = -1
		}
		groups[k] = append(groups[k], d)
	}
	r.PreemptedShare = share(r.Preempted, r.Started)
	if r.Mesh > 0 {
		r.TrainerBusy = round3(p.busy / (p.now.Seconds() * float64(len(p.free))))
	}
	all, steps90 := p.summarise(p.devices)
	r.KeepUp, r.LagSteps50, r.LagSteps90, r.LagHours50, r.LagHours90 = all.KeepUp, all.LagSteps50, steps90, all.LagHours50, all.LagHours90
	for c, dc := range p.m.classes {
		if ds := groups[key{false, c}]; len(ds) > 0 {
			g, _ := p.summarise(ds)
			g.Mode, g.Class = "local", dc.name
			r.Groups = append(r.Groups, g)
		}
	}
	if ds := groups[key{true, -1}]; len(ds) > 0 {
		g, _ := p.summarise(ds)
		g.Mode, g.Class, g.Speed = "mesh", "any", 0
		r.Groups = append(r.Groups, g)
	}
	if r.Groups == nil {
		r.Groups = []PersonalGroup{}
	}
	return r
}

// summarise is PersonalGroup's figures over ds, and the 90th percentile of
// their lag in steps.
func (p *personalRun) summarise(ds []*personalDevice) (PersonalGroup, int) {
	g := PersonalGroup{Devices: len(ds)}
	var lagSteps, lagHours, speeds []float64
	keep, started, preempted := 0, 0, 0
	for _, d := range ds {
		n, age := p.lag(d)
		if age <= PersonalKeepUp {
			keep++
		}
		lagSteps = append(lagSteps, float64(n))
		lagHours = append(lagHours, age.Hours())
		speeds = append(speeds, d.speed)
		started += d.started
		preempted += d.preempted
	}
	g.KeepUp = share(keep, len(ds))
	g.LagSteps50 = int(quantile(lagSteps, 0.5))
	g.LagHours50 = round3(quantile(lagHours, 0.5))
	g.LagHours90 = round3(quantile(lagHours, 0.9))
	g.Speed = round3(quantile(speeds, 0.5))
	g.Preempted = share(preempted, started)
	return g, int(quantile(lagSteps, 0.9))
}

// quantile is the nearest-rank q-quantile of xs (0 for none).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)]
}

// share is n/of rounded, 0 when of is 0.
func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return round3(float64(n) / float64(of))
}

// writePersonal prints the personal section of the table.
func writePersonal(f func(string, ...any), b *strings.Builder, r *PersonalReport) {
	f("\npersonal adapters over %.0f h: %d devices (%d local, %d mesh); %.1f%% keep up (oldest untrained step at most %.0f h old at the end)\n",
		r.Hours, r.Devices, r.Local, r.Mesh, 100*r.KeepUp, r.KeepUpH)
	f("lag: median %d steps, %.1f h; 90th percentile %d steps, %.1f h; %d of %d steps trained\n",
		r.LagSteps50, r.LagHours50, r.LagSteps90, r.LagHours90, r.Trained, r.Recorded)
	f("jobs (at most %d steps each): %d done of %d started, %d preempted (%.1f%%)", r.JobSteps, r.Jobs, r.Started, r.Preempted, 100*r.PreemptedShare)
	if r.Mesh > 0 {
		f("; trainers' personal slice (%.0f%% of their time) %.1f%% busy", 100*r.TrainerSlice, 100*r.TrainerBusy)
	}
	f("\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tclass\tmedian steps/s\tdevices\tkeep up\tlag steps 50%\tlag h 50%\tlag h 90%\tpreempted\t")
	for _, g := range r.Groups {
		speed := "-"
		if g.Mode == "local" {
			speed = fmt.Sprintf("%.2f", g.Speed)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f%%\t%d\t%.1f\t%.1f\t%.1f%%\t\n", g.Mode, g.Class, speed, g.Devices, 100*g.KeepUp, g.LagSteps50, g.LagHours50, g.LagHours90, 100*g.Preempted)
	}
	tw.Flush()
}
