package trainer_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// drawOf is a draw like the leader's: a function of the round and the
// trainer.
func drawOf(round uint64) func(mesh.PeerID) float64 {
	return func(p mesh.PeerID) float64 {
		return trainer.SpotDraw(append(binary.BigEndian.AppendUint64(nil, round), p...))
	}
}

func TestSpotSample(t *testing.T) {
	vs := []mesh.PeerID{"v3", "v1", "v2", "v4", "v5"}
	cases := []struct {
		name     string
		vs       []mesh.PeerID
		rate     float64
		min, max int
	}{
		{"off", vs, 0, 0, 0},
		{"no volunteer", nil, 0.5, 0, 0},
		{"every one", vs, 1, len(vs), len(vs)},
		{"at least one", vs, 1e-9, 1, 1},
		{"one volunteer", vs[:1], 0.1, 1, 1},
		{"a sample", vs, 0.5, 1, len(vs)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for round := range uint64(200) {
				got := trainer.SpotSample(c.vs, c.rate, drawOf(round))
				if len(got) < c.min || len(got) > c.max {
					t.Fatalf("round %d: %d picked of %d at rate %g, want %d to %d", round, len(got), len(c.vs), c.rate, c.min, c.max)
				}
				if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
					t.Fatalf("round %d: %v", round, got)
				}
				for _, p := range got {
					if !slices.Contains(c.vs, p) {
						t.Fatalf("round %d: %s picked, not a volunteer", round, p)
					}
				}
				if again := trainer.SpotSample(c.vs, c.rate, drawOf(round)); !slices.Equal(again, got) {
					t.Fatalf("round %d: %v, then %v", round, got, again)
				}
			}
		})
	}
	// Over many rounds of many volunteers, the sample is about the rate.
	var many []mesh.PeerID
	for i := range 50 {
		many = append(many, mesh.PeerID(fmt.Sprintf("volunteer-%d", i)))
	}
	for _, rate := range []float64{0.05, 0.1, 0.25} {
		n := 0
		for round := range uint64(200) {
			n += len(trainer.SpotSample(many, rate, drawOf(round)))
		}
		if got := float64(n) / (200 * 50); got < rate*0.8 || got > rate*1.2 {
			t.Errorf("rate %g: %.3f of the deltas picked", rate, got)
		}
	}
}

