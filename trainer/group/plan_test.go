package group_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

// planState is a state at version `version` with the given trainers
// (id → speed) and batches added in order, one a second.
func planState(t testing.TB, cfg Config, version int, speeds map[mesh.PeerID]float64, batches []BatchRef) *grouptest.Fixture {
	f := grouptest.NewFixture(t)
	f.Must(&Entry{Configure: &cfg})
	f.Must(&Entry{Genesis: &Genesis{Hash: grouptest.HashN(0)}})
	ids := slices.Sorted(maps.Keys(speeds))
	for _, id := range ids {
		f.Must(&Entry{Register: &Trainer{ID: id, Speed: speeds[id]}})
	}
	// Versions 1..version, each from a round training one batch of its own.
	for v := 1; v <= version; v++ {
		id := core.BatchID(grouptest.HashN(1<<50 + v))
		f.Must(&Entry{Add: []BatchRef{{ID: id, From: "seed"}}})
		f.Must(&Entry{Start: &Start{Round: uint64(v), Base: uint64(v - 1), Shares: map[mesh.PeerID][]core.BatchID{ids[0]: {id}}}})
		f.Must(&Entry{Publish: &Publish{Round: uint64(v), Version: uint64(v), Parent: uint64(v - 1), Hash: grouptest.HashN(v), Contributors: []Contribution{{Trainer: ids[0], Batches: []core.BatchID{id}}}}})
	}
	for _, b := range batches {
		f.Must(&Entry{Add: []BatchRef{b}})
	}
	return f
}

// shareSteps sums the steps of each trainer's share, and checks the plan
// against the state: pending batches, live registered trainers, no batch
// twice, and that it applies.
func shareSteps(t *testing.T, s *State, st *Start, live []mesh.PeerID) (map[mesh.PeerID]int, int) {
	t.Helper()
	steps := map[mesh.PeerID]int{}
	total := 0
	seen := map[core.BatchID]bool{}
	for tr, ids := range st.Shares {
		if _, ok := s.Trainers[tr]; !ok || !slices.Contains(live, tr) {
			t.Errorf("share for %s, not a live registered trainer", tr)
		}
		if len(ids) == 0 {
			t.Errorf("empty share for %s", tr)
		}
		if !slices.IsSorted(ids) {
			t.Errorf("share of %s not sorted", tr)
		}
		for _, id := range ids {
			b := s.Batches[id]
			if b == nil || b.Status != Pending || seen[id] {
				t.Fatalf("batch %s planned: %+v", id, b)
			}
			seen[id] = true
			steps[tr] += max(b.Steps, 1)
			total += max(b.Steps, 1)
		}
	}
	c := grouptest.CloneState(t, s)
	if err := c.Apply(&Entry{Start: st}, s.Term, s.Index+1); err != nil {
		t.Fatalf("plan does not apply: %v", err)
	}
	if err := grouptest.CheckInvariants(c); err != nil {
		t.Fatalf("after the planned start: %v", err)
	}
	return steps, total
}

func unitBatches(n, devices, steps int) []BatchRef {
	var out []BatchRef
	for i := range n {
		out = append(out, BatchRef{ID: grouptest.Bid(i), From: mesh.PeerID(fmt.Sprintf("d%d", i%devices)), Steps: steps})
	}
	return out
}

func TestPlanProportional(t *testing.T) {
	cases := []struct {
		name   string
		speeds map[mesh.PeerID]float64
		refs   []BatchRef
	}{
		{"twice as fast", map[mesh.PeerID]float64{"a": 1, "b": 2}, unitBatches(300, 30, 1)},
		{"1:2:3", map[mesh.PeerID]float64{"a": 1, "b": 2, "c": 3}, unitBatches(600, 60, 1)},
		{"equal", map[mesh.PeerID]float64{"a": 5, "b": 5, "c": 5, "d": 5}, unitBatches(400, 40, 2)},
		{"mixed sizes", map[mesh.PeerID]float64{"a": 1, "b": 2, "c": 0.5}, func() []BatchRef {
			r := rand.New(rand.NewPCG(1, 2))
			var out []BatchRef
			for i := range 200 {
				out = append(out, BatchRef{ID: grouptest.Bid(i), From: mesh.PeerID(fmt.Sprintf("d%d", i%20)), Steps: 1 + r.IntN(16)})
			}
			return out
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := planState(t, Config{Quota: 1 << 20, RoundSteps: 1 << 20}, 0, c.speeds, c.refs)
			live := slices.Collect(maps.Keys(c.speeds))
			st, ok := f.S.Plan(grouptest.T0, "a", live)
			if !ok {
				t.Fatal("no plan")
			}
			steps, total := shareSteps(t, f.S, st, live)
			want := 0
			biggest := 0
			for _, r := range c.refs {
				want += max(r.Steps, 1)
				biggest = max(biggest, r.Steps)
			}
			if total != want {
				t.Fatalf("planned %d steps of %d", total, want)
			}
			var speed float64
			for _, s := range c.speeds {
				speed += s
			}
			for id, s := range c.speeds {
				target := float64(total) * s / speed
				if d := math.Abs(float64(steps[id]) - target); d > float64(biggest) {
					t.Errorf("%s (speed %v) got %d steps, target %.1f (shares %v)", id, s, steps[id], target, steps)
				}
			}
			if c.name == "twice as fast" && steps["b"] != 2*steps["a"] {
				t.Errorf("steps %v", steps)
			}
		})
	}
}

