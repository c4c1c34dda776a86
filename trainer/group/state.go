// Package group is the replicated state of the trainers' raft group and the
// decisions taken over it, both pure: State.Apply applies one committed log
// entry (the recipe and base model, the adapter lineage and its versions'
// evaluations, the batch ledger, the task sets whose prompts the ledger
// holds beside the batches, the trainer registry and the trainers benched
// by spot checks, revocations mirrored from the mesh), and State.Plan
// decides the next round from the state alone.
// Nothing here reads a clock, touches a disk or a network: the leader's
// clock travels in each entry, so every trainer applying the same log
// reaches the same state, and tests and the simulator can drive it
// directly. Package raftfsm adapts a State to raft.
package group

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/model/loss"
)

// Errors of Apply: an entry refused leaves the state unchanged. They are
// how fencing shows: a deposed leader's late entry names a round or a
// version that is no longer current.
var (
	ErrEntry     = errors.New("group: malformed entry")
	ErrConfig    = errors.New("group: bad configuration")
	ErrNoRound   = errors.New("group: no such open round")
	ErrVersion   = errors.New("group: not the next version")
	ErrBatch     = errors.New("group: batch not in the state the entry needs")
	ErrTrainer   = errors.New("group: unknown trainer")
	ErrFenced    = errors.New("group: refused by fencing")
	ErrGenesis   = errors.New("group: genesis already applied")
	ErrNoGenesis = errors.New("group: no adapter version yet")
)

// Defaults of Config.
const (
	DefaultBase       = "tiny"
	DefaultSeed       = 1
	DefaultMaxLag     = 2
	DefaultLocalSteps = 4
	DefaultQuota      = 256
	DefaultRoundSteps = 1024
	DefaultDeadline   = 2 * time.Minute
	// DefaultRoundWait is how long pending batches wait for
	// MinRoundSteps before a round starts anyway.
	DefaultRoundWait = time.Minute
	DefaultLR        = 1e-2
	DefaultTrim      = 0.2
	// MaxVoters bounds the group's voters; further trainers are non-voters.
	MaxVoters = 5
)

// Aggregation methods.
const (
	AggMean    = "mean"    // sample-weighted mean, each delta norm-clipped
	AggTrimmed = "trimmed" // coordinate-wise trimmed mean
)

