package grouptest

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// LogEntry is one entry a Driver applied: encoded, as raft hands it over,
// at its log position.
type LogEntry struct {
	Data        []byte
	Term, Index uint64
}

// RecordLog runs a Driver seeded with seed for steps entries and returns
// the log it applied and the state it reached.
func RecordLog(t *testing.T, seed uint64, steps int) ([]LogEntry, *group.State) {
	d := NewDriver(t, seed)
	d.Run(steps)
	return d.Log(), d.State()
}

// errAny marks an entry whose outcome the driver does not predict.
var errAny = errors.New("any outcome")

// Driver applies a seeded random sequence of plausible entries, most of
// them valid, some of them not, and checks the state after every one.
type Driver struct {
	t       *testing.T
	seed    uint64
	r       *rand.Rand
	f       *Fixture
	shadow  *group.State // applies every entry after a round trip through its encoding
	next    int          // next new batch number
	added   map[core.BatchID]bool
	trained map[core.BatchID]uint64
	step    int
	kinds   map[string][2]int // op → accepted, refused
	log     []LogEntry        // every entry applied, encoded
}

var (
	propTrainers = []mesh.PeerID{"t1", "t2", "t3", "t4", "t5", "t6"}
	propDevices  = []mesh.PeerID{"d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8"}
)

// NewDriver is a Driver seeded with seed, its state configured and at
// version 0.
func NewDriver(t *testing.T, seed uint64) *Driver {
	d := &Driver{t: t, seed: seed, r: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), f: NewFixture(t), shadow: group.New(),
		added: map[core.BatchID]bool{}, trained: map[core.BatchID]uint64{}, kinds: map[string][2]int{}}
	d.apply("configure", &group.Entry{Configure: &group.Config{Quota: 1 + d.r.IntN(40), RoundSteps: 1 + d.r.IntN(120), MaxLag: 1 + d.r.IntN(3)}}, nil)
	d.apply("genesis", &group.Entry{Genesis: &group.Genesis{Hash: HashN(0), Publisher: "t1"}}, nil)
	return d
}

// State is the state the driver reached.
func (d *Driver) State() *group.State { return d.f.S }

// Log is every entry the driver applied, in order.
func (d *Driver) Log() []LogEntry { return d.log }

// Kinds counts the entries applied by kind: accepted, refused.
func (d *Driver) Kinds() map[string][2]int { return d.kinds }

func (d *Driver) fail(format string, args ...any) {
	d.t.Helper()
	d.t.Fatalf("seed %d step %d: %s", d.seed, d.step, fmt.Sprintf(format, args...))
}

