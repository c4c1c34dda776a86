package sim

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
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
	o := Options{Nodes: 120, Seed: 7, Versions: 3, Scenario: Churn}
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
		t.Errorf("the same seed gave different JSON:\n%s\n%s", ja, jb)
	}
	if !bytes.Equal(ta, tb) {
		t.Errorf("the same seed gave different tables:\n%s\n%s", ta, tb)
	}
	if !strings.HasPrefix(string(ta), "seed 7,") {
		t.Errorf("the table does not start with its seed: %q", ta[:min(len(ta), 40)])
	}
	o.Seed = 8
	c, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	if jc, _ := encode(t, c); bytes.Equal(ja, jc) {
		t.Error("seeds 7 and 8 gave the same JSON")
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
		if !s.Converged || s.MedianReach99 <= 0 {
			t.Errorf("%+v", s)
		}
		if s.NATShare > 0 && s.RelayedMiB == 0 {
			t.Errorf("NAT share %v moved nothing through relays", s.NATShare)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Scenario: "storm"}, {Nodes: 2}, {Trainers: 10}, {NATShare: 1.5}, {Malicious: 0.6},
		{Duration: 1}, {Nodes: 10, Relays: 6}, {Trainers: 2, MaliciousTrainers: 1},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	// Defaults applied twice change nothing: "none" stays none.
	for _, o := range []Options{{}, {Scenario: Poison, NATShare: -1, Malicious: -1, MaliciousTrainers: -1}, {Nodes: 5, Trainers: 5, Scenario: Poison}} {
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