func TestPlanQuota(t *testing.T) {
	// d1: ten batches of 10 steps; quota 35 lets its three oldest in.
	// d2: its oldest is 100 steps, over the quota: it goes alone.
	// d3: 10 steps, then 100 (over the quota, not alone: skipped), then 20.
	var refs []BatchRef
	for i := range 10 {
		refs = append(refs, BatchRef{ID: grouptest.Bid(i), From: "d1", Steps: 10})
	}
	refs = append(refs,
		BatchRef{ID: grouptest.Bid(20), From: "d2", Steps: 100}, BatchRef{ID: grouptest.Bid(21), From: "d2", Steps: 1},
		BatchRef{ID: grouptest.Bid(30), From: "d3", Steps: 10}, BatchRef{ID: grouptest.Bid(31), From: "d3", Steps: 100}, BatchRef{ID: grouptest.Bid(32), From: "d3", Steps: 20},
		BatchRef{ID: grouptest.Bid(40), Steps: 0}, BatchRef{ID: grouptest.Bid(41), Steps: 0})
	f := planState(t, Config{Quota: 35, RoundSteps: 10000}, 0, map[mesh.PeerID]float64{"a": 1}, refs)
	live := []mesh.PeerID{"a"}
	st, ok := f.S.Plan(grouptest.T0, "a", live)
	if !ok {
		t.Fatal("no plan")
	}
	shareSteps(t, f.S, st, live)
	got := st.Shares["a"]
	want := []core.BatchID{grouptest.Bid(0), grouptest.Bid(1), grouptest.Bid(2), grouptest.Bid(20), grouptest.Bid(30), grouptest.Bid(32), grouptest.Bid(40), grouptest.Bid(41)}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("planned %v, want %v", names(got), names(want))
	}
	perDevice := map[mesh.PeerID]int{}
	for _, id := range got {
		b := f.S.Batches[id]
		perDevice[b.From] += max(b.Steps, 1)
	}
	for d, n := range perDevice {
		if n > 35 && d != "d2" {
			t.Errorf("device %s has %d steps, quota 35", d, n)
		}
	}
}

func TestPlanRoundSteps(t *testing.T) {
	// 50 batches of 7 steps from 50 devices; RoundSteps 100 takes 14.
	f := planState(t, Config{Quota: 1000, RoundSteps: 100}, 0, map[mesh.PeerID]float64{"a": 1, "b": 3}, unitBatches(50, 50, 7))
	live := []mesh.PeerID{"b", "a"}
	st, ok := f.S.Plan(grouptest.T0, "a", live)
	if !ok {
		t.Fatal("no plan")
	}
	_, total := shareSteps(t, f.S, st, live)
	if total != 98 {
		t.Errorf("planned %d steps, want 98", total)
	}
	// The oldest are taken.
	for _, ids := range st.Shares {
		for _, id := range ids {
			if !slices.Contains(unitIDs(14), id) {
				t.Errorf("batch %s is not among the 14 oldest", id)
			}
		}
	}

	// A batch larger than RoundSteps goes alone when it is the oldest, and
	// waits otherwise.
	big := append([]BatchRef{{ID: grouptest.Bid(100), From: "x", Steps: 500}}, unitBatches(5, 5, 1)...)
	f = planState(t, Config{Quota: 1000, RoundSteps: 100}, 0, map[mesh.PeerID]float64{"a": 1, "b": 1}, big)
	st, ok = f.S.Plan(grouptest.T0, "a", []mesh.PeerID{"a", "b"})
	if !ok || len(st.Shares) != 1 || !reflect.DeepEqual(slices.Concat(st.Shares["a"], st.Shares["b"]), []core.BatchID{grouptest.Bid(100)}) {
		t.Errorf("plan with a big oldest batch: %+v", st)
	}
	big = append(unitBatches(5, 5, 1), BatchRef{ID: grouptest.Bid(100), From: "x", Steps: 500})
	f = planState(t, Config{Quota: 1000, RoundSteps: 100}, 0, map[mesh.PeerID]float64{"a": 1, "b": 1}, big)
	st, ok = f.S.Plan(grouptest.T0, "a", []mesh.PeerID{"a", "b"})
	if !ok {
		t.Fatal("no plan")
	}
	if _, total := shareSteps(t, f.S, st, []mesh.PeerID{"a", "b"}); total != 5 {
		t.Errorf("planned %d steps, want the 5 small batches", total)
	}
}

