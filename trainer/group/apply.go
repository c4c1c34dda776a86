package group

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// Entry is one command of the group's log. Exactly one of its fields but At
// is set. At is the proposing leader's clock: Apply never reads one.
type Entry struct {
	At        time.Time     `json:"at"`
	Configure *Config       `json:"configure,omitempty"`
	Genesis   *Genesis      `json:"genesis,omitempty"`
	Add       []BatchRef    `json:"add,omitempty"`
	Refuse    []Refusal     `json:"refuse,omitempty"`
	Register  *Trainer      `json:"register,omitempty"`
	Leave     mesh.PeerID   `json:"leave,omitempty"`
	Start     *Start        `json:"start,omitempty"`
	Publish   *Publish      `json:"publish,omitempty"`
	Abort     *Abort        `json:"abort,omitempty"`
	Close     *Close        `json:"close,omitempty"`
	Revoke    *Revocation   `json:"revoke,omitempty"`
	Speeds    []SpeedUpdate `json:"speeds,omitempty"`
	// Tasks adds a task set; Eval records a version's evaluation on one.
	Tasks *TaskSet `json:"tasks,omitempty"`
	Eval  *Eval    `json:"eval,omitempty"`
	// Certify records the voters' certification of a version; Retract
	// takes back the newest version when it was not certified.
	Certify *Certify `json:"certify,omitempty"`
	Retract *Retract `json:"retract,omitempty"`
	// Bench takes a trainer off the rounds after a spot check found its
	// delta was not what its share makes; Clear, the admin's, puts it
	// back.
	Bench *Bench `json:"bench,omitempty"`
	Clear *Clear `json:"clear,omitempty"`
}

// Bench records that a voter retrained a trainer's share of a round and
// did not get the delta the trainer handed in: the delta was left out of
// the round, and the trainer gets no share until the admin clears it
// (Clear). Evidence is what the voter compared.
type Bench struct {
	Trainer  mesh.PeerID  `json:"trainer"`
	Round    uint64       `json:"round"`
	Reason   string       `json:"reason"`
	Evidence SpotEvidence `json:"evidence"`
}

// SpotEvidence is what a spot check compared: the SHA-256 of the delta
// the trainer handed in and of the one the voter made from the same share,
// base and seed, the largest difference of one value between them (-1:
// their tensors differ in name or shape), the samples each trained, and
// the share's batches.
type SpotEvidence struct {
	Base              uint64         `json:"base"`
	Engine            string         `json:"engine"`
	Submitted         string         `json:"submitted"`
	Recomputed        string         `json:"recomputed"`
	MaxAbsDiff        float64        `json:"max_abs_diff"`
	Tolerance         float64        `json:"tolerance"`
	Samples           int            `json:"samples"`
	RecomputedSamples int            `json:"recomputed_samples"`
	Batches           []core.BatchID `json:"batches"`
	Checker           mesh.PeerID    `json:"checker"`
}

// Clear lifts a trainer's bench: it gets shares again.
type Clear struct {
	Trainer mesh.PeerID `json:"trainer"`
}

// Certify records that a quorum of the mesh's voters certified a version:
// the voter set they voted under (the admin-signed encoding,
// mesh/member.VoterSet) and their votes over the version's claim
// (mesh/weights/chunks.Manifest.Claim). The leader checks the votes before
// it proposes the entry; every trainer can check them again from the
// entry alone. A later Certify of the same version (under a newer voter
// set) replaces it.
type Certify struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
	Voters  []byte `json:"voters"`
	Votes   []Vote `json:"votes"`
}

// Vote is one voter's signature over a version's claim.
type Vote struct {
	Peer mesh.PeerID `json:"peer"`
	Sig  []byte      `json:"sig"`
}

// Retract takes back the newest version, which no quorum of voters
// certified (they found it was not what its round's deltas make, or its
// publisher left before they could check it): no device ever accepted
// it. Its round's batches go back to pending, and the next version takes
// its number.
type Retract struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
	Reason  string `json:"reason"`
}

