package group

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// errAny marks an entry whose outcome the driver does not predict.
var errAny = errors.New("any outcome")

// driver applies a seeded random sequence of plausible entries, most of
// them valid, some of them not, and checks the state after every one.
type driver struct {
	t       *testing.T
	seed    uint64
	r       *rand.Rand
	f       *fixture
	shadow  *State // applies every entry after a round trip through its encoding
	next    int    // next new batch number
	added   map[core.BatchID]bool
	trained map[core.BatchID]uint64
	step    int
	kinds   map[string][2]int // op → accepted, refused
	log     []logEntry        // every entry applied, encoded
}

var (
	propTrainers = []mesh.PeerID{"t1", "t2", "t3", "t4", "t5", "t6"}
	propDevices  = []mesh.PeerID{"d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8"}
)

func newDriver(t *testing.T, seed uint64) *driver {
	d := &driver{t: t, seed: seed, r: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), f: newFixture(t), shadow: New(),
		added: map[core.BatchID]bool{}, trained: map[core.BatchID]uint64{}, kinds: map[string][2]int{}}
	d.apply("configure", &Entry{Configure: &Config{Quota: 1 + d.r.IntN(40), RoundSteps: 1 + d.r.IntN(120), MaxLag: 1 + d.r.IntN(3)}}, nil)
	d.apply("genesis", &Entry{Genesis: &Genesis{Hash: hashN(0), Publisher: "t1"}}, nil)
	return d
}

func (d *driver) fail(format string, args ...any) {
	d.t.Helper()
	d.t.Fatalf("seed %d step %d: %s", d.seed, d.step, fmt.Sprintf(format, args...))
}

// apply applies e to the state and, through its encoding, to the shadow;
// want is the sentinel the refusal must wrap, nil if e must be accepted,
// errAny if either will do.
func (d *driver) apply(op string, e *Entry, want error) error {
	d.t.Helper()
	d.step++
	s := d.f.s
	versions := len(s.Versions)
	err := d.f.apply(e)
	switch {
	case want == errAny:
	case want == nil && err != nil:
		d.fail("%s refused: %v\nentry %s", op, err, entryString(e))
	case want != nil && !errors.Is(err, want):
		d.fail("%s: err %v, want %v\nentry %s", op, err, want, entryString(e))
	}
	k := d.kinds[op]
	if err != nil {
		k[1]++
	} else {
		k[0]++
	}
	d.kinds[op] = k

	// The shadow applies the entry as raft would hand it over: encoded and
	// decoded. Before it does, it is the state before the entry.
	b, encErr := e.Encode()
	if encErr != nil {
		d.fail("encode: %v", encErr)
	}
	d.log = append(d.log, logEntry{data: b, term: d.f.term, index: d.f.index})
	de, decErr := DecodeEntry(b)
	if decErr != nil {
		d.fail("decode %s: %v", b, decErr)
	}
	if err != nil && !sameState(d.shadow, s) {
		if before, after := stateJSON(d.t, d.shadow), stateJSON(d.t, s); before != after {
			d.fail("refused %s (%v) changed the state %s", op, err, diff(before, after))
		}
	}
	serr := d.shadow.Apply(de, d.f.term, d.f.index)
	if (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) {
		d.fail("%s: %v, decoded entry %v", op, err, serr)
	}

	if err := checkInvariants(s); err != nil {
		d.fail("after %s %s: %v", op, entryString(e), err)
	}
	for id := range d.added {
		if _, ok := s.Batches[id]; !ok {
			d.fail("batch %s lost", id)
		}
	}
	if e.Add != nil && err == nil {
		for _, r := range e.Add {
			d.added[r.ID] = true
		}
	}
	if e.Publish != nil && err == nil {
		if len(s.Versions) != versions+1 {
			d.fail("publish made %d versions", len(s.Versions)-versions)
		}
		for _, c := range e.Publish.Contributors {
			for _, id := range c.Batches {
				if v, ok := d.trained[id]; ok {
					d.fail("batch %s trained in v%d and again in v%d", id, v, e.Publish.Version)
				}
				d.trained[id] = e.Publish.Version
			}
		}
	} else if len(s.Versions) != versions && (e.Genesis == nil || err != nil) {
		d.fail("%s changed the lineage", op)
	}
	return err
}