// TestPlanGathers: with MinRoundSteps, a round waits until that many steps
// are pending or the oldest pending batch has waited RoundWait; task
// prompts do not wait.
func TestPlanGathers(t *testing.T) {
	cfg := Config{MinRoundSteps: 30, RoundWait: 20 * time.Second}
	// Three batches of 7 steps, added a second apart after the genesis.
	f := planState(t, cfg, 0, map[mesh.PeerID]float64{"a": 1}, unitBatches(3, 3, 7))
	oldest := f.S.Batches[unitIDs(1)[0]].Added
	live := []mesh.PeerID{"a"}
	if st, ok := f.S.Plan(oldest.Add(19*time.Second), "a", live); ok {
		t.Fatalf("a round of 21 steps started before the wait was over: %+v", st)
	}
	st, ok := f.S.Plan(oldest.Add(20*time.Second), "a", live)
	if !ok {
		t.Fatal("no round once the oldest batch had waited RoundWait")
	}
	if _, total := shareSteps(t, f.S, st, live); total != 21 {
		t.Errorf("planned %d steps, want all 21", total)
	}
	// Enough steps start a round at once.
	f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(50), From: "d9", Steps: 9}}})
	st, ok = f.S.Plan(oldest, "a", live)
	if !ok {
		t.Fatal("no round with 30 steps pending")
	}
	if _, total := shareSteps(t, f.S, st, live); total != 30 {
		t.Errorf("planned %d steps, want 30", total)
	}
	// The default starts a round on anything.
	f = planState(t, Config{}, 0, map[mesh.PeerID]float64{"a": 1}, unitBatches(1, 1, 1))
	if _, ok := f.S.Plan(grouptest.T0, "a", live); !ok {
		t.Fatal("the default config waited")
	}
	if err := (Config{MinRoundSteps: -1}).Validate(); err == nil {
		t.Error("a negative MinRoundSteps validated")
	}
	if err := (Config{RoundWait: -time.Second}).Validate(); err == nil {
		t.Error("a negative RoundWait validated")
	}
}

func TestPlanHugeSteps(t *testing.T) {
	// Step counts near the int limit must not overflow the quota sums.
	refs := []BatchRef{{ID: grouptest.Bid(0), From: "d1", Steps: math.MaxInt}, {ID: grouptest.Bid(1), From: "d1", Steps: 1}, {ID: grouptest.Bid(2), From: "d2", Steps: 1}, {ID: grouptest.Bid(3), From: "d2", Steps: math.MaxInt}}
	f := planState(t, Config{Quota: 10, RoundSteps: 100}, 0, map[mesh.PeerID]float64{"a": 1, "b": 1}, refs)
	st, ok := f.S.Plan(grouptest.T0, "a", []mesh.PeerID{"a", "b"})
	if !ok {
		t.Fatal("no plan")
	}
	if got := slices.Concat(st.Shares["a"], st.Shares["b"]); !reflect.DeepEqual(got, []core.BatchID{grouptest.Bid(0)}) {
		t.Errorf("planned %v, want the huge batch alone", names(got))
	}
	f.Must(&Entry{Start: st})
	f.Must(&Entry{Abort: &Abort{Round: 1}})
	f.Must(&Entry{Refuse: []Refusal{{ID: grouptest.Bid(0), Reason: "big"}}})
	st, ok = f.S.Plan(grouptest.T0, "a", []mesh.PeerID{"a", "b"})
	if !ok {
		t.Fatal("no plan")
	}
	if got := slices.Sorted(slices.Values(slices.Concat(st.Shares["a"], st.Shares["b"]))); !reflect.DeepEqual(got, []core.BatchID{grouptest.Bid(1), grouptest.Bid(2)}) {
		t.Errorf("planned %v, want batches 1 and 2", names(got))
	}
}