// Genesis commits version 0: the adapter every trainer starts from.
type Genesis struct {
	Hash      string      `json:"hash"`
	Publisher mesh.PeerID `json:"publisher"`
}

// BatchRef adds a batch to the ledger as pending.
type BatchRef struct {
	ID       core.BatchID `json:"id"`
	From     mesh.PeerID  `json:"from,omitempty"`
	Steps    int          `json:"steps"`
	Adapters []string     `json:"adapters,omitempty"`
}

// Refusal refuses a batch, with why.
type Refusal struct {
	ID     core.BatchID `json:"id"`
	Reason string       `json:"reason"`
}

// Refusal reasons the group itself gives.
const (
	ReasonStale   = "stale"
	ReasonRevoked = "revoked"
)

// Start opens a round.
type Start struct {
	Round    uint64                         `json:"round"`
	Base     uint64                         `json:"base"`
	Leader   mesh.PeerID                    `json:"leader"`
	Deadline time.Time                      `json:"deadline"`
	Shares   map[mesh.PeerID][]core.BatchID `json:"shares"`
}

// Publish closes the open round into the next version.
type Publish struct {
	Round        uint64         `json:"round"`
	Version      uint64         `json:"version"`
	Parent       uint64         `json:"parent"`
	Hash         string         `json:"hash"`
	Publisher    mesh.PeerID    `json:"publisher"`
	Contributors []Contribution `json:"contributors"`
	// Refused are batches of the round its trainers refused (they failed
	// verification, or could not be read); the round's other batches that
	// no contributor trained go back to pending.
	Refused []Refusal `json:"refused,omitempty"`
	// Evals are the new version's evaluations on task sets' held-out
	// splits, made by the publisher before it proposed the version, so the
	// version is committed with them (and its manifest carries them).
	Evals []Eval `json:"evals,omitempty"`
}

// Abort closes the open round with no new version: its batches go back to
// pending.
type Abort struct {
	Round  uint64 `json:"round"`
	Reason string `json:"reason"`
}

// Close closes the open round with no new version because what its
// trainers took trained nothing: every task prompt's group was flat (its
// rewards all equal: no learning signal) and no batch gave a sample to
// train, so a version would be its parent again. The contributors'
// batches and prompts are done (trained in the round into no version:
// their Version is the round's base, which they left as it was), the
// refused ones refused, the round's others go back to pending.
type Close struct {
	Round        uint64         `json:"round"`
	Contributors []Contribution `json:"contributors"`
	Refused      []Refusal      `json:"refused,omitempty"`
	Reason       string         `json:"reason,omitempty"`
}

// Revocation mirrors a mesh revocation.
type Revocation struct {
	Peer   mesh.PeerID `json:"peer"`
	Reason string      `json:"reason,omitempty"`
}

// SpeedUpdate records a trainer's measured speed.
type SpeedUpdate struct {
	Trainer mesh.PeerID `json:"trainer"`
	Speed   float64     `json:"speed"`
}

// MaxEntry bounds an encoded entry.
const MaxEntry = 4 << 20

// maxSpeed bounds a trainer's speed (samples a second): Register refuses a
// speed at or above it, Speeds ignores one. Above it, sums of speeds in Plan
// lose their meaning, and an infinite one would not even encode.
const maxSpeed = 1e12

// Encode encodes e for the log.
func (e *Entry) Encode() ([]byte, error) { return json.Marshal(e) }

// DecodeEntry decodes a log entry, refusing unknown fields and trailing
// data.
func DecodeEntry(b []byte) (*Entry, error) {
	if len(b) > MaxEntry {
		return nil, fmt.Errorf("%w: %d bytes", ErrEntry, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var e Entry
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrEntry, err)
	}
	// dec.More misses a trailing "}" or "]": only the end may follow.
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data", ErrEntry)
	}
	return &e, nil
}