// Config is what the mesh's trainers agree to train: chosen once by the
// admin, changed only by a Configure entry. The zero value of a field means
// its default (WithDefaults).
type Config struct {
	// Recipe is binary (rl), opd or combined (default combined).
	Recipe string `json:"recipe"`
	// Base names the base model: "tiny" (the tiny model built from Seed)
	// or a model directory's name; BaseHash, for a directory, is the
	// SHA-256 of its weights, which every trainer checks its own copy
	// against.
	Base     string `json:"base"`
	BaseHash string `json:"base_hash,omitempty"`
	// Seed seeds the tiny model's weights and version 0's adapter.
	Seed uint64 `json:"seed"`
	// MaxLag: steps produced by an adapter more than MaxLag versions older
	// than the current one are stale.
	MaxLag int `json:"max_lag"`
	// LocalSteps is K, the optimizer steps each trainer takes on its share.
	LocalSteps int `json:"local_steps"`
	// LR is the learning rate of those steps.
	LR float64 `json:"lr"`
	// Quota bounds the steps of one device in one round; RoundSteps the
	// steps of a round.
	Quota      int `json:"quota"`
	RoundSteps int `json:"round_steps"`
	// MinRoundSteps is how many steps of device batches must be pending
	// before a round starts, unless the oldest has waited RoundWait (or a
	// task set's prompts are ready): a round on a trickle of small batches
	// takes as many optimizer steps on a handful of samples as a full one
	// does on many, and publishes a version every device fetches. Default
	// 1: a round starts as soon as anything is pending.
	MinRoundSteps int           `json:"min_round_steps,omitempty"`
	RoundWait     time.Duration `json:"round_wait_ns,omitempty"`
	// Deadline is how long the leader waits for a round's deltas before it
	// leaves the stragglers out.
	Deadline time.Duration `json:"deadline_ns"`
	// Aggregate is AggMean (default) or AggTrimmed; MaxNorm caps every
	// delta's norm (0: only the round's lower median clips); Trim is the
	// fraction AggTrimmed cuts from each end.
	Aggregate string  `json:"aggregate"`
	MaxNorm   float64 `json:"max_norm,omitempty"`
	Trim      float64 `json:"trim,omitempty"`
	// RLWeight and OPDWeight mix the combined recipe's two signals, the
	// reward's and the hint's (loss.Weights); both zero means
	// loss.DefaultWeights, 1 and 1. Under AdamW only their ratio matters.
	RLWeight  float64 `json:"rl_weight,omitempty"`
	OPDWeight float64 `json:"opd_weight,omitempty"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Recipe == "" {
		c.Recipe = loss.RecipeCombined.String()
	}
	if c.Base == "" {
		c.Base = DefaultBase
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.LocalSteps == 0 {
		c.LocalSteps = DefaultLocalSteps
	}
	if c.LR == 0 {
		c.LR = DefaultLR
	}
	if c.Quota == 0 {
		c.Quota = DefaultQuota
	}
	if c.RoundSteps == 0 {
		c.RoundSteps = DefaultRoundSteps
	}
	if c.MinRoundSteps == 0 {
		c.MinRoundSteps = 1
	}
	if c.RoundWait == 0 {
		c.RoundWait = DefaultRoundWait
	}
	if c.Deadline == 0 {
		c.Deadline = DefaultDeadline
	}
	if c.Aggregate == "" {
		c.Aggregate = AggMean
	}
	if c.Aggregate == AggTrimmed && c.Trim == 0 {
		c.Trim = DefaultTrim
	}
	if c.RLWeight == 0 && c.OPDWeight == 0 {
		c.RLWeight, c.OPDWeight = loss.DefaultWeights.RL, loss.DefaultWeights.OPD
	}
	return c
}

// Validate reports a configuration out of range (after defaults).
func (c Config) Validate() error {
	d := c.WithDefaults()
	if _, err := loss.ParseRecipe(d.Recipe); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	// Each setting out of range is named, with its range.
	for _, r := range []struct {
		bad  bool
		what string
	}{
		{d.MaxLag < 0, fmt.Sprintf("max lag %d: want 0 or more", d.MaxLag)},
		{d.LocalSteps < 1 || d.LocalSteps > 10000, fmt.Sprintf("local steps %d: want 1 to 10000", d.LocalSteps)},
		{!(d.LR > 0) || d.LR > 1, fmt.Sprintf("learning rate %g: want more than 0, up to 1", d.LR)},
		{d.Quota < 1, fmt.Sprintf("quota %d: want 1 or more", d.Quota)},
		{d.RoundSteps < 1, fmt.Sprintf("round steps %d: want 1 or more", d.RoundSteps)},
		{d.Deadline < time.Second, fmt.Sprintf("round deadline %s: want 1s or more", d.Deadline)},
		{d.MinRoundSteps < 1, fmt.Sprintf("min round steps %d: want 1 or more", d.MinRoundSteps)},
		{d.RoundWait < 0, fmt.Sprintf("round wait %s: want 0 or more", d.RoundWait)},
		{d.Aggregate != AggMean && d.Aggregate != AggTrimmed, fmt.Sprintf("aggregate %q: want %s or %s", d.Aggregate, AggMean, AggTrimmed)},
		{!(d.MaxNorm >= 0) || math.IsInf(d.MaxNorm, 1), fmt.Sprintf("max norm %g: want 0 (none) or more", d.MaxNorm)},
		{!(d.Trim >= 0 && d.Trim < 0.5), fmt.Sprintf("trim %g: want 0 up to (not including) 0.5", d.Trim)},
	} {
		if r.bad {
			return fmt.Errorf("%w: %s", ErrConfig, r.what)
		}
	}
	switch {
	case !(d.RLWeight >= 0 && d.RLWeight <= MaxWeight), !(d.OPDWeight >= 0 && d.OPDWeight <= MaxWeight):
		return fmt.Errorf("%w: weights %g (reward) and %g (hint): each from 0 to %d", ErrConfig, d.RLWeight, d.OPDWeight, MaxWeight)
	case strings.ContainsAny(d.Base, "\n\x00"):
		return fmt.Errorf("%w: base %q", ErrConfig, d.Base)
	}
	return nil
}

// MaxWeight bounds each of the combined recipe's weights; as only their
// ratio matters, a larger pair would say nothing a smaller one cannot.
const MaxWeight = 10

// WeightsOf is the mix of the combined recipe's signals.
func (c Config) WeightsOf() loss.Weights {
	d := c.WithDefaults()
	return loss.Weights{RL: d.RLWeight, OPD: d.OPDWeight}
}

// RecipeOf is the loss recipe the configuration names.
func (c Config) RecipeOf() loss.Recipe {
	r, _ := loss.ParseRecipe(c.WithDefaults().Recipe)
	return r
}

// Status of a batch in the ledger.
type Status string

// Batch statuses.
const (
	Pending  Status = "pending"
	Assigned Status = "assigned"
	Trained  Status = "trained"
	Refused  Status = "refused"
)

// Batch is one batch's line in the ledger.
type Batch struct {
	ID core.BatchID `json:"id"`
	// From is the device that shipped it (the peer that announced it).
	From  mesh.PeerID `json:"from,omitempty"`
	Steps int         `json:"steps"`
	// Adapters are the adapter versions that produced its steps.
	Adapters []string  `json:"adapters,omitempty"`
	Added    time.Time `json:"added"`
	Status   Status    `json:"status"`
	// Round and Trainer: the round it is assigned to (or was trained in)
	// and the trainer that has it; Version the version it went into (for
	// one of a round closed with no version, Close, the round's base,
	// which it left as it was).
	Round   uint64      `json:"round,omitempty"`
	Trainer mesh.PeerID `json:"trainer,omitempty"`
	Version uint64      `json:"version,omitempty"`
	// Reason says why it was refused.
	Reason string `json:"reason,omitempty"`
	// Tries counts the rounds it was assigned to.
	Tries int `json:"tries,omitempty"`
	// Task, for a task set's prompt (not a device's batch), is the set's
	// hash, Prompt the task's id and Epoch the pass over the set it
	// belongs to (see TaskSet).
	Task   string `json:"task,omitempty"`
	Prompt string `json:"prompt,omitempty"`
	Epoch  int    `json:"epoch,omitempty"`
}

// Trainer is one trainer's line in the registry.
type Trainer struct {
	ID     mesh.PeerID `json:"id"`
	Engine string      `json:"engine"`
	Device string      `json:"device"`
	// Speed is the trainer's measured training speed in samples a second
	// (the leader shares rounds in proportion to it).
	Speed float64 `json:"speed"`
	// Measured says Speed was measured (reported at registration or by a
	// round); when false, Speed is the default of 1 a new trainer starts
	// with.
	Measured bool `json:"measured,omitempty"`
	// Addrs are where the trainer serves adapter versions.
	Addrs  []string  `json:"addrs,omitempty"`
	Joined time.Time `json:"joined"`
}

// Contribution is one trainer's part in a version.
type Contribution struct {
	Trainer mesh.PeerID    `json:"trainer"`
	Batches []core.BatchID `json:"batches"`
	Samples int            `json:"samples"`
	// Norm is its delta's norm, Clipped the norm it was clipped to.
	Norm    float64 `json:"norm"`
	Clipped float64 `json:"clipped"`
	// Seconds it spent training.
	Seconds float64 `json:"seconds"`
}

// Version is one adapter version in the lineage.
type Version struct {
	Version uint64 `json:"version"`
	// Hash is the SHA-256 of its PEFT bundle (trainer/adapter.Hash).
	Hash   string `json:"hash"`
	Parent uint64 `json:"parent"`
	// Term and Index are the raft term and log index of the entry that
	// committed it: the fencing token every peer compares.
	Term  uint64 `json:"term"`
	Index uint64 `json:"index"`
	Round uint64 `json:"round,omitempty"`
	// Started is when its round started (the leader's clock); At when it
	// was published.
	Started time.Time `json:"started,omitzero"`
	// Publisher is the leader that committed it.
	Publisher    mesh.PeerID    `json:"publisher,omitempty"`
	Contributors []Contribution `json:"contributors,omitempty"`
	At           time.Time      `json:"at"`
	// Evals are its evaluations on the task sets' held-out splits.
	Evals []Eval `json:"evals,omitempty"`
	// Cert is the voters' certification (nil: not certified yet; version
	// 0, which devices never fetch, is never certified).
	Cert *Certify `json:"cert,omitempty"`
}

// Retracted is a version taken back uncertified (Retract).
type Retracted struct {
	Version uint64    `json:"version"`
	Hash    string    `json:"hash"`
	Round   uint64    `json:"round"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
}