func TestPlanStale(t *testing.T) {
	refs := []BatchRef{
		{ID: grouptest.Bid(0), Steps: 1, Adapters: []string{"v0"}},       // 3 behind v3, lag 2: stale
		{ID: grouptest.Bid(1), Steps: 1, Adapters: []string{"v1"}},       // 2 behind: fresh enough
		{ID: grouptest.Bid(2), Steps: 1, Adapters: []string{"v0", "v3"}}, // partly fresh
		{ID: grouptest.Bid(3), Steps: 1, Adapters: []string{"local"}},    // not from the mesh
		{ID: grouptest.Bid(4), Steps: 1},                                 // base model
		{ID: grouptest.Bid(5), Steps: 1, Adapters: []string{"v0", "0"}},  // stale
	}
	f := planState(t, Config{MaxLag: 2, Quota: 100, RoundSteps: 100}, 3, map[mesh.PeerID]float64{"a": 1}, refs)
	stale := f.S.Stale()
	if want := []Refusal{{ID: grouptest.Bid(0), Reason: ReasonStale}, {ID: grouptest.Bid(5), Reason: ReasonStale}}; !reflect.DeepEqual(stale, want) {
		t.Errorf("Stale() = %v, want %v", stale, want)
	}
	st, ok := f.S.Plan(grouptest.T0, "a", []mesh.PeerID{"a"})
	if !ok {
		t.Fatal("no plan")
	}
	if want := []core.BatchID{grouptest.Bid(1), grouptest.Bid(2), grouptest.Bid(3), grouptest.Bid(4)}; !slices.Equal(st.Shares["a"], want) {
		t.Errorf("planned %v, want %v", names(st.Shares["a"]), names(want))
	}
	f.Must(&Entry{Refuse: stale})
	if got := f.S.Stale(); len(got) != 0 {
		t.Errorf("stale after refusing: %v", got)
	}
	if New().Stale() != nil {
		t.Errorf("stale before genesis")
	}
}

func TestPlanLive(t *testing.T) {
	f := planState(t, Config{}, 0, map[mesh.PeerID]float64{"a": 1, "b": 1, "c": 1}, unitBatches(30, 30, 1))
	// c is registered but not live; z is live but not registered; a twice.
	live := []mesh.PeerID{"z", "a", "b", "a", ""}
	st, ok := f.S.Plan(grouptest.T0, "a", live)
	if !ok {
		t.Fatal("no plan")
	}
	steps, _ := shareSteps(t, f.S, st, live)
	if len(st.Shares) != 2 || steps["a"] != 15 || steps["b"] != 15 {
		t.Errorf("shares %v", steps)
	}
	if _, ok := f.S.Plan(grouptest.T0, "a", []mesh.PeerID{"z", "y"}); ok {
		t.Errorf("plan with no live registered trainer")
	}
	if _, ok := f.S.Plan(grouptest.T0, "a", nil); ok {
		t.Errorf("plan with no live trainer")
	}
	f.Must(&Entry{Revoke: &Revocation{Peer: "b"}})
	st, ok = f.S.Plan(grouptest.T0, "a", live)
	if !ok || len(st.Shares) != 1 || len(st.Shares["a"]) != 30 {
		t.Errorf("plan after b's revocation: %+v", st)
	}
}

