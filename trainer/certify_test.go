package trainer_test

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// shipBatches ships n synthetic batches into c.
func shipBatches(t *testing.T, c *harness.Cluster, n int, seed uint64) []core.BatchID {
	t.Helper()
	var ids []core.BatchID
	for i := range n {
		p, err := harness.SyntheticBatch(seed+uint64(i), 8, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.Ship(p))
	}
	return ids
}

// Two trusted trainers and a volunteer: the volunteer trains shares but
// never votes in raft and never certifies; every version is certified by
// the voters' quorum before the next round trains from it, and the
// manifest the devices get carries the votes.
func TestVersionsCertifiedByVoters(t *testing.T) {
	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 3, Volunteers: []int{2}, Timing: testTiming, Group: testGroup,
		Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	volunteer := c.Trainer(2).ID()
	if err := c.WaitUntil(ctx, clusterWait, "a leader with the two voters voting and the volunteer not", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		return len(st.Voters) == 2 && slices.Contains(st.Nonvoters, volunteer) && st.Version != nil
	}); err != nil {
		t.Fatal(err)
	}
	if st := c.Trainer(2).Status(); st.Trusted || st.VoterSet != c.Voters().Seq() || len(st.Trust) != 2 {
		t.Fatalf("the volunteer's status: trusted %v, voter set %d, %d trusted", st.Trusted, st.VoterSet, len(st.Trust))
	}
	ids := shipBatches(t, c, 8, 100)
	if err := c.WaitUntil(ctx, clusterWait, "every batch trained and the newest version certified", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		return st.Batches.Trained == len(ids) && st.Certified
	}); err != nil {
		t.Fatal(err)
	}
	i, _ := c.Leader()
	lead := c.Trainer(i)
	checkLedger(t, lead, ids)
	volunteered := false
	for _, v := range lead.Lineage()[1:] {
		if v.Cert == nil {
			t.Fatalf("%s is not certified", v.Name())
		}
		if len(v.Cert.Votes) < 2 {
			t.Fatalf("%s certified by %d votes of 2 voters", v.Name(), len(v.Cert.Votes))
		}
		for _, vt := range v.Cert.Votes {
			if vt.Peer == volunteer {
				t.Fatalf("the volunteer voted for %s", v.Name())
			}
		}
		for _, ct := range v.Contributors {
			volunteered = volunteered || ct.Trainer == volunteer
		}
	}
	if !volunteered {
		t.Log("the volunteer trained no share of these rounds") // shares go by speed; not an error
	}
	// What the devices are offered carries the votes, and checks out
	// against the admin's voter set.
	if err := c.WaitUntil(ctx, clusterWait, "the newest version shared certified", func() bool {
		m := lead.LatestShared()
		return m != nil && m.Version == lead.Status().Version.Version.Version
	}); err != nil {
		t.Fatal(err)
	}
	m := lead.LatestShared()
	admin, err := mesh.LoadAdminKey(filepath.Join(c.Dir, "node"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.VerifyCertified(admin.Public().(ed25519.PublicKey), c.Voters()); err != nil {
		t.Fatalf("the shared manifest: %v", err)
	}
}

// nudgeFirstWeight returns a tamper hook that adds by to the first weight
// of the bundle in dir. It counts its calls in calls and, with first > 0,
// nudges only the first first of them.
func nudgeFirstWeight(t *testing.T, by float32, calls *atomic.Int32, first int32) func(dir string) {
	return func(dir string) {
		if c := calls.Add(1); first > 0 && c > first {
			return
		}
		b, err := adapter.Read(dir)
		if err != nil {
			t.Error(err)
			return
		}
		b.Tensors[0].Data[0] += by
		os.RemoveAll(dir)
		if err := b.Write(dir); err != nil {
			t.Error(err)
		}
	}
}

// A rogue leader publishes a version that is not what its round's deltas
// make: the voters, recomputing it, refuse it; it is retracted, never
// shared, and its batches are trained again into a version they certify.
func TestRogueLeadersVersionRetracted(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	var tampered atomic.Int32
	for i := range c.Len() {
		c.Trainer(i).SetTamper(nudgeFirstWeight(t, 0.5, &tampered, 1)) // only the first version is forged
	}
	ids := shipBatches(t, c, 4, 200)
	var retracted []group.Retracted
	if err := c.WaitUntil(ctx, clusterWait, "the forged version retracted and every batch trained into certified versions", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		c.Trainer(i).ViewGroup(func(s *group.State) { retracted = slices.Clone(s.Retracted) })
		return st.Retracted > 0 && st.Batches.Trained == len(ids) && st.Certified
	}); err != nil {
		t.Fatal(err)
	}
	if tampered.Load() < 2 {
		t.Fatalf("the tamper hook ran %d times", tampered.Load())
	}
	r := retracted[0]
	if r.Version != 1 {
		t.Fatalf("retracted: %+v", r)
	}
	i, _ := c.Leader()
	lead := c.Trainer(i)
	checkLedger(t, lead, ids)
	for _, v := range lead.Lineage()[1:] {
		if v.Cert == nil || v.Hash == r.Hash {
			t.Fatalf("%s (%s) in the lineage: certified %v, the retracted one %v", v.Name(), core.ShortHash(v.Hash), v.Cert != nil, v.Hash == r.Hash)
		}
	}
	for k := range c.Len() {
		if m := c.Trainer(k).LatestShared(); m != nil && m.AdapterHash == r.Hash {
			t.Fatalf("trainer %d shared the forged version", k)
		}
	}
}