// BenchRecord is why a trainer is benched: the round whose delta a spot
// check refused, the reason and the evidence, and when.
type BenchRecord struct {
	Round    uint64       `json:"round"`
	Reason   string       `json:"reason"`
	Evidence SpotEvidence `json:"evidence"`
	At       time.Time    `json:"at"`
}

// ClosedRound is a round closed with no version: what its contributors
// trained changed nothing (Close).
type ClosedRound struct {
	Round uint64 `json:"round"`
	// Base is the version the round trained from, and stays current.
	Base         uint64         `json:"base"`
	Started      time.Time      `json:"started,omitzero"`
	At           time.Time      `json:"at"`
	Contributors []Contribution `json:"contributors"`
	Reason       string         `json:"reason,omitempty"`
}

// Name is the version as adapters are named on devices: "v7".
func (v Version) Name() string { return "v" + strconv.FormatUint(v.Version, 10) }

// Round is the open round.
type Round struct {
	Number uint64 `json:"number"`
	// Base is the version the round trains from.
	Base uint64 `json:"base"`
	// Term is the raft term of the entry that started it.
	Term     uint64                         `json:"term"`
	Leader   mesh.PeerID                    `json:"leader"`
	Started  time.Time                      `json:"started"`
	Deadline time.Time                      `json:"deadline"`
	Shares   map[mesh.PeerID][]core.BatchID `json:"shares"`
}