// kinds counts the commands e carries. A list counts only when it is not
// empty: its encoding leaves an empty one out, and an entry must mean the
// same applied directly and decoded from the log.
func (e *Entry) kinds() int {
	n := 0
	for _, set := range []bool{e.Configure != nil, e.Genesis != nil, len(e.Add) > 0, len(e.Refuse) > 0,
		e.Register != nil, e.Leave != "", e.Start != nil, e.Publish != nil, e.Abort != nil, e.Close != nil, e.Revoke != nil, len(e.Speeds) > 0,
		e.Tasks != nil, e.Eval != nil, e.Certify != nil, e.Retract != nil, e.Bench != nil, e.Clear != nil} {
		if set {
			n++
		}
	}
	return n
}

// Apply applies entry e committed at raft term and index. An entry it
// refuses (fenced, stale, malformed) changes nothing but the applied term
// and index, and the error says why; every trainer refuses the same
// entries.
func (s *State) Apply(e *Entry, term, index uint64) error {
	s.Term, s.Index = term, index
	if e == nil || e.kinds() != 1 {
		return fmt.Errorf("%w: %d commands in one entry", ErrEntry, e.kindsOrZero())
	}
	switch {
	case e.Configure != nil:
		return s.configure(*e.Configure)
	case e.Genesis != nil:
		return s.genesis(e, term, index)
	case len(e.Add) > 0:
		return s.add(e.Add, e.At)
	case len(e.Refuse) > 0:
		return s.refuse(e.Refuse)
	case e.Register != nil:
		return s.register(*e.Register, e.At)
	case e.Leave != "":
		return s.leave(e.Leave)
	case e.Start != nil:
		return s.start(e, term)
	case e.Publish != nil:
		return s.publish(e, term, index)
	case e.Abort != nil:
		return s.abort(*e.Abort)
	case e.Close != nil:
		return s.close(e)
	case e.Revoke != nil:
		return s.revoke(*e.Revoke)
	case e.Tasks != nil:
		return s.addTasks(*e.Tasks, e.At)
	case e.Eval != nil:
		return s.eval(*e.Eval)
	case e.Certify != nil:
		return s.certify(*e.Certify)
	case e.Retract != nil:
		return s.retract(*e.Retract, e.At)
	case e.Bench != nil:
		return s.bench(*e.Bench, e.At)
	case e.Clear != nil:
		return s.clear(*e.Clear)
	case len(e.Speeds) > 0:
		for _, u := range e.Speeds {
			if t, ok := s.Trainers[u.Trainer]; ok && u.Speed > 0 && u.Speed < maxSpeed {
				t.Speed, t.Measured = u.Speed, true
			}
		}
		return nil
	}
	return ErrEntry
}

func (e *Entry) kindsOrZero() int {
	if e == nil {
		return 0
	}
	return e.kinds()
}

func (s *State) configure(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	c = c.WithDefaults()
	if len(s.Versions) > 0 && (c.Base != s.Config.Base || c.BaseHash != s.Config.BaseHash || c.Seed != s.Config.Seed) {
		return fmt.Errorf("%w: the base model and seed cannot change once versions exist (base %s, seed %d)", ErrConfig, s.Config.Base, s.Config.Seed)
	}
	s.Config, s.Configured = c, true
	return nil
}

func (s *State) genesis(e *Entry, term, index uint64) error {
	if len(s.Versions) > 0 {
		return ErrGenesis
	}
	if !validHash(e.Genesis.Hash) {
		return fmt.Errorf("%w: genesis hash %q", ErrEntry, e.Genesis.Hash)
	}
	if !s.Configured {
		s.Config, s.Configured = Config{}.WithDefaults(), true
	}
	s.Versions = append(s.Versions, Version{Version: 0, Hash: e.Genesis.Hash, Term: term, Index: index, Publisher: e.Genesis.Publisher, At: e.At})
	return nil
}