func TestPlanNothing(t *testing.T) {
	live := []mesh.PeerID{"t1", "t2", "t3"}
	// Before genesis.
	f := grouptest.NewFixture(t)
	f.Must(&Entry{Register: &Trainer{ID: "t1"}})
	f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(1)}}})
	if _, ok := f.S.Plan(grouptest.T0, "t1", live); ok {
		t.Errorf("plan before genesis")
	}
	// A round is open.
	if _, ok := grouptest.Open(t).S.Plan(grouptest.T0, "t1", live); ok {
		t.Errorf("plan with a round open")
	}
	// Nothing pending: all trained, refused or stale.
	f = grouptest.Published(t)
	f.Must(&Entry{Refuse: []Refusal{{ID: grouptest.Bid(4), Reason: "x"}, {ID: grouptest.Bid(5), Reason: "x"}}})
	f.Must(&Entry{Start: &Start{Round: 2, Base: 1, Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(6)}}}})
	f.Must(&Entry{Publish: &Publish{Round: 2, Version: 2, Parent: 1, Hash: grouptest.HashN(2), Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(6)}}}}})
	if st, ok := f.S.Plan(grouptest.T0, "t1", live); ok {
		t.Errorf("plan with nothing pending: %+v", st)
	}
	f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(7), Adapters: []string{"v-1", "v0"}}}})
	f.Must(&Entry{Start: &Start{Round: 3, Base: 2, Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(7)}}}})
	f.Must(&Entry{Abort: &Abort{Round: 3}})
	f.Must(&Entry{Add: []BatchRef{{ID: grouptest.Bid(8), Adapters: []string{"v0"}}}})
	f.Must(&Entry{Start: &Start{Round: 4, Base: 2, Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(7)}}}})
	f.Must(&Entry{Publish: &Publish{Round: 4, Version: 3, Parent: 2, Hash: grouptest.HashN(3), Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(7)}}}}})
	// Only batch 8 is pending, and it is 3 versions behind.
	if st, ok := f.S.Plan(grouptest.T0, "t1", live); ok {
		t.Errorf("plan with only a stale batch: %+v", st)
	}
}

func TestPlanFields(t *testing.T) {
	f := grouptest.Published(t)
	f.Must(&Entry{Configure: &Config{Quota: 64, RoundSteps: 128, Deadline: 3 * time.Minute}})
	now := grouptest.T0.Add(5 * time.Hour)
	st, ok := f.S.Plan(now, "t2", []mesh.PeerID{"t1"})
	if !ok {
		t.Fatal("no plan")
	}
	if st.Round != 2 || st.Base != 1 || st.Leader != "t2" || !st.Deadline.Equal(now.Add(3*time.Minute)) {
		t.Errorf("plan %+v", st)
	}
	if want := []core.BatchID{grouptest.Bid(4), grouptest.Bid(5), grouptest.Bid(6)}; !slices.Equal(st.Shares["t1"], want) {
		t.Errorf("share %v", names(st.Shares["t1"]))
	}
}

// TestPlanDeterministic rebuilds the same state many times, with its
// batches and trainers inserted in different orders and the live list
// shuffled: the plan must not change.
func TestPlanDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	var refs []BatchRef
	for range 300 {
		refs = append(refs, BatchRef{ID: core.BatchID(grouptest.HashN(r.IntN(1 << 30))), From: mesh.PeerID(fmt.Sprintf("d%d", r.IntN(12))), Steps: r.IntN(40), Adapters: []string{fmt.Sprintf("v%d", r.IntN(5))}})
	}
	speeds := map[mesh.PeerID]float64{"t1": 1, "t2": 2.5, "t3": 0.7, "t4": 1, "t5": 3}
	live := []mesh.PeerID{"t1", "t2", "t3", "t4", "t5"}
	base := planState(t, Config{Quota: 60, RoundSteps: 400}, 4, speeds, nil)
	// Batches added in few entries, so that many share their Added time
	// and only their ids order them.
	for i := 0; i < len(refs); i += 50 {
		base.Must(&Entry{Add: refs[i : i+50]})
	}
	want, ok := base.S.Plan(grouptest.T0, "t1", live)
	if !ok {
		t.Fatal("no plan")
	}
	shareSteps(t, base.S, want, live)
	js := grouptest.FullJSON(t, base.S)
	for run := range 100 {
		s := New()
		if err := json.Unmarshal([]byte(js), s); err != nil {
			t.Fatal(err)
		}
		// Rebuild the maps in a shuffled insertion order.
		ids := slices.Collect(maps.Keys(s.Batches))
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		bs := map[core.BatchID]*Batch{}
		for _, id := range ids {
			bs[id] = s.Batches[id]
		}
		s.Batches = bs
		l := slices.Clone(live)
		r.Shuffle(len(l), func(i, j int) { l[i], l[j] = l[j], l[i] })
		got, ok := s.Plan(grouptest.T0, "t1", l)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Fatalf("run %d: plan differs:\n got %+v\nwant %+v", run, got, want)
		}
		if again, _ := base.S.Plan(grouptest.T0, "t1", l); !reflect.DeepEqual(again, want) {
			t.Fatalf("run %d: plan of the same state differs", run)
		}
	}
}

func names(ids []core.BatchID) []string {
	var out []string
	for _, id := range ids {
		out = append(out, string(id)[54:])
	}
	return out
}

func unitIDs(n int) []core.BatchID {
	var out []core.BatchID
	for i := range n {
		out = append(out, grouptest.Bid(i))
	}
	return out
}
