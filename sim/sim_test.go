package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// seeds is how many seeds the invariant tests run: CLAWMESH_SIM_SEEDS, or
// a few.
func seeds(t *testing.T, def int) int {
	if s := os.Getenv("CLAWMESH_SIM_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CLAWMESH_SIM_SEEDS=%q: want a positive number", s)
		}
		return n
	}
	return def
}

func encode(t *testing.T, r *Report) (js, table []byte) {
	t.Helper()
	j, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return j, b.Bytes()
}

func TestSameSeedSameBytes(t *testing.T) {
	for _, sc := range []string{Churn, Partition} {
		o := Options{Nodes: 120, Seed: 7, Versions: 3, Scenario: sc}
		a, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		ja, ta := encode(t, a)
		jb, tb := encode(t, b)
		if !bytes.Equal(ja, jb) {
			t.Errorf("%s: the same seed gave different JSON:\n%s\n%s", sc, ja, jb)
		}
		if !bytes.Equal(ta, tb) {
			t.Errorf("%s: the same seed gave different tables:\n%s\n%s", sc, ta, tb)
		}
		if !strings.HasPrefix(string(ta), "seed 7,") {
			t.Errorf("%s: the table does not start with its seed: %q", sc, ta[:min(len(ta), 40)])
		}
		for _, field := range []string{`"hole_punch":0.7`, `"punched_pairs":`, `"awake_reach99_s":`, `"awake_within_2x":`, `"cut_bound99_s":`, `"cut_within_2x":`} {
			if !bytes.Contains(ja, []byte(field)) {
				t.Errorf("%s: the JSON has no %s", sc, field)
			}
		}
		if got := bytes.Contains(ta, []byte("cut bound 99%")); got != (sc == Partition) {
			t.Errorf("%s: the table has the bound given the cut: %v", sc, got)
		}
		o.Seed = 8
		c, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		if jc, _ := encode(t, c); bytes.Equal(ja, jc) {
			t.Errorf("%s: seeds 7 and 8 gave the same JSON", sc)
		}
	}
}

func TestInvariantsOverSeeds(t *testing.T) {
	n := seeds(t, 2)
	for _, sc := range []string{Baseline, Churn, Partition} {
		for seed := range n {
			o := Options{Nodes: 150, Seed: uint64(seed + 1), Versions: 3, Scenario: sc}
			w, err := newWorld(o, DefAll)
			if err != nil {
				t.Fatal(err)
			}
			w.run()
			r := w.report()
			name := sc + "/seed " + strconv.Itoa(seed+1)
			if !r.Invariants.OK {
				t.Errorf("%s: %v", name, r.Invariants.Violations)
			}
			if len(r.Versions) != 3 {
				t.Errorf("%s: %d versions published, want 3", name, len(r.Versions))
			}
			if r.Work.TrainedTwice != 0 || r.Revocation.AfterLearnt != 0 {
				t.Errorf("%s: trained twice %d, reached the revoked peer after its sender knew %d", name, r.Work.TrainedTwice, r.Revocation.AfterLearnt)
			}
			// The revocation was exercised: the peer got things before,
			// and nothing newer after.
			before := 0
			for _, rc := range w.victimReceipts {
				if rc.at < w.revokedAt {
					before++
				}
			}
			if before == 0 || r.Revocation.Reached == 0 {
				t.Errorf("%s: the revoked peer received %d things before its revocation, which reached %d devices", name, before, r.Revocation.Reached)
			}
			if held := w.peers[w.victim].held; held >= w.newest {
				t.Errorf("%s: the revoked peer holds v%d, the newest", name, held)
			}
			for _, v := range r.Versions {
				if !(v.Reach50 >= 0 && v.Reach50 <= v.Reach95 && v.Reach95 <= v.Reach99) || v.Bound99 <= 0 {
					t.Errorf("%s: v%d reach %v/%v/%v bound %v", name, v.Version, v.Reach50, v.Reach95, v.Reach99, v.Bound99)
				}
			}
			if sc == Churn && len(r.Failovers) == 0 {
				t.Errorf("%s: the leader was killed and no failover is reported", name)
			}
			// With no device asleep, the devices that stayed up are all of
			// them (a partition cuts devices off, it does not put them to
			// sleep).
			if sc != Churn {
				for _, v := range r.Versions {
					if v.AwakeLive != v.Live || v.AwakeReach99 != v.Reach99 || v.AwakeRatio99 != v.Ratio99 {
						t.Errorf("%s: v%d: %d live, 99%% in %v s; stayed up %d, in %v s", name, v.Version, v.Live, v.Reach99, v.AwakeLive, v.AwakeReach99)
					}
				}
			}
		}
	}
}