// Trainers lists the round's trainers, sorted.
func (r *Round) Trainers() []mesh.PeerID { return slices.Sorted(maps.Keys(r.Shares)) }

// State is the group's replicated state.
type State struct {
	Configured bool                     `json:"configured"`
	Config     Config                   `json:"config"`
	Versions   []Version                `json:"versions"`
	Batches    map[core.BatchID]*Batch  `json:"batches"`
	Trainers   map[mesh.PeerID]*Trainer `json:"trainers"`
	Revoked    map[mesh.PeerID]string   `json:"revoked"`
	Round      *Round                   `json:"round,omitempty"`
	Rounds     uint64                   `json:"rounds"`
	Counts     map[Status]int           `json:"counts"`
	Refusals   map[string]int           `json:"refusals,omitempty"`
	TaskSets   map[string]*TaskSet      `json:"task_sets,omitempty"`
	// Closed are the rounds closed with no version (Close), oldest first.
	Closed []ClosedRound `json:"closed,omitempty"`
	// Retracted are the versions taken back uncertified, oldest first.
	Retracted []Retracted `json:"retracted,omitempty"`
	// Benched are the trainers a spot check caught (Bench): they get no
	// share until the admin clears them (Clear). A bench outlasts the
	// trainer's leaving and registering again.
	Benched map[mesh.PeerID]BenchRecord `json:"benched,omitempty"`
	Term    uint64                      `json:"term"`
	Index   uint64                      `json:"index"`
}