// apply applies e to the state and, through its encoding, to the shadow;
// want is the sentinel the refusal must wrap, nil if e must be accepted,
// errAny if either will do.
func (d *Driver) apply(op string, e *group.Entry, want error) error {
	d.t.Helper()
	d.step++
	s := d.f.S
	versions := len(s.Versions)
	err := d.f.Apply(e)
	switch {
	case want == errAny:
	case want == nil && err != nil:
		d.fail("%s refused: %v\nentry %s", op, err, EntryString(e))
	case want != nil && !errors.Is(err, want):
		d.fail("%s: err %v, want %v\nentry %s", op, err, want, EntryString(e))
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
	d.log = append(d.log, LogEntry{Data: b, Term: d.f.Term, Index: d.f.Index})
	de, decErr := group.DecodeEntry(b)
	if decErr != nil {
		d.fail("decode %s: %v", b, decErr)
	}
	if err != nil && !sameState(d.shadow, s) {
		if before, after := StateJSON(d.t, d.shadow), StateJSON(d.t, s); before != after {
			d.fail("refused %s (%v) changed the state %s", op, err, Diff(before, after))
		}
	}
	serr := d.shadow.Apply(de, d.f.Term, d.f.Index)
	if (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) {
		d.fail("%s: %v, decoded entry %v", op, err, serr)
	}

	if err := CheckInvariants(s); err != nil {
		d.fail("after %s %s: %v", op, EntryString(e), err)
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

func (d *Driver) pick(ps []mesh.PeerID) mesh.PeerID { return ps[d.r.IntN(len(ps))] }

func (d *Driver) batchesIn(st ...group.Status) []core.BatchID {
	var out []core.BatchID
	for _, b := range sortedBatches(d.f.S) {
		if slices.Contains(st, b.Status) {
			out = append(out, b.ID)
		}
	}
	return out
}

func (d *Driver) anyBatch() (core.BatchID, bool) {
	all := d.batchesIn(group.Pending, group.Assigned, group.Trained, group.Refused)
	if len(all) == 0 {
		return "", false
	}
	return all[d.r.IntN(len(all))], true
}

func (d *Driver) current() uint64 {
	v, _ := d.f.S.Current()
	return v.Version
}

func (d *Driver) add() {
	n := 1 + d.r.IntN(8)
	var refs []group.BatchRef
	want := error(nil)
	for range n {
		ref := group.BatchRef{ID: Bid(d.next), From: d.pick(propDevices), Steps: d.r.IntN(20)}
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
			ref.ID, want = core.BatchID("zz"+string(ref.ID)[2:]), group.ErrEntry
		}
		refs = append(refs, ref)
	}
	d.apply("add", &group.Entry{Add: refs}, want)
}

func (d *Driver) register() {
	t := group.Trainer{ID: d.pick(propTrainers), Engine: "e", Speed: float64(d.r.IntN(9)) / 2}
	want := error(nil)
	if _, ok := d.f.S.Revoked[t.ID]; ok {
		want = group.ErrTrainer
	}
	if d.r.IntN(20) == 0 {
		t.Speed, want = -1, group.ErrEntry
	}
	d.apply("register", &group.Entry{Register: &t}, want)
}

func (d *Driver) leave() {
	p := d.pick(propTrainers)
	want := error(nil)
	if _, ok := d.f.S.Trainers[p]; !ok {
		want = group.ErrTrainer
	}
	d.apply("leave", &group.Entry{Leave: p}, want)
}

func (d *Driver) revoke() {
	var p mesh.PeerID
	if d.r.IntN(3) == 0 {
		p = d.pick(propTrainers[3:]) // keep t1..t3 mostly around
	} else {
		p = d.pick(propDevices[4:])
	}
	if d.r.IntN(30) == 0 {
		d.apply("revoke", &group.Entry{Revoke: &group.Revocation{Reason: "x"}}, group.ErrEntry)
		return
	}
	d.apply("revoke", &group.Entry{Revoke: &group.Revocation{Peer: p, Reason: "test"}}, nil)
}

func (d *Driver) speeds() {
	var us []group.SpeedUpdate
	for range 1 + d.r.IntN(3) {
		us = append(us, group.SpeedUpdate{Trainer: d.pick(propTrainers), Speed: float64(d.r.IntN(20)) / 4})
	}
	d.apply("speeds", &group.Entry{Speeds: us}, nil)
}

func (d *Driver) refuse() {
	if st := d.f.S.Stale(); len(st) > 0 && d.r.IntN(2) == 0 {
		d.apply("refuse stale", &group.Entry{Refuse: st}, nil)
		return
	}
	var rs []group.Refusal
	want := error(nil)
	for range 1 + d.r.IntN(3) {
		id, ok := d.anyBatch()
		if !ok {
			return
		}
		if d.f.S.Batches[id].Status != group.Pending || slices.ContainsFunc(rs, func(r group.Refusal) bool { return r.ID == id }) {
			want = group.ErrBatch
		}
		rs = append(rs, group.Refusal{ID: id, Reason: "unreadable: test"})
	}
	d.apply("refuse", &group.Entry{Refuse: rs}, want)
}

func (d *Driver) live() []mesh.PeerID {
	var live []mesh.PeerID
	for _, p := range propTrainers {
		if d.r.IntN(4) != 0 {
			live = append(live, p)
		}
	}
	return live
}

func (d *Driver) start() {
	s := d.f.S
	if s.Round != nil {
		st := &group.Start{Round: s.Rounds + 1, Base: d.current(), Shares: map[mesh.PeerID][]core.BatchID{"t1": d.batchesIn(group.Pending)[:0]}}
		d.apply("start while open", &group.Entry{Start: st}, group.ErrFenced)
		return
	}
	st, ok := s.Plan(d.f.At(), "t1", d.live())
	if !ok {
		return
	}
	want := error(nil)
	switch d.r.IntN(24) {
	case 0:
		st.Round, want = st.Round+1, group.ErrFenced
	case 1:
		st.Round, want = st.Round-1, group.ErrFenced
	case 2:
		if st.Base > 0 {
			st.Base, want = st.Base-1, group.ErrVersion
		}
	case 3:
		if id, ok := d.anyBatch(); ok && s.Batches[id].Status != group.Pending {
			for t := range st.Shares {
				st.Shares[t], want = append(st.Shares[t], id), group.ErrBatch
				break
			}
		}
	case 4:
		st.Shares["nobody"], want = []core.BatchID{}, group.ErrTrainer
	}
	d.apply("start", &group.Entry{Start: st}, want)
}

func (d *Driver) publish() {
	s := d.f.S
	cur := d.current()
	if s.Round == nil {
		if d.r.IntN(4) != 0 {
			d.start()
			return
		}
		d.apply("publish no round", &group.Entry{Publish: &group.Publish{Round: s.Rounds, Version: cur + 1, Parent: cur, Hash: HashN(d.r.IntN(1 << 20)),
			Contributors: []group.Contribution{{Trainer: "t1"}}}}, group.ErrNoRound)
		return
	}
	r := s.Round
	p := &group.Publish{Round: r.Number, Version: cur + 1, Parent: cur, Hash: HashN(d.r.IntN(1 << 20)), Publisher: "t1"}
	for _, t := range r.Trainers() {
		if d.r.IntN(4) == 0 {
			continue // a straggler
		}
		c := group.Contribution{Trainer: t, Samples: d.r.IntN(100), Norm: d.r.Float64(), Seconds: d.r.Float64() * 10}
		for _, id := range r.Shares[t] {
			switch d.r.IntN(6) {
			case 0: // left for the next round
			case 1:
				p.Refused = append(p.Refused, group.Refusal{ID: id, Reason: "verify: test"})
			default:
				c.Batches = append(c.Batches, id)
			}
		}
		p.Contributors = append(p.Contributors, c)
	}
	want := error(nil)
	if len(p.Contributors) == 0 {
		want = group.ErrEntry
	}
	switch d.r.IntN(20) {
	case 0:
		p.Version, want = p.Version+1, group.ErrVersion
	case 1:
		if p.Parent > 0 {
			p.Parent, want = p.Parent-1, group.ErrVersion
		}
	case 2:
		p.Round, want = p.Round+1, group.ErrNoRound
	case 3:
		if len(p.Contributors) > 0 {
			p.Hash, want = "nohash", group.ErrEntry
		}
	case 4:
		if len(p.Contributors) > 0 {
			if id, ok := d.anyBatch(); ok && s.Batches[id].Trainer != p.Contributors[0].Trainer {
				p.Contributors[0].Batches, want = append(p.Contributors[0].Batches, id), group.ErrBatch
			}
		}
	}
	if d.apply("publish", &group.Entry{Publish: p}, want) == nil {
		// A second publish of the same round is fenced.
		if d.r.IntN(3) == 0 {
			d.apply("publish again", &group.Entry{Publish: p}, group.ErrNoRound)
		}
	}
}

// closeRound closes the open round with no version (its contributors
// trained nothing that changes the adapter), sometimes with a mistake.
func (d *Driver) closeRound() {
	s := d.f.S
	if s.Round == nil || d.r.IntN(6) == 0 {
		d.apply("close", &group.Entry{Close: &group.Close{Round: s.Rounds + 1, Contributors: []group.Contribution{{Trainer: "t1"}}}}, group.ErrNoRound)
		return
	}
	r := s.Round
	cl := &group.Close{Round: r.Number, Reason: "every group flat"}
	for _, t := range r.Trainers() {
		if d.r.IntN(4) == 0 {
			continue
		}
		c := group.Contribution{Trainer: t, Seconds: d.r.Float64()}
		for _, id := range r.Shares[t] {
			switch d.r.IntN(6) {
			case 0:
			case 1:
				cl.Refused = append(cl.Refused, group.Refusal{ID: id, Reason: "verify: test"})
			default:
				c.Batches = append(c.Batches, id)
			}
		}
		cl.Contributors = append(cl.Contributors, c)
	}
	want := error(nil)
	if len(cl.Contributors) == 0 {
		want = group.ErrEntry
	} else if d.r.IntN(8) == 0 {
		if id, ok := d.anyBatch(); ok && s.Batches[id].Trainer != cl.Contributors[0].Trainer {
			cl.Contributors[0].Batches, want = append(cl.Contributors[0].Batches, id), group.ErrBatch
		}
	}
	d.apply("close", &group.Entry{Close: cl}, want)
}

func (d *Driver) abort() {
	s := d.f.S
	if s.Round == nil || d.r.IntN(5) == 0 {
		d.apply("abort", &group.Entry{Abort: &group.Abort{Round: s.Rounds + 1}}, group.ErrNoRound)
		return
	}
	d.apply("abort", &group.Entry{Abort: &group.Abort{Round: s.Round.Number, Reason: "deadline"}}, nil)
}

func (d *Driver) configure() {
	c := &group.Config{Quota: 1 + d.r.IntN(40), RoundSteps: 1 + d.r.IntN(120), MaxLag: 1 + d.r.IntN(3)}
	want := error(nil)
	if d.r.IntN(5) == 0 {
		c.LR, want = 5, group.ErrConfig
	}
	d.apply("configure", &group.Entry{Configure: c}, want)
}

// Run applies steps random entries, checking the state after each, and
// goes on from a snapshot of the state every 100.
func (d *Driver) Run(steps int) {
	ops := []struct {
		w  int
		fn func()
	}{
		{20, d.add}, {8, d.register}, {3, d.leave}, {2, d.revoke}, {3, d.speeds}, {6, d.refuse},
		{15, d.start}, {15, d.publish}, {4, d.abort}, {3, d.closeRound}, {2, d.configure},
		{1, func() {
			d.apply("genesis again", &group.Entry{Genesis: &group.Genesis{Hash: HashN(1)}}, group.ErrGenesis)
		}},
		{1, func() { d.apply("malformed", &group.Entry{Leave: "t1", Abort: &group.Abort{Round: 1}}, group.ErrEntry) }},
		{2, func() { d.f.Term++ }},
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
	if a, b := FullJSON(d.t, d.f.S), FullJSON(d.t, d.shadow); a != b {
		d.fail("the state and its shadow differ %s", Diff(a, b))
	}
}

// restore goes on from a snapshot of the state, as a follower that installs
// one would.
func (d *Driver) restore() {
	c := CloneState(d.t, d.f.S)
	if a, b := FullJSON(d.t, d.f.S), FullJSON(d.t, c); a != b {
		d.fail("restored state differs %s", Diff(a, b))
	}
	d.f.S = c
}

// sameState is a fast, conservative stateJSON(a) == stateJSON(b): when it
// says false, the caller compares the JSON.
func sameState(a, b *group.State) bool {
	x, y := *a, *b
	x.Term, x.Index, y.Term, y.Index = 0, 0, 0, 0
	return reflect.DeepEqual(&x, &y)
}

// sortedBatches is s's batches in the order group takes them: by when
// they were added, then by id.
func sortedBatches(s *group.State) []*group.Batch {
	bs := make([]*group.Batch, 0, len(s.Batches))
	for _, b := range s.Batches {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b *group.Batch) int {
		if c := a.Added.Compare(b.Added); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return bs
}