func (d *driver) pick(ps []mesh.PeerID) mesh.PeerID { return ps[d.r.IntN(len(ps))] }

func (d *driver) batchesIn(st ...Status) []core.BatchID {
	var out []core.BatchID
	for _, b := range d.f.s.sortedBatches(len(d.f.s.Batches), nil) {
		if slices.Contains(st, b.Status) {
			out = append(out, b.ID)
		}
	}
	return out
}

func (d *driver) anyBatch() (core.BatchID, bool) {
	all := d.batchesIn(Pending, Assigned, Trained, Refused)
	if len(all) == 0 {
		return "", false
	}
	return all[d.r.IntN(len(all))], true
}

func (d *driver) current() uint64 {
	v, _ := d.f.s.Current()
	return v.Version
}

func (d *driver) add() {
	n := 1 + d.r.IntN(8)
	var refs []BatchRef
	want := error(nil)
	for range n {
		ref := BatchRef{ID: bid(d.next), From: d.pick(propDevices), Steps: d.r.IntN(20)}
		d.next++
		switch x := d.r.IntN(20); {
		case x == 0:
			ref.From = ""
		case x == 1:
			ref.From = d.pick(propTrainers)
		case x == 2:
			if id, ok := d.anyBatch(); ok {
				ref.ID = id
			}
		}
		cur := int(d.current())
		for range d.r.IntN(3) {
			if d.r.IntN(8) == 0 {
				ref.Adapters = append(ref.Adapters, "local")
			} else {
				ref.Adapters = append(ref.Adapters, fmt.Sprintf("v%d", max(0, cur-d.r.IntN(6))))
			}
		}
		if d.r.IntN(60) == 0 {
			ref.ID, want = core.BatchID("zz"+string(ref.ID)[2:]), ErrEntry
		}
		refs = append(refs, ref)
	}
	d.apply("add", &Entry{Add: refs}, want)
}

func (d *driver) register() {
	t := Trainer{ID: d.pick(propTrainers), Engine: "e", Speed: float64(d.r.IntN(9)) / 2}
	want := error(nil)
	if _, ok := d.f.s.Revoked[t.ID]; ok {
		want = ErrTrainer
	}
	if d.r.IntN(20) == 0 {
		t.Speed, want = -1, ErrEntry
	}
	d.apply("register", &Entry{Register: &t}, want)
}

func (d *driver) leave() {
	p := d.pick(propTrainers)
	want := error(nil)
	if _, ok := d.f.s.Trainers[p]; !ok {
		want = ErrTrainer
	}
	d.apply("leave", &Entry{Leave: p}, want)
}

func (d *driver) revoke() {
	var p mesh.PeerID
	if d.r.IntN(3) == 0 {
		p = d.pick(propTrainers[3:]) // keep t1..t3 mostly around
	} else {
		p = d.pick(propDevices[4:])
	}
	if d.r.IntN(30) == 0 {
		d.apply("revoke", &Entry{Revoke: &Revocation{Reason: "x"}}, ErrEntry)
		return
	}
	d.apply("revoke", &Entry{Revoke: &Revocation{Peer: p, Reason: "test"}}, nil)
}

func (d *driver) speeds() {
	var us []SpeedUpdate
	for range 1 + d.r.IntN(3) {
		us = append(us, SpeedUpdate{Trainer: d.pick(propTrainers), Speed: float64(d.r.IntN(20)) / 4})
	}
	d.apply("speeds", &Entry{Speeds: us}, nil)
}