func (s *State) add(refs []BatchRef, at time.Time) error {
	for _, r := range refs {
		if !validHash(string(r.ID)) || r.Steps < 0 {
			return fmt.Errorf("%w: batch %q", ErrEntry, r.ID)
		}
	}
	for _, r := range refs {
		if _, ok := s.Batches[r.ID]; ok {
			continue
		}
		b := &Batch{ID: r.ID, From: r.From, Steps: r.Steps, Adapters: slices.Clone(r.Adapters), Added: at}
		s.Batches[r.ID] = b
		s.setStatus(b, Pending)
		if reason, ok := s.Revoked[r.From]; ok && r.From != "" {
			s.refuseBatch(b, ReasonRevoked+revokedWhy(reason))
		}
	}
	return nil
}

func revokedWhy(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

func (s *State) refuseBatch(b *Batch, reason string) {
	s.setStatus(b, Refused)
	b.Reason = reason
	b.Trainer, b.Round = "", 0
	key := reason
	if i := strings.IndexByte(key, ':'); i >= 0 {
		key = key[:i]
	}
	s.Refusals[key]++
}

func (s *State) refuse(rs []Refusal) error {
	seen := make(map[core.BatchID]bool, len(rs))
	for _, r := range rs {
		b, ok := s.Batches[r.ID]
		if !ok || b.Status != Pending || seen[r.ID] {
			return fmt.Errorf("%w: %s is not pending", ErrBatch, r.ID)
		}
		seen[r.ID] = true
		if r.Reason == "" {
			return fmt.Errorf("%w: refusal of %s without a reason", ErrEntry, r.ID)
		}
	}
	for _, r := range rs {
		s.refuseBatch(s.Batches[r.ID], r.Reason)
	}
	return nil
}

func (s *State) register(t Trainer, at time.Time) error {
	if t.ID == "" || !(t.Speed >= 0 && t.Speed < maxSpeed) {
		return fmt.Errorf("%w: trainer %+v", ErrEntry, t)
	}
	if _, ok := s.Revoked[t.ID]; ok {
		return fmt.Errorf("%w: trainer %s is revoked", ErrTrainer, t.ID)
	}
	t.Measured = t.Speed > 0
	if old, ok := s.Trainers[t.ID]; ok {
		t.Joined = old.Joined
		if t.Speed == 0 {
			t.Speed, t.Measured = old.Speed, old.Measured
		}
	} else {
		t.Joined = at
	}
	if t.Speed == 0 {
		t.Speed = 1
	}
	t.Addrs = slices.Clone(t.Addrs)
	s.Trainers[t.ID] = &t
	return nil
}

func (s *State) leave(p mesh.PeerID) error {
	if _, ok := s.Trainers[p]; !ok {
		return fmt.Errorf("%w: %s", ErrTrainer, p)
	}
	delete(s.Trainers, p)
	return nil
}

func (s *State) start(e *Entry, term uint64) error {
	st := e.Start
	cur, ok := s.Current()
	switch {
	case !ok:
		return ErrNoGenesis
	case s.Round != nil:
		return fmt.Errorf("%w: round %d is still open", ErrFenced, s.Round.Number)
	case st.Round != s.Rounds+1:
		return fmt.Errorf("%w: round %d, next is %d", ErrFenced, st.Round, s.Rounds+1)
	case st.Base != cur.Version:
		return fmt.Errorf("%w: round from v%d, current is v%d", ErrVersion, st.Base, cur.Version)
	case len(st.Shares) == 0:
		return fmt.Errorf("%w: round with no shares", ErrEntry)
	}
	seen := map[core.BatchID]bool{}
	for t, ids := range st.Shares {
		if _, ok := s.Trainers[t]; !ok {
			return fmt.Errorf("%w: %s", ErrTrainer, t)
		}
		for _, id := range ids {
			b, ok := s.Batches[id]
			if !ok || b.Status != Pending || seen[id] {
				return fmt.Errorf("%w: %s is not pending", ErrBatch, id)
			}
			seen[id] = true
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("%w: round with no batch", ErrEntry)
	}
	shares := make(map[mesh.PeerID][]core.BatchID, len(st.Shares))
	for t, ids := range st.Shares {
		shares[t] = slices.Clone(ids)
		for _, id := range ids {
			b := s.Batches[id]
			s.setStatus(b, Assigned)
			b.Round, b.Trainer = st.Round, t
			b.Tries++
		}
	}
	s.Rounds = st.Round
	s.Round = &Round{Number: st.Round, Base: st.Base, Term: term, Leader: st.Leader, Started: e.At, Deadline: st.Deadline, Shares: shares}
	return nil
}

func (s *State) publish(e *Entry, term, index uint64) error {
	p := e.Publish
	r := s.Round
	cur, _ := s.Current()
	switch {
	case r == nil || r.Number != p.Round:
		return fmt.Errorf("%w: round %d", ErrNoRound, p.Round)
	case p.Parent != cur.Version || p.Version != cur.Version+1 || r.Base != cur.Version:
		return fmt.Errorf("%w: v%d from v%d, current is v%d", ErrVersion, p.Version, p.Parent, cur.Version)
	case !validHash(p.Hash):
		return fmt.Errorf("%w: hash %q", ErrEntry, p.Hash)
	case len(p.Contributors) == 0:
		return fmt.Errorf("%w: a version with no contributor", ErrEntry)
	}
	for i, ev := range p.Evals {
		if ev.Version != p.Version {
			return fmt.Errorf("%w: evaluation of v%d published with v%d", ErrEntry, ev.Version, p.Version)
		}
		if slices.ContainsFunc(p.Evals[:i], func(o Eval) bool { return o.Task == ev.Task }) {
			return fmt.Errorf("%w: two evaluations on one task set", ErrEntry)
		}
		if err := s.checkEval(ev); err != nil {
			return err
		}
	}
	if err := s.settle(r, p.Contributors, p.Refused, p.Version); err != nil {
		return err
	}
	cs := slices.Clone(p.Contributors)
	for i := range cs {
		cs[i].Batches = slices.Clone(cs[i].Batches)
	}
	s.Versions = append(s.Versions, Version{Version: p.Version, Hash: p.Hash, Parent: p.Parent, Term: term, Index: index,
		Round: r.Number, Started: r.Started, Publisher: p.Publisher, Contributors: cs, At: e.At, Evals: slices.Clone(p.Evals)})
	s.Round = nil
	return nil
}

// settle closes round r: the contributors' batches are trained into
// version, the refused ones refused, the others go back to pending. It
// checks everything before it changes anything.
func (s *State) settle(r *Round, contributors []Contribution, refusals []Refusal, version uint64) error {
	owner := map[core.BatchID]mesh.PeerID{}
	for t, ids := range r.Shares {
		for _, id := range ids {
			owner[id] = t
		}
	}
	trained := map[core.BatchID]mesh.PeerID{}
	for i, c := range contributors {
		if _, ok := r.Shares[c.Trainer]; !ok {
			return fmt.Errorf("%w: %s has no share of round %d", ErrTrainer, c.Trainer, r.Number)
		}
		if slices.ContainsFunc(contributors[:i], func(o Contribution) bool { return o.Trainer == c.Trainer }) {
			return fmt.Errorf("%w: %s contributes twice", ErrEntry, c.Trainer)
		}
		if !finite(c.Norm) || !finite(c.Clipped) || !finite(c.Seconds) {
			return fmt.Errorf("%w: contribution of %s: norm %v, clipped %v, seconds %v", ErrEntry, c.Trainer, c.Norm, c.Clipped, c.Seconds)
		}
		for _, id := range c.Batches {
			if owner[id] != c.Trainer || trained[id] != "" {
				return fmt.Errorf("%w: %s is not %s's to train in round %d", ErrBatch, id, c.Trainer, r.Number)
			}
			trained[id] = c.Trainer
		}
	}
	refused := map[core.BatchID]string{}
	for _, rf := range refusals {
		b, ok := s.Batches[rf.ID]
		if !ok || b.Round != r.Number || b.Status != Assigned || trained[rf.ID] != "" || rf.Reason == "" {
			return fmt.Errorf("%w: refusal of %s", ErrBatch, rf.ID)
		}
		refused[rf.ID] = rf.Reason
	}
	for _, ids := range r.Shares {
		for _, id := range ids {
			b := s.Batches[id]
			switch {
			case trained[id] != "":
				s.setStatus(b, Trained)
				b.Version, b.Trainer = version, trained[id]
			case refused[id] != "":
				s.refuseBatch(b, refused[id])
			default:
				s.unassign(b)
			}
		}
	}
	return nil
}

// close closes the open round with no version (Close).
func (s *State) close(e *Entry) error {
	c := e.Close
	r := s.Round
	switch {
	case r == nil || r.Number != c.Round:
		return fmt.Errorf("%w: round %d", ErrNoRound, c.Round)
	case len(c.Contributors) == 0:
		return fmt.Errorf("%w: a round closed with no contributor (abort it)", ErrEntry)
	}
	if err := s.settle(r, c.Contributors, c.Refused, r.Base); err != nil {
		return err
	}
	cs := slices.Clone(c.Contributors)
	for i := range cs {
		cs[i].Batches = slices.Clone(cs[i].Batches)
	}
	s.Closed = append(s.Closed, ClosedRound{Round: r.Number, Base: r.Base, Started: r.Started, At: e.At, Contributors: cs, Reason: c.Reason})
	s.Round = nil
	return nil
}

func (s *State) abort(a Abort) error {
	r := s.Round
	if r == nil || r.Number != a.Round {
		return fmt.Errorf("%w: round %d", ErrNoRound, a.Round)
	}
	for _, ids := range r.Shares {
		for _, id := range ids {
			s.unassign(s.Batches[id])
		}
	}
	s.Round = nil
	return nil
}

// unassign returns a batch of a closed round that no one trained to
// pending, or refuses it if its device was revoked while the round ran.
func (s *State) unassign(b *Batch) {
	b.Round, b.Trainer = 0, ""
	if reason, ok := s.Revoked[b.From]; ok && b.From != "" {
		s.refuseBatch(b, ReasonRevoked+revokedWhy(reason))
		return
	}
	s.setStatus(b, Pending)
}

func (s *State) revoke(rv Revocation) error {
	if rv.Peer == "" {
		return fmt.Errorf("%w: revocation of no one", ErrEntry)
	}
	if _, ok := s.Revoked[rv.Peer]; ok {
		return nil
	}
	s.Revoked[rv.Peer] = rv.Reason
	delete(s.Trainers, rv.Peer)
	for _, b := range s.sortedBatches(0, func(b *Batch) bool { return b.From == rv.Peer && b.Status == Pending }) {
		s.refuseBatch(b, ReasonRevoked+revokedWhy(rv.Reason))
	}
	return nil
}

// maxVotes bounds a certification's votes (mesh/member.MaxVoters).
const maxVotes = 64

func (s *State) certify(c Certify) error {
	v, ok := s.Version(c.Version)
	switch {
	case !ok || c.Version == 0:
		return fmt.Errorf("%w: certification of v%d", ErrVersion, c.Version)
	case c.Hash != v.Hash:
		return fmt.Errorf("%w: certification of v%d with hash %s, the lineage's is %s", ErrVersion, c.Version, short(c.Hash), short(v.Hash))
	case len(c.Voters) == 0 || len(c.Votes) == 0 || len(c.Votes) > maxVotes:
		return fmt.Errorf("%w: certification of v%d with %d votes", ErrEntry, c.Version, len(c.Votes))
	}
	for i, vt := range c.Votes {
		if vt.Peer == "" || len(vt.Sig) != 64 || slices.ContainsFunc(c.Votes[:i], func(o Vote) bool { return o.Peer == vt.Peer }) {
			return fmt.Errorf("%w: certification of v%d: a bad or repeated vote", ErrEntry, c.Version)
		}
	}
	cc := c
	cc.Voters = slices.Clone(c.Voters)
	cc.Votes = slices.Clone(c.Votes)
	s.Versions[c.Version].Cert = &cc
	return nil
}

func (s *State) retract(r Retract, at time.Time) error {
	cur, ok := s.Current()
	switch {
	case !ok || r.Version == 0 || r.Version != cur.Version || r.Hash != cur.Hash:
		return fmt.Errorf("%w: retraction of v%d, the newest is v%d", ErrVersion, r.Version, cur.Version)
	case cur.Cert != nil:
		return fmt.Errorf("%w: v%d is certified", ErrVersion, r.Version)
	case s.Round != nil:
		return fmt.Errorf("%w: round %d is open", ErrFenced, s.Round.Number)
	case r.Reason == "":
		return fmt.Errorf("%w: retraction without a reason", ErrEntry)
	}
	for _, b := range s.sortedBatches(0, func(b *Batch) bool { return b.Status == Trained && b.Version == r.Version }) {
		b.Version = 0
		s.unassign(b)
	}
	s.Versions = s.Versions[:len(s.Versions)-1]
	s.Retracted = append(s.Retracted, Retracted{Version: r.Version, Hash: r.Hash, Round: cur.Round, Reason: r.Reason, At: at})
	return nil
}

// maxReason bounds a bench's reason.
const maxReason = 1024

func (s *State) bench(b Bench, at time.Time) error {
	ev := b.Evidence
	switch {
	case b.Trainer == "":
		return fmt.Errorf("%w: a bench of no one", ErrEntry)
	case s.Trainers[b.Trainer] == nil && (s.Round == nil || s.Round.Number != b.Round || s.Round.Shares[b.Trainer] == nil):
		// One that left while its round ran is benched all the same.
		return fmt.Errorf("%w: %s", ErrTrainer, b.Trainer)
	case b.Reason == "" || len(b.Reason) > maxReason:
		return fmt.Errorf("%w: a bench of %s with a reason of %d bytes", ErrEntry, b.Trainer, len(b.Reason))
	case b.Round == 0 || b.Round > s.Rounds:
		return fmt.Errorf("%w: a bench for round %d of %d", ErrEntry, b.Round, s.Rounds)
	case !finite(ev.MaxAbsDiff) || !finite(ev.Tolerance):
		return fmt.Errorf("%w: a bench's difference %v, tolerance %v", ErrEntry, ev.MaxAbsDiff, ev.Tolerance)
	}
	if s.Benched == nil {
		s.Benched = map[mesh.PeerID]BenchRecord{}
	}
	ev.Batches = slices.Clone(ev.Batches)
	s.Benched[b.Trainer] = BenchRecord{Round: b.Round, Reason: b.Reason, Evidence: ev, At: at}
	return nil
}

func (s *State) clear(c Clear) error {
	if _, ok := s.Benched[c.Trainer]; !ok {
		return fmt.Errorf("%w: %s is not benched", ErrTrainer, c.Trainer)
	}
	delete(s.Benched, c.Trainer)
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := range len(h) {
		c := h[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Applied describes one entry as raft applied it (package raftfsm
// tells its watchers): the entry (nil if it did not decode), its log
// position, and why it was refused (nil: applied).
type Applied struct {
	Entry       *Entry
	Term, Index uint64
	Err         error
}
