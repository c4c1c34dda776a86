package sim

import (
	"bytes"
	"testing"
)

// trustWorld runs the trust scenario's world (no sweep) for o.
func trustWorld(t *testing.T, o Options) *world {
	t.Helper()
	o.Scenario = Trust
	w, err := newWorld(o, DefAll)
	if err != nil {
		t.Fatal(err)
	}
	w.run()
	return w
}

// A rogue voter below quorum leads first and forges a version: the
// honest voters refuse it, it is retracted, and no device ever accepts
// it or any uncertified version; the run's invariants hold, over seeds.
func TestTrustRogueVoter(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		w := trustWorld(t, Options{Nodes: 80, Seed: seed, Versions: 3})
		tr := w.trust
		r := w.report()
		if !r.Invariants.OK {
			t.Errorf("seed %d: %v", seed, r.Invariants.Violations)
		}
		if tr.forgedVersions == 0 || tr.retractions != tr.forgedVersions {
			t.Errorf("seed %d: %d forged versions, %d retracted", seed, tr.forgedVersions, tr.retractions)
		}
		if tr.forgedOffers == 0 || tr.forgedAccepted+tr.uncertifiedAccept != 0 {
			t.Errorf("seed %d: devices refused %d offers of a forged version and accepted %d", seed, tr.forgedOffers, tr.forgedAccepted+tr.uncertifiedAccept)
		}
		for i, p := range w.peers[:w.o.Nodes] {
			if p.last == nil {
				continue
			}
			if tr.forged[p.last.AdapterHash] {
				t.Errorf("seed %d: %s holds a forged version", seed, w.nodes[i].pid)
			}
			if err := p.last.VerifyCertified(w.adminPub, p.voters); err != nil {
				t.Errorf("seed %d: %s holds an uncertified version: %v", seed, w.nodes[i].pid, err)
			}
		}
		if r.Work.TrainedTwice != 0 || len(r.Versions) != 3 {
			t.Errorf("seed %d: %d versions, %d batches trained twice", seed, len(r.Versions), r.Work.TrainedTwice)
		}
	}
}

// The invariant catches a device that accepts a forged version.
func TestTrustForgedAcceptCaught(t *testing.T) {
	w := trustWorld(t, Options{Nodes: 40, Seed: 1, Versions: 2, RogueVolunteers: -1, Flooders: -1})
	m := w.peers[0].last
	if m == nil {
		t.Fatal("device 0 holds no version")
	}
	w.trust.forged[m.AdapterHash] = true
	w.accepted(0, m)
	if r := w.report(); r.Invariants.OK {
		t.Error("a forged version accepted, and the invariants held")
	}
}

// A rogue volunteer is benched within benchBound rounds of handing in
// forged deltas at the default spot-check share, over seeds; an honest
// volunteer never is; with no spot checks no one is.
func TestTrustRogueVolunteerBenched(t *testing.T) {
	bound := benchBound(3, DefaultSpotCheck)
	if bound != 18 {
		t.Fatalf("bound for 3 volunteers at 0.1: %d rounds, want 18 (1 of 3 checked a round: (2/3)^18 < 0.001)", bound)
	}
	for seed := uint64(1); seed <= 5; seed++ {
		o := Options{Nodes: 40, Seed: seed, Versions: bound + 2, RogueVoters: -1, Flooders: -1, RogueVolunteers: 2}
		w := trustWorld(t, o)
		tr := w.trust
		for i, f := range tr.forge {
			switch {
			case f != 0 && tr.benchedIn[i] == 0:
				t.Errorf("seed %d: rogue volunteer %d never benched in %d rounds", seed, i, tr.contributed[i])
			case f != 0 && tr.benchedAt[i] > bound:
				t.Errorf("seed %d: rogue volunteer %d benched after %d rounds, over the bound %d", seed, i, tr.benchedAt[i], bound)
			case f == 0 && tr.benchedIn[i] != 0:
				t.Errorf("seed %d: honest trainer %d benched", seed, i)
			}
		}
		if r := w.report(); !r.Invariants.OK {
			t.Errorf("seed %d: %v", seed, r.Invariants.Violations)
		}
		if seed > 1 {
			continue
		}
		o.SpotCheck = -1
		w = trustWorld(t, o)
		if w.trust.caught != 0 || w.trust.checks != 0 {
			t.Errorf("seed %d: no spot checks, and %d caught", seed, w.trust.caught)
		}
	}
}

// A flooding device's announcements past its token bucket are dropped
// with strikes, it is disconnected again and again, and the honest
// devices' batches reach the ledger as fast as in the clean run.
func TestTrustFlood(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		o := Options{Nodes: 80, Seed: seed, Versions: 2, RogueVoters: -1, RogueVolunteers: -1}
		w := trustWorld(t, o)
		o.Flooders = -1
		c := trustWorld(t, o)
		tr := w.trust
		// The bucket: at most its burst and its rate over the run, per
		// trainer.
		most := len(w.trainers) * (128 + int(8*seconds(w.now)) + 1)
		if tr.taken > most || tr.dropped == 0 || tr.disconnects == 0 || tr.dropped <= tr.taken {
			t.Errorf("seed %d: %d announced, %d taken (at most %d), %d dropped, %d disconnections", seed, tr.announced, tr.taken, most, tr.dropped, tr.disconnects)
		}
		tw := w.trustReport(w.report(), c.report(), c)
		if !tw.FloodWithin || len(tr.ingest) == 0 {
			t.Errorf("seed %d: honest ingest 99%% %v s against %v s clean, reach %v s against %v s: not within %v", seed, tw.Ingest99S, tw.CleanIngest99S, tw.MedianReach99S, tw.CleanMedianReach99S, floodBound)
		}
		if r := w.report(); !r.Invariants.OK {
			t.Errorf("seed %d: %v", seed, r.Invariants.Violations)
		}
	}
}

// The trust scenario's report is the same for the same seed, and its
// sweep finds the share absorbed where its rows say.
func TestTrustReport(t *testing.T) {
	if testing.Short() {
		t.Skip("the sweep runs 18 worlds")
	}
	o := Options{Nodes: 60, Seed: 3, Versions: 3, Scenario: Trust}
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
	if !bytes.Equal(ja, jb) || !bytes.Equal(ta, tb) {
		t.Error("the same seed gave different reports")
	}
	tr := a.Trust
	if tr == nil || len(tr.Sweep) != 6 || !tr.Sweep[0].Within || tr.Sweep[0].WorstRatio != 1 {
		t.Fatalf("trust report: %+v", tr)
	}
	want := 0.0
	for _, r := range tr.Sweep {
		if !r.Within {
			break
		}
		want = r.Share
	}
	if tr.Absorbed != want || !bytes.Contains(ta, []byte("absorbed: up to")) {
		t.Errorf("absorbed %v, the rows say %v", tr.Absorbed, want)
	}
}