func (d *driver) refuse() {
	if st := d.f.s.Stale(); len(st) > 0 && d.r.IntN(2) == 0 {
		d.apply("refuse stale", &Entry{Refuse: st}, nil)
		return
	}
	var rs []Refusal
	want := error(nil)
	for range 1 + d.r.IntN(3) {
		id, ok := d.anyBatch()
		if !ok {
			return
		}
		if d.f.s.Batches[id].Status != Pending || slices.ContainsFunc(rs, func(r Refusal) bool { return r.ID == id }) {
			want = ErrBatch
		}
		rs = append(rs, Refusal{ID: id, Reason: "unreadable: test"})
	}
	d.apply("refuse", &Entry{Refuse: rs}, want)
}

func (d *driver) live() []mesh.PeerID {
	var live []mesh.PeerID
	for _, p := range propTrainers {
		if d.r.IntN(4) != 0 {
			live = append(live, p)
		}
	}
	return live
}

func (d *driver) start() {
	s := d.f.s
	if s.Round != nil {
		st := &Start{Round: s.Rounds + 1, Base: d.current(), Shares: map[mesh.PeerID][]core.BatchID{"t1": d.batchesIn(Pending)[:0]}}
		d.apply("start while open", &Entry{Start: st}, ErrFenced)
		return
	}
	st, ok := s.Plan(d.f.at(), "t1", d.live())
	if !ok {
		return
	}
	want := error(nil)
	switch d.r.IntN(24) {
	case 0:
		st.Round, want = st.Round+1, ErrFenced
	case 1:
		st.Round, want = st.Round-1, ErrFenced
	case 2:
		if st.Base > 0 {
			st.Base, want = st.Base-1, ErrVersion
		}
	case 3:
		if id, ok := d.anyBatch(); ok && s.Batches[id].Status != Pending {
			for t := range st.Shares {
				st.Shares[t], want = append(st.Shares[t], id), ErrBatch
				break
			}
		}
	case 4:
		st.Shares["nobody"], want = []core.BatchID{}, ErrTrainer
	}
	d.apply("start", &Entry{Start: st}, want)
}

func (d *driver) publish() {
	s := d.f.s
	cur := d.current()
	if s.Round == nil {
		if d.r.IntN(4) != 0 {
			d.start()
			return
		}
		d.apply("publish no round", &Entry{Publish: &Publish{Round: s.Rounds, Version: cur + 1, Parent: cur, Hash: hashN(d.r.IntN(1 << 20)),
			Contributors: []Contribution{{Trainer: "t1"}}}}, ErrNoRound)
		return
	}
	r := s.Round
	p := &Publish{Round: r.Number, Version: cur + 1, Parent: cur, Hash: hashN(d.r.IntN(1 << 20)), Publisher: "t1"}
	for _, t := range r.Trainers() {
		if d.r.IntN(4) == 0 {
			continue // a straggler
		}
		c := Contribution{Trainer: t, Samples: d.r.IntN(100), Norm: d.r.Float64(), Seconds: d.r.Float64() * 10}
		for _, id := range r.Shares[t] {
			switch d.r.IntN(6) {
			case 0: // left for the next round
			case 1:
				p.Refused = append(p.Refused, Refusal{ID: id, Reason: "verify: test"})
			default:
				c.Batches = append(c.Batches, id)
			}
		}
		p.Contributors = append(p.Contributors, c)
	}
	want := error(nil)
	if len(p.Contributors) == 0 {
		want = ErrEntry
	}
	switch d.r.IntN(20) {
	case 0:
		p.Version, want = p.Version+1, ErrVersion
	case 1:
		if p.Parent > 0 {
			p.Parent, want = p.Parent-1, ErrVersion
		}
	case 2:
		p.Round, want = p.Round+1, ErrNoRound
	case 3:
		if len(p.Contributors) > 0 {
			p.Hash, want = "nohash", ErrEntry
		}
	case 4:
		if len(p.Contributors) > 0 {
			if id, ok := d.anyBatch(); ok && s.Batches[id].Trainer != p.Contributors[0].Trainer {
				p.Contributors[0].Batches, want = append(p.Contributors[0].Batches, id), ErrBatch
			}
		}
	}
	if d.apply("publish", &Entry{Publish: p}, want) == nil {
		// A second publish of the same round is fenced.
		if d.r.IntN(3) == 0 {
			d.apply("publish again", &Entry{Publish: p}, ErrNoRound)
		}
	}
}