// The checks catch what they look for: a run with a violation planted is
// reported as such.
func TestInvariantChecksFail(t *testing.T) {
	w, err := newWorld(Options{Nodes: 60, Seed: 1, Versions: 2}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	w.run()
	if r := w.report(); !r.Invariants.OK {
		t.Fatalf("the plain run: %v", r.Invariants.Violations)
	}
	// The revoked peer receiving from a node that already knew.
	from := w.nodes[w.victim].nbrs[0]
	w.victimReceipts = append(w.victimReceipts, receipt{from: from, sent: w.now, at: w.now})
	// A live device left on an old version.
	for i := range w.o.Nodes {
		if !w.isVictim(i) && w.live(w.nodes[i]) {
			w.peers[i].held = 0
			break
		}
	}
	w.finish()
	r := w.report()
	if r.Invariants.OK || r.Revocation.AfterLearnt != 1 {
		t.Fatalf("planted violations not reported: ok %v, after learnt %d", r.Invariants.OK, r.Revocation.AfterLearnt)
	}
	var conv, rev bool
	for _, v := range r.Invariants.Violations {
		conv = conv || strings.Contains(v, "live device")
		rev = rev || strings.Contains(v, "revoked")
	}
	if !conv || !rev {
		t.Errorf("violations %q: want the convergence and the revocation ones", r.Invariants.Violations)
	}
}

// Under churn, the reach over the devices that stayed up leaves out those
// that slept before they had a version, which no protocol could reach: its
// 99% comes no later than the figure over every device live at
// publication, and that figure is left as it was.
func TestAwakeReachChurn(t *testing.T) {
	excluded := 0
	for seed := range seeds(t, 3) {
		o := Options{Nodes: 150, Seed: uint64(seed + 11), Versions: 3, Scenario: Churn}
		w, err := newWorld(o, DefAll)
		if err != nil {
			t.Fatal(err)
		}
		w.run()
		r := w.report()
		for _, v := range r.Versions {
			name := fmt.Sprintf("seed %d v%d", o.Seed, v.Version)
			if v.AwakeLive > v.Live || v.AwakeLive == 0 {
				t.Errorf("%s: %d stayed up of %d live", name, v.AwakeLive, v.Live)
			}
			excluded += v.Live - v.AwakeLive
			if v.AwakeReach99 < 0 || v.Reach99 >= 0 && v.AwakeReach99 > v.Reach99 {
				t.Errorf("%s: 99%% of those that stayed up in %v s, 99%% of the live ones in %v s", name, v.AwakeReach99, v.Reach99)
			}
			if !(v.AwakeReach50 <= v.AwakeReach95 && v.AwakeReach95 <= v.AwakeReach99) {
				t.Errorf("%s: stayed up: %v/%v/%v", name, v.AwakeReach50, v.AwakeReach95, v.AwakeReach99)
			}
			// The old figure, recomputed from the run: the 99th percentile
			// over the live devices (those that left or sleep at the end
			// without the version are not counted).
			var times []float64
			live := 0
			for i := range o.Nodes {
				at := w.reached[v.Version][i]
				if !w.liveAtPub[v.Version][i] || w.isVictim(i) || (w.nodes[i].left || w.nodes[i].asleep) && at < 0 {
					continue
				}
				live++
				if at >= 0 {
					times = append(times, seconds(at-w.pubAt[v.Version]))
				}
			}
			slices.Sort(times)
			need := int(math.Ceil(0.99 * float64(live)))
			want := -1.0
			if need <= len(times) {
				want = round3(times[need-1])
			}
			if live != v.Live || want != v.Reach99 {
				t.Errorf("%s: %d live, 99%% in %v s; recomputed %d, %v s", name, v.Live, v.Reach99, live, want)
			}
		}
		if r.Propagation.AwakeMedianRatio99 > r.Propagation.MedianRatio99 {
			t.Errorf("seed %d: median ratio %v over those that stayed up, %v over all", o.Seed, r.Propagation.AwakeMedianRatio99, r.Propagation.MedianRatio99)
		}
	}
	if excluded == 0 {
		t.Error("no device slept before it had a version: the churn scenario did not exercise the measure")
	}
}

// The bound given the cut is a lower bound device by device: no device the
// partition held a version back from holds it before the earliest time
// cutOff gives; it is never under the plain bound, and is the plain bound
// where the cut held nothing back (in every scenario but Partition).
func TestCutBound(t *testing.T) {
	check := func(name string, w *world, r *Report) (raised []VersionReport) {
		t.Helper()
		for _, v := range r.Versions {
			name := fmt.Sprintf("%s v%d", name, v.Version)
			if v.CutBound99 < v.Bound99 || v.CutOff > v.Live {
				t.Errorf("%s: %d cut off of %d, bound given the cut %v s, bound %v s", name, v.CutOff, v.Live, v.CutBound99, v.Bound99)
			}
			if v.CutBound99 == v.Bound99 && v.CutRatio99 != v.Ratio99 {
				t.Errorf("%s: the same bounds, ratios %v and %v", name, v.CutRatio99, v.Ratio99)
			}
			if v.CutBound99 > v.Bound99 {
				raised = append(raised, v)
				if v.CutOff == 0 || v.Reach99 < v.CutBound99 {
					t.Errorf("%s: %d cut off, 99%% in %v s, bound given the cut %v s", name, v.CutOff, v.Reach99, v.CutBound99)
				}
			}
			earliest := w.cutOff(v.Version)
			if (earliest == nil) != (v.CutOff == 0) {
				t.Errorf("%s: %d cut off, held back from %d nodes", name, v.CutOff, len(earliest))
			}
			for i, e := range earliest {
				if at := w.reached[v.Version][i]; e >= 0 && at >= 0 && at < e {
					t.Errorf("%s: %s held it at %v, the earliest it could was %v", name, w.nodes[i].pid, at, e)
				}
			}
		}
		if r.Scenario != Partition {
			p := r.Propagation
			if len(raised) > 0 || p.CutMedianRatio99 != p.MedianRatio99 || p.CutMaxRatio99 != p.MaxRatio99 || p.CutWithin2x != p.Within2x {
				t.Errorf("%s: no partition, yet the bound given the cut differs: %+v", name, p)
			}
		}
		return raised
	}
	for _, sc := range []string{Baseline, Churn, Partition} {
		for seed := range seeds(t, 2) {
			o := Options{Nodes: 150, Seed: uint64(seed + 1), Versions: 3, Scenario: sc}
			w, err := newWorld(o, DefAll)
			if err != nil {
				t.Fatal(err)
			}
			w.run()
			check(fmt.Sprintf("%s/seed %d", sc, o.Seed), w, w.report())
		}
	}
	// At 1,000 devices, seed 7, the versions published while the network
	// was cut (v2 and v3) could not reach the far side before the heal: the
	// bound given the cut is above the plain one. v1 had reached both sides
	// before the cut, v4 came after the heal.
	w, err := newWorld(Options{Nodes: 1000, Trainers: 3, Seed: 7, Scenario: Partition}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	w.run()
	raised := check("1000 devices", w, w.report())
	c := w.cut
	if c == nil || c.healed < 0 {
		t.Fatal("the partition scenario recorded no cut and heal")
	}
	var during []uint64
	for v := 1; v < len(w.pubAt); v++ {
		if w.pubAt[v] >= c.began && w.pubAt[v] < c.healed {
			during = append(during, uint64(v))
		}
	}
	if len(during) == 0 || len(raised) != len(during) {
		t.Fatalf("published during the cut: %v; bound raised for %d versions", during, len(raised))
	}
	for k, v := range raised {
		if v.Version != during[k] {
			t.Errorf("bound raised for v%d, published at %v s; published during the cut: %v", v.Version, v.Published, during)
		}
	}
	// The cut holds a version back only from a side where no node had a
	// byte of it: had a node there begun to fetch it before the cut, or
	// published it during the cut, the plain bound stands.
	v := during[0]
	far := -1
	for i, e := range w.cutOff(v) {
		if e >= 0 {
			far = i
			break
		}
	}
	had := c.had[far]
	c.had[far] = v
	if w.cutOff(v) != nil {
		t.Errorf("v%d: held back though %s had a byte of it when the cut began", v, w.nodes[far].pid)
	}
	c.had[far] = had
	by := w.pubBy[v+1]
	w.pubBy[v+1] = far
	if w.cutOff(v) != nil {
		t.Errorf("v%d: held back though v%d was published on the far side during the cut", v, v+1)
	}
	w.pubBy[v+1] = by
	if w.cutOff(v) == nil {
		t.Errorf("v%d: not held back once restored", v)
	}
}

// Hole punching 0 leaves every NAT-to-NAT connection carrying nothing; 1
// makes every one direct where either device holds a relay reservation;
// the draw changes nothing else of the network. Nothing crosses a relay.
func TestHolePunch(t *testing.T) {
	run := func(hp float64) (*world, *Report) {
		w, err := newWorld(Options{Nodes: 150, Seed: 4, Versions: 2, HolePunch: hp}, DefAll)
		if err != nil {
			t.Fatal(err)
		}
		w.run()
		r := w.report()
		if !r.Invariants.OK {
			t.Errorf("hole punching %v: %v", hp, r.Invariants.Violations)
		}
		if r.Bytes.RelayedMiB != 0 {
			t.Errorf("hole punching %v: %v MiB through relays", hp, r.Bytes.RelayedMiB)
		}
		return w, r
	}
	w0, none := run(-1)
	w1, all := run(1)
	_, def := run(0)
	if none.Options.HolePunch != 0 || all.Options.HolePunch != 1 || def.Options.HolePunch != DefaultHolePunch {
		t.Errorf("hole punching reported as %v, %v, %v", none.Options.HolePunch, all.Options.HolePunch, def.Options.HolePunch)
	}
	// 150 devices: 3 relays take every NAT device's reservation.
	if none.Network.NATPairs == 0 || none.Network.Punched != 0 || all.Network.Reserved != all.Network.NAT {
		t.Errorf("no hole punching: %d NAT pairs, %d direct; %d of %d NAT devices reserved", none.Network.NATPairs, none.Network.Punched, all.Network.Reserved, all.Network.NAT)
	}
	if all.Network.Punched != all.Network.NATPairs {
		t.Errorf("all punched: %d of %d NAT pairs direct", all.Network.Punched, all.Network.NATPairs)
	}
	if share := float64(def.Network.Punched) / float64(def.Network.NATPairs); share < 0.55 || share > 0.85 {
		t.Errorf("default: %d of %d NAT pairs punched (%.2f), want about %v", def.Network.Punched, def.Network.NATPairs, share, DefaultHolePunch)
	}
	// The draw changes which peers a device dials (it dials on while too
	// few of its connections carry anything), nothing else.
	a, b := none.Network, all.Network
	a.Punched, b.Punched, a.NATPairs, b.NATPairs, a.MeanDegree, b.MeanDegree = 0, 0, 0, 0, 0, 0
	if a != b {
		t.Errorf("hole punching changed the drawn network: %+v, %+v", none.Network, all.Network)
	}
	// Per pair: both directions agree, and a NAT pair carries anything
	// exactly when it is punched.
	for _, w := range []*world{w0, w1} {
		for i := range w.o.Nodes {
			a := w.nodes[i]
			for _, j := range a.nbrs {
				b := w.nodes[j]
				if w.punched(a, b) != w.punched(b, a) || w.linked(a, b) != w.linked(b, a) {
					t.Fatalf("hole punching %v: %s-%s punched or linked one way only", w.o.HolePunch, a.pid, b.pid)
				}
				if want := !a.nat || !b.nat || w.o.HolePunch > 0; w.linked(a, b) != want {
					t.Fatalf("hole punching %v: %s-%s linked %v, want %v", w.o.HolePunch, a.pid, b.pid, w.linked(a, b), want)
				}
			}
		}
	}
}

// TestRelayReservations: a relay takes at most relayReservations NAT
// devices; two NAT devices neither of which holds a reservation never
// connect, punched or not.
func TestRelayReservations(t *testing.T) {
	w, err := newWorld(Options{Nodes: 1000, Trainers: 3, Seed: 7, NATShare: 0.7, Relays: 2, HolePunch: 1}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	taken := map[int]int{}
	nat, without := 0, 0
	for _, n := range w.nodes {
		if !n.nat {
			if n.relay >= 0 {
				t.Fatalf("%s is public, yet holds a reservation", n.pid)
			}
			continue
		}
		nat++
		if n.relay < 0 {
			without++
			continue
		}
		if !w.nodes[n.relay].isRelay {
			t.Fatalf("%s holds a reservation on %s, not a relay", n.pid, w.nodes[n.relay].pid)
		}
		taken[n.relay]++
	}
	if len(taken) != 2 || nat-without != 2*relayReservations {
		t.Fatalf("%d NAT devices, %d without a reservation, reservations by relay %v", nat, without, taken)
	}
	unlinked := 0
	for _, a := range w.nodes {
		for _, j := range a.nbrs {
			if b := w.nodes[j]; a.nat && b.nat && a.relay < 0 && b.relay < 0 {
				unlinked++
				if w.linked(a, b) || w.reach(a, b) {
					t.Fatalf("%s and %s, neither with a reservation, are linked", a.pid, b.pid)
				}
			}
		}
	}
	if unlinked == 0 {
		t.Error("no pair of NAT devices without reservations: the test shows nothing")
	}
}

func TestPoisonDefences(t *testing.T) {
	o := Options{Nodes: 200, Seed: 3, Scenario: Poison, Versions: 8}
	r, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]PoisonRun{}
	for _, p := range r.Poison {
		got[p.Defences] = p
		if len(p.Scores) != 8 {
			t.Errorf("%s: %d scores, want 8", p.Defences, len(p.Scores))
		}
	}
	clean, all, none := got["all (no malicious)"], got["all"], got["none"]
	if clean.Final < 0.8 {
		t.Errorf("the clean run learnt to %.3f only", clean.Final)
	}
	if all.Final < 0.9*clean.Final {
		t.Errorf("with 10%% malicious and every defence: %.3f, clean %.3f (want within 10%%)", all.Final, clean.Final)
	}
	if none.Final > 0.5*clean.Final {
		t.Errorf("with no defence: %.3f, clean %.3f (want clearly worse)", none.Final, clean.Final)
	}
	if all.Refused == 0 || all.IntakeRefused == 0 {
		t.Errorf("all: %d refused by re-verification, %d at intake", all.Refused, all.IntakeRefused)
	}
}

func TestRelaysSweep(t *testing.T) {
	r, err := Run(Options{Nodes: 100, Seed: 2, Scenario: Relays, Versions: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Sweep) != 5 {
		t.Fatalf("%d sweep rows, want 5", len(r.Sweep))
	}
	if r.Sweep[0].NATShare != 0 || r.Sweep[0].RelayedMiB != 0 {
		t.Errorf("no NAT: %+v", r.Sweep[0])
	}
	for _, s := range r.Sweep {
		if !s.Converged || s.MedianReach99 <= 0 || s.HolePunch != DefaultHolePunch {
			t.Errorf("%+v", s)
		}
		if s.RelayedMiB != 0 || s.Reserved > s.Relays*relayReservations || s.Punched > s.NATPairs || (s.NATShare > 0) != (s.NATPairs > 0) {
			t.Errorf("NAT share %v, %d relays: %v MiB relayed, %d reserved, %d of %d NAT pairs direct", s.NATShare, s.Relays, s.RelayedMiB, s.Reserved, s.Punched, s.NATPairs)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Scenario: "storm"}, {Nodes: 2}, {Trainers: 65}, {Voters: 6}, {Trainers: 3, Voters: 4}, {Scenario: Trust, RogueVoters: 2}, {Scenario: Trust, RogueVolunteers: 4}, {SpotCheck: 1.5}, {NATShare: 1.5}, {Malicious: 0.6},
		{Duration: 1}, {Nodes: 10, Relays: 6}, {Trainers: 2, MaliciousTrainers: 1}, {HolePunch: 1.01}, {HolePunch: math.NaN()},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	// Defaults applied twice change nothing: "none" stays none.
	for _, o := range []Options{{}, {Scenario: Poison, NATShare: -1, HolePunch: -1, Malicious: -1, MaliciousTrainers: -1}, {Nodes: 5, Trainers: 5, Scenario: Poison}} {
		if d := o.WithDefaults(); d != d.WithDefaults() {
			t.Errorf("%+v: defaults %+v, twice %+v", o, d, d.WithDefaults())
		}
	}
}

// Options meaning "none" reach the run: no NAT, no malicious device or
// trainer.
func TestOptionsNone(t *testing.T) {
	r, err := Run(Options{Nodes: 60, Seed: 2, Versions: 2, Scenario: Poison, NATShare: -1, Malicious: -1, MaliciousTrainers: -1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Network.NAT != 0 || r.Bytes.RelayedMiB != 0 || r.Options.Malicious != 0 || r.Options.MalTrainers != 0 {
		t.Errorf("network %+v, options %+v, relayed %v MiB", r.Network, r.Options, r.Bytes.RelayedMiB)
	}
	for _, p := range r.Poison {
		if p.Refused != 0 || p.IntakeRefused != 0 {
			t.Errorf("%s: refused %d, at intake %d with no malicious device", p.Defences, p.Refused, p.IntakeRefused)
		}
	}
}

func BenchmarkSim1000(b *testing.B) {
	for i := range b.N {
		r, err := Run(Options{Nodes: 1000, Trainers: 3, Seed: uint64(i + 7)})
		if err != nil {
			b.Fatal(err)
		}
		if !r.Invariants.OK {
			b.Fatal(r.Invariants.Violations)
		}
		b.ReportMetric(float64(r.Events), "events/op")
		b.ReportMetric(r.Propagation.MedianRatio99, "median-99%/bound")
	}
}

// TestFetchPlan: the devices fetch with the real fetcher's plan: at a
// version's publication the trainers, serving maxServing requests each,
// answer the rest busy, the devices then fetch from one another, and every
// device but the revoked one ends holding the last version, its fetches
// done.
func TestFetchPlan(t *testing.T) {
	w, err := newWorld(Options{Nodes: 150, Seed: 3, Versions: 2}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	w.run()
	r := w.report()
	if !r.Invariants.OK {
		t.Fatal(r.Invariants.Violations)
	}
	if w.busyAnswers == 0 {
		t.Error("no holder ever answered busy")
	}
	var devices int64
	for i := range w.o.Nodes {
		devices += w.peers[i].bytesUp
	}
	if devices == 0 {
		t.Error("no device served another")
	}
	for i := range w.o.Nodes {
		if w.isVictim(i) { // revoked part way: cut off
			continue
		}
		if f := w.peers[i].fetch; f != nil {
			t.Errorf("%s still fetching v%d at the end", w.nodes[i].pid, f.v)
		}
		if w.peers[i].held != uint64(w.published) {
			t.Errorf("%s holds v%d of %d", w.nodes[i].pid, w.peers[i].held, w.published)
		}
	}
}

// The simulator's devices take only versions the voters certified: every
// version published carries a quorum's votes, and a trainer's own v1000
// with made-up numbers, or a version with one voter's vote, is refused.
func TestDevicesRequireCertification(t *testing.T) {
	w, err := newWorld(Options{Nodes: 60, Seed: 1, Versions: 2}, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	w.run()
	if r := w.report(); !r.Invariants.OK {
		t.Fatalf("the run: %v", r.Invariants.Violations)
	}
	b := -1
	for i := range w.o.Nodes {
		if p := w.peers[i]; p.last != nil && p.last.Version == w.newest {
			b = i
			break
		}
	}
	if b < 0 {
		t.Fatal("no device accepted the newest version")
	}
	last := w.peers[b].last
	if err := last.VerifyCertified(w.adminPub, w.voterSet); err != nil {
		t.Fatalf("the newest version: %v", err)
	}
	tr := w.peers[w.trainers[len(w.trainers)-1].n.id]
	forge := func(votes int) []byte {
		m, err := chunks.NewManifest([]byte("a rogue bundle"))
		if err != nil {
			t.Fatal(err)
		}
		m.MeshID, m.Version, m.Parent, m.Term, m.Index = w.meshID, 1000, 999, 1<<30, 1<<40
		if votes > 0 {
			var vs []chunks.Vote
			for _, v := range w.voters()[:votes] {
				vote, err := m.VoteFor(w.peers[v.n.id].key, string(v.n.pid), w.voterSet)
				if err != nil {
					t.Fatal(err)
				}
				vs = append(vs, vote)
			}
			m.Certify(w.voterSet, vs)
		}
		if err := m.Sign(tr.key, tr.cert, wall(w.now)); err != nil {
			t.Fatal(err)
		}
		return m.Marshal()
	}
	for name, data := range map[string][]byte{"a trainer's own v1000": forge(0), "a v1000 with one vote": forge(1)} {
		refused := w.offersRefused
		if w.handleOffer(b, data) || w.offersRefused != refused+1 || w.peers[b].last != last {
			t.Errorf("%s: taken, the device's last is v%d", name, w.peers[b].last.Version)
		}
	}
	if !w.handleOffer(b, last.Marshal()) || w.peers[b].last != last {
		t.Error("the newest version offered again is refused")
	}
}