// spotCluster is a cluster of two voters and a volunteer (trainer 2) in
// which every leader checks every volunteer's delta.
func spotCluster(t *testing.T) (*harness.Cluster, mesh.PeerID) {
	t.Helper()
	// A round waits for the four batches shipUntil ships at a time (or
	// a few seconds), so that every trainer gets a share of it; it closes
	// as soon as every delta is in, and its deadline leaves a loaded
	// machine (or the race detector) time to train and retrain shares.
	g := testGroup
	g.MinRoundSteps, g.RoundWait, g.Deadline = 4*8, 3*time.Second, 30*time.Second
	c, err := harness.NewCluster(context.Background(), harness.ClusterOptions{Trainers: 3, Volunteers: []int{2}, Timing: testTiming, Group: g,
		Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for i := range c.Len() {
		c.Trainer(i).SetSpotCheck(1)
	}
	if err := c.WaitUntil(context.Background(), clusterWait, "a leader with the three trainers registered", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		return len(st.Trainers) == 3 && st.Version != nil
	}); err != nil {
		t.Fatal(err)
	}
	return c, c.Trainer(2).ID()
}

// shipUntil ships batches a few at a time until cond holds with every
// batch shipped trained and the newest version certified. Every batch
// shipped before must be trained.
func shipUntil(t *testing.T, c *harness.Cluster, seed uint64, what string, cond func(lead *trainer.Trainer) bool) []core.BatchID {
	t.Helper()
	var ids []core.BatchID
	prior := 0 // the batches trained before, every one shipped before
	if err := c.WaitUntil(context.Background(), clusterWait, "a leader", func() bool {
		i, ok := c.Leader()
		if ok {
			prior = c.Trainer(i).Status().Batches.Trained
		}
		return ok
	}); err != nil {
		t.Fatal(err)
	}
	for k := range 8 {
		ids = append(ids, shipBatches(t, c, 4, seed+uint64(k)*10)...)
		var done bool
		if err := c.WaitUntil(context.Background(), clusterWait, "every batch trained into a certified version", func() bool {
			i, ok := c.Leader()
			if !ok {
				return false
			}
			st := c.Trainer(i).Status()
			if st.Batches.Trained != prior+len(ids) || !st.Certified || st.Round != nil {
				return false
			}
			done = cond(c.Trainer(i))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if done {
			return ids
		}
	}
	t.Fatalf("%s: not after %d batches", what, len(ids))
	return nil
}

func contributed(lead *trainer.Trainer, p mesh.PeerID) int {
	n := 0
	for _, v := range lead.Lineage() {
		for _, ct := range v.Contributors {
			if ct.Trainer == p {
				n++
			}
		}
	}
	return n
}

func spotChecks(c *harness.Cluster) int64 {
	var n int64
	for i := range c.Len() {
		if tr := c.Trainer(i); tr != nil {
			n += tr.SpotChecks()
		}
	}
	return n
}

// A volunteer whose deltas are forged (validly signed, not what its share
// makes) is caught by the leader's re-execution: its delta is left out,
// it is benched with the evidence and gets no share, its batches are
// trained by the voters into certified versions. Cleared through the
// admin API, it gets shares again.
func TestSpotCheckBenchesForger(t *testing.T) {
	c, volunteer := spotCluster(t)
	ctx := context.Background()
	// The volunteer is honest until it contributed once (so that the
	// group measured its speed), then forges every delta.
	ids := shipUntil(t, c, 300, "the volunteer contributing", func(lead *trainer.Trainer) bool { return contributed(lead, volunteer) > 0 })
	var forged atomic.Int32
	c.Trainer(2).SetForgeDelta(func(payload []byte) []byte {
		d, err := adapter.UnmarshalDelta(payload, adapter.Limits{})
		if err != nil {
			return payload // no sample: nothing to forge
		}
		d.Tensors[0].Data[0] += 0.01
		out, err := d.MarshalBinary()
		if err != nil {
			t.Error(err)
			return payload
		}
		forged.Add(1)
		return out
	})
	honest := contributed(c.Trainer(0), volunteer)
	benched := func(lead *trainer.Trainer) bool {
		return slices.ContainsFunc(lead.Status().Benched, func(b trainer.BenchedTrainer) bool { return b.Trainer == volunteer })
	}
	ids = append(ids, shipUntil(t, c, 400, "the volunteer benched", benched)...)
	i, _ := c.Leader()
	lead := c.Trainer(i)
	if forged.Load() == 0 {
		t.Fatal("no delta forged")
	}
	var rec group.BenchRecord
	lead.ViewGroup(func(s *group.State) { rec = s.Benched[volunteer] })
	ev := rec.Evidence
	if rec.Reason == "" || rec.Round == 0 || ev.Submitted == ev.Recomputed || !(ev.MaxAbsDiff > 0) || len(ev.Batches) == 0 || ev.Engine != trainer.EngineNative {
		t.Fatalf("the bench: %+v", rec)
	}
	// The forged delta went into no version: the volunteer contributed to
	// none, and every batch was trained by the voters.
	if n := contributed(lead, volunteer); n != honest {
		t.Fatalf("the forger contributed to %d versions, %d honestly", n, honest)
	}
	checkLedger(t, lead, ids)
	for _, v := range lead.Lineage()[1:] {
		if v.Cert == nil {
			t.Fatalf("%s is not certified", v.Name())
		}
	}
	// Benched, it gets no share.
	before := forged.Load()
	more := shipUntil(t, c, 500, "more batches trained", func(*trainer.Trainer) bool { return true })
	i, _ = c.Leader()
	lead = c.Trainer(i)
	checkLedger(t, lead, append(ids, more...))
	if forged.Load() != before || contributed(lead, volunteer) != honest {
		t.Fatalf("the benched volunteer trained %d more shares", forged.Load()-before)
	}
	// The admin clears it through a voter's admin API; it trains again.
	voter := 1 - min(i, 1) // a voter, the leader or not
	cl := &trainer.Client{Base: "http://" + c.Trainer(voter).Addr().String(), Token: adminapi.ClientToken(c.DataDir(voter), "")}
	if err := cl.Clear(ctx, volunteer); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "the clear applied", func() bool { return len(c.Trainer(voter).Status().Benched) == 0 }); err != nil {
		t.Fatal(err)
	}
	var se *adminapi.StatusError
	if err := cl.Clear(ctx, volunteer); !errors.As(err, &se) || se.Code != http.StatusNotFound {
		t.Fatalf("a second clear: %v", err)
	}
	if err := cl.Clear(ctx, "12D3KooWNoSuchTrainer"); !errors.As(err, &se) || se.Code != http.StatusNotFound {
		t.Fatalf("clearing an unknown peer: %v", err)
	}
	c.Trainer(2).SetForgeDelta(nil)
	shipUntil(t, c, 600, "the cleared volunteer contributing", func(lead *trainer.Trainer) bool {
		return contributed(lead, volunteer) > honest && len(lead.Status().Benched) == 0
	})
}

// An honest volunteer checked every round is never benched: the native
// engine retrains its share to the same bytes.
func TestSpotCheckHonestVolunteer(t *testing.T) {
	c, volunteer := spotCluster(t)
	shipUntil(t, c, 700, "the volunteer contributing to two versions", func(lead *trainer.Trainer) bool {
		return contributed(lead, volunteer) >= 2 && spotChecks(c) >= 2
	})
	i, _ := c.Leader()
	if b := c.Trainer(i).Status().Benched; len(b) != 0 {
		t.Fatalf("benched: %+v", b)
	}
}

// A volunteer that declares another engine than the leader's cannot be
// retrained by it: the leader gives it no share, and a delta drawn for a
// check that cannot run is left out, not taken on trust, so lying about
// its engine buys a forger nothing. It is not benched: nothing shows it
// lied.
func TestSpotCheckUncheckableLeftOut(t *testing.T) {
	c, volunteer := spotCluster(t)
	ctx := context.Background()
	ids := shipUntil(t, c, 800, "the volunteer contributing", func(lead *trainer.Trainer) bool { return contributed(lead, volunteer) > 0 })
	if err := c.Trainer(2).Declare(ctx, trainer.EngineTorch, trainer.DeviceCUDA); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitUntil(ctx, clusterWait, "the new registration applied", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		var eng string
		c.Trainer(i).ViewGroup(func(s *group.State) {
			if tr := s.Trainers[volunteer]; tr != nil {
				eng = tr.Engine
			}
		})
		return eng == trainer.EngineTorch
	}); err != nil {
		t.Fatal(err)
	}
	i, _ := c.Leader()
	before := contributed(c.Trainer(i), volunteer)
	ids = append(ids, shipUntil(t, c, 900, "more batches trained", func(*trainer.Trainer) bool { return true })...)
	ids = append(ids, shipUntil(t, c, 950, "more batches trained", func(*trainer.Trainer) bool { return true })...)
	i, _ = c.Leader()
	lead := c.Trainer(i)
	checkLedger(t, lead, ids)
	if n := contributed(lead, volunteer); n != before {
		t.Fatalf("the volunteer whose deltas cannot be checked contributed to %d more versions", n-before)
	}
	if b := lead.Status().Benched; len(b) != 0 {
		t.Fatalf("benched for an engine the leader does not run: %+v", b)
	}
}