// Rounds whose deltas change nothing make versions with their parent's
// bundle, one after another: each is still checked, voted for and
// certified on its own (a vote for one is not taken for the next).
func TestSameBundleVersionsCertified(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	for i := range c.Len() {
		c.Trainer(i).SetForgeDelta(func(payload []byte) []byte {
			d, err := adapter.UnmarshalDelta(payload, adapter.Limits{})
			if err != nil {
				return payload
			}
			for _, tn := range d.Tensors {
				clear(tn.Data)
			}
			out, err := d.MarshalBinary()
			if err != nil {
				t.Error(err)
				return payload
			}
			return out
		})
	}
	var ids []core.BatchID
	for k := range 3 {
		ids = append(ids, shipBatches(t, c, 2, 300+uint64(k)*10)...)
		if err := c.WaitUntil(ctx, clusterWait, "the batches trained into a certified version", func() bool {
			i, ok := c.Leader()
			if !ok {
				return false
			}
			st := c.Trainer(i).Status()
			return st.Batches.Trained == len(ids) && st.Round == nil && st.Certified
		}); err != nil {
			t.Fatal(err)
		}
	}
	i, _ := c.Leader()
	lead := c.Trainer(i)
	lin := lead.Lineage()
	if len(lin) < 3 {
		t.Fatalf("%d versions", len(lin))
	}
	for _, v := range lin[1:] {
		if v.Hash != lin[0].Hash || v.Cert == nil {
			t.Fatalf("%s: hash %s (v0 %s), certified %v", v.Name(), core.ShortHash(v.Hash), core.ShortHash(lin[0].Hash), v.Cert != nil)
		}
	}
	if st := lead.Status(); st.Retracted != 0 {
		t.Fatalf("%d versions retracted", st.Retracted)
	}
	checkLedger(t, lead, ids)
}

// A version that differs from a voter's recomputation by rounding alone
// (as float arithmetic on another machine may) is certified; one that
// differs by more is not (TestRogueLeadersVersionRetracted).
func TestRoundingDifferenceCertified(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	var nudged atomic.Int32
	for i := range c.Len() {
		c.Trainer(i).SetTamper(nudgeFirstWeight(t, 2e-6, &nudged, 0))
	}
	ids := shipBatches(t, c, 4, 700)
	if err := c.WaitUntil(ctx, clusterWait, "every batch trained into certified versions", func() bool {
		i, ok := c.Leader()
		if !ok {
			return false
		}
		st := c.Trainer(i).Status()
		return st.Batches.Trained == len(ids) && st.Round == nil && st.Certified
	}); err != nil {
		t.Fatal(err)
	}
	i, _ := c.Leader()
	if st := c.Trainer(i).Status(); st.Retracted != 0 || nudged.Load() == 0 {
		t.Fatalf("%d versions retracted, %d nudged", st.Retracted, nudged.Load())
	}
}

// A rogue leader publishes a version its round did not make and never
// retracts it: the honest voters, refusing it, stop answering that leader,
// which loses its quorum; the new leader they elect retracts the version,
// and the batches are trained again into certified versions.
func TestRogueLeaderDeposed(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx := context.Background()
	rogue, _ := c.Leader()
	rogueID := c.Trainer(rogue).ID()
	c.Trainer(rogue).SetNoRetract(true)
	c.Trainer(rogue).SetTamper(nudgeFirstWeight(t, 0.5, new(atomic.Int32), 0))
	ids := shipBatches(t, c, 4, 800)
	if err := c.WaitUntil(ctx, clusterWait, "an honest leader with every batch trained into certified versions", func() bool {
		i, ok := c.Leader()
		if !ok || i == rogue {
			return false
		}
		st := c.Trainer(i).Status()
		return st.Retracted > 0 && st.Batches.Trained == len(ids) && st.Round == nil && st.Certified
	}); err != nil {
		t.Fatal(err)
	}
	i, _ := c.Leader()
	lead := c.Trainer(i)
	checkLedger(t, lead, ids)
	for _, v := range lead.Lineage()[1:] {
		if v.Cert == nil || v.Publisher == rogueID {
			t.Fatalf("%s in the lineage: certified %v, published by the rogue %v", v.Name(), v.Cert != nil, v.Publisher == rogueID)
		}
	}
}