func (d *driver) abort() {
	s := d.f.s
	if s.Round == nil || d.r.IntN(5) == 0 {
		d.apply("abort", &Entry{Abort: &Abort{Round: s.Rounds + 1}}, ErrNoRound)
		return
	}
	d.apply("abort", &Entry{Abort: &Abort{Round: s.Round.Number, Reason: "deadline"}}, nil)
}

func (d *driver) configure() {
	c := &Config{Quota: 1 + d.r.IntN(40), RoundSteps: 1 + d.r.IntN(120), MaxLag: 1 + d.r.IntN(3)}
	want := error(nil)
	if d.r.IntN(5) == 0 {
		c.LR, want = 5, ErrConfig
	}
	d.apply("configure", &Entry{Configure: c}, want)
}

func (d *driver) run(steps int) {
	ops := []struct {
		w  int
		fn func()
	}{
		{20, d.add}, {8, d.register}, {3, d.leave}, {2, d.revoke}, {3, d.speeds}, {6, d.refuse},
		{15, d.start}, {15, d.publish}, {4, d.abort}, {2, d.configure},
		{1, func() { d.apply("genesis again", &Entry{Genesis: &Genesis{Hash: hashN(1)}}, ErrGenesis) }},
		{1, func() { d.apply("malformed", &Entry{Leave: "t1", Abort: &Abort{Round: 1}}, ErrEntry) }},
		{2, func() { d.f.term++ }},
	}
	total := 0
	for _, o := range ops {
		total += o.w
	}
	for i := 0; i < steps; i++ {
		x := d.r.IntN(total)
		for _, o := range ops {
			if x < o.w {
				o.fn()
				break
			}
			x -= o.w
		}
		if i%100 == 99 {
			d.restore()
		}
	}
	if a, b := fullJSON(d.t, d.f.s), fullJSON(d.t, d.shadow); a != b {
		d.fail("the state and its shadow differ %s", diff(a, b))
	}
}

// restore goes on from a snapshot of the state, as a follower that installs
// one would.
func (d *driver) restore() {
	c := cloneState(d.t, d.f.s)
	if a, b := fullJSON(d.t, d.f.s), fullJSON(d.t, c); a != b {
		d.fail("restored state differs %s", diff(a, b))
	}
	d.f.s = c
}

// sameState is a fast, conservative stateJSON(a) == stateJSON(b): when it
// says false, the caller compares the JSON.
func sameState(a, b *State) bool {
	x, y := *a, *b
	x.Term, x.Index, y.Term, y.Index = 0, 0, 0, 0
	return reflect.DeepEqual(&x, &y)
}

func TestProperties(t *testing.T) {
	seeds, steps := 200, 200
	if testing.Short() || raceEnabled {
		seeds = 40
	}
	totals := map[string][2]int{}
	largest := 0
	for seed := range uint64(seeds) {
		d := newDriver(t, seed)
		d.run(steps)
		largest = max(largest, len(d.f.s.Batches))
		for k, v := range d.kinds {
			tv := totals[k]
			totals[k] = [2]int{tv[0] + v[0], tv[1] + v[1]}
		}
	}
	// The driver must exercise every kind of entry, accepted and refused.
	for _, op := range []string{"add", "register", "leave", "revoke", "refuse", "start", "publish", "abort", "configure"} {
		if totals[op][0] == 0 || totals[op][1] == 0 {
			t.Errorf("%s: %d accepted, %d refused", op, totals[op][0], totals[op][1])
		}
	}
	for _, op := range []string{"refuse stale", "publish again", "start while open", "publish no round"} {
		if totals[op] == ([2]int{}) {
			t.Errorf("%s never ran", op)
		}
	}
	t.Logf("entries (accepted, refused): %v; %d batches in the largest ledger", totals, largest)
}