// New returns an empty state.
func New() *State {
	return &State{
		Batches:  map[core.BatchID]*Batch{},
		Trainers: map[mesh.PeerID]*Trainer{},
		Revoked:  map[mesh.PeerID]string{},
		Counts:   map[Status]int{},
		Refusals: map[string]int{},
		TaskSets: map[string]*TaskSet{},
		Benched:  map[mesh.PeerID]BenchRecord{},
	}
}

// Current is the latest version, ok=false before genesis.
func (s *State) Current() (Version, bool) {
	if len(s.Versions) == 0 {
		return Version{}, false
	}
	return s.Versions[len(s.Versions)-1], true
}

// Version returns version v of the lineage.
func (s *State) Version(v uint64) (Version, bool) {
	if v >= uint64(len(s.Versions)) {
		return Version{}, false
	}
	return s.Versions[v], true
}

// Claim is a version as a peer announces it: fencing compares it with the
// lineage.
type Claim struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
	Term    uint64 `json:"term"`
	Index   uint64 `json:"index"`
}

// ClaimOf is v's claim.
func ClaimOf(v Version) Claim {
	return Claim{Version: v.Version, Hash: v.Hash, Term: v.Term, Index: v.Index}
}

// Check fences a claimed version: it is accepted only if the lineage
// committed exactly that version, with that hash, term and index. A deposed
// leader's late output, whatever it calls itself, is refused.
func (s *State) Check(c Claim) error {
	v, ok := s.Version(c.Version)
	if !ok {
		cur, _ := s.Current()
		if c.Term < cur.Term || (c.Term == cur.Term && c.Index <= cur.Index) {
			return fmt.Errorf("%w: version %d at term %d index %d is older than v%d (term %d, index %d)", ErrFenced, c.Version, c.Term, c.Index, cur.Version, cur.Term, cur.Index)
		}
		return fmt.Errorf("%w: version %d is not committed", ErrFenced, c.Version)
	}
	if v.Hash != c.Hash || v.Term != c.Term || v.Index != c.Index {
		return fmt.Errorf("%w: version %d is %s at term %d index %d, not %s at term %d index %d", ErrFenced, c.Version, short(v.Hash), v.Term, v.Index, short(c.Hash), c.Term, c.Index)
	}
	return nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func (s *State) setStatus(b *Batch, st Status) {
	if b.Status != "" {
		s.Counts[b.Status]--
	}
	b.Status = st
	s.Counts[st]++
}

// ParseVersion reads an adapter version named "7" or "v7"; ok=false for
// anything else ("" included).
func ParseVersion(name string) (uint64, bool) {
	t := strings.TrimPrefix(strings.TrimSpace(name), "v")
	if t == "" {
		return 0, false
	}
	v, err := strconv.ParseUint(t, 10, 64)
	return v, err == nil
}

// StaleBatch reports whether every step of b came from an adapter more than
// maxLag versions older than current. Steps with no version (a device's own
// base model, or an adapter not from the mesh) are never stale, nor are
// steps from a version past current, nor any step if maxLag < 0.
func StaleBatch(b *Batch, current uint64, maxLag int) bool {
	if len(b.Adapters) == 0 {
		return false
	}
	for _, a := range b.Adapters {
		v, ok := ParseVersion(a)
		if !ok || maxLag < 0 || v >= current || current-v <= uint64(maxLag) {
			return false
		}
	}
	return true
}

// sortedBatches lists the batches keep accepts (all if keep is nil) oldest
// first, then by id; size hints how many it will find. It filters before it
// sorts: the ledger only grows, and its trained batches are most of it.
func (s *State) sortedBatches(size int, keep func(*Batch) bool) []*Batch {
	bs := make([]*Batch, 0, size)
	for _, b := range s.Batches {
		if keep == nil || keep(b) {
			bs = append(bs, b)
		}
	}
	slices.SortFunc(bs, func(a, b *Batch) int {
		if c := a.Added.Compare(b.Added); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return bs
}
