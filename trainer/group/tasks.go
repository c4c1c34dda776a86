package group

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Defaults and bounds of a task set.
const (
	DefaultTaskGroup    = 8
	DefaultTaskHoldout  = 0.1
	DefaultTaskRatio    = 0.5
	DefaultTaskPerRound = 16
	DefaultTaskEpochs   = 1
	MaxTaskGroup        = 64
	MaxTaskItems        = 20000 // training prompts × epochs of one set
)

// TaskSet is a task set in the replicated state: what the log carries of
// it is its content hash and its metadata; the canonical file and the
// plugins travel between trainers by hash (trainer's opTaskFile). Adding a
// set puts one ledger line per training prompt and epoch (a Batch with
// Task, Prompt and Epoch set and Steps = Group), so the rounds consume
// prompts as they consume batches: a prompt trained into a version is
// never trained again in that epoch, and one of a round that closed
// without it goes back to pending, whoever leads.
type TaskSet struct {
	// Hash is the SHA-256 of the canonical task file (trainer/tasks).
	Hash string `json:"hash"`
	// Name is the file's name, for people.
	Name string `json:"name,omitempty"`
	// Reward is the SHA-256 of the verifier plugin, Tools of the tool
	// simulator plugin ("" when the set has none).
	Reward string `json:"reward"`
	Tools  string `json:"tools,omitempty"`
	// Group is G, the rollouts per prompt.
	Group int `json:"group"`
	// Holdout is the fraction held out for evaluation; Ratio the share of
	// a round's steps that rollouts take when live batches are pending
	// too; PerRound bounds the prompts of one round; Epochs is how many
	// times each training prompt is trained.
	Holdout  float64 `json:"holdout"`
	Ratio    float64 `json:"ratio"`
	PerRound int     `json:"per_round"`
	Epochs   int     `json:"epochs"`
	// MaxTokens bounds a reply (a task's meta.max_tokens overrides it).
	MaxTokens int `json:"max_tokens"`
	// Train and HeldOut are the task ids of each split (trainer/tasks
	// Split), in file order.
	Train   []string  `json:"train"`
	HeldOut []string  `json:"held_out"`
	Added   time.Time `json:"added"`
}

// Defaults of a task set's reply length.
const DefaultTaskMaxTokens = 32

// WithDefaults returns ts with zero fields set to their defaults.
func (ts TaskSet) WithDefaults() TaskSet {
	if ts.Group == 0 {
		ts.Group = DefaultTaskGroup
	}
	if ts.Ratio == 0 {
		ts.Ratio = DefaultTaskRatio
	}
	if ts.PerRound == 0 {
		ts.PerRound = DefaultTaskPerRound
	}
	if ts.Epochs == 0 {
		ts.Epochs = DefaultTaskEpochs
	}
	if ts.MaxTokens == 0 {
		ts.MaxTokens = DefaultTaskMaxTokens
	}
	return ts
}

// Validate reports a task set out of range (after defaults).
func (ts TaskSet) Validate() error {
	d := ts.WithDefaults()
	switch {
	case !validHash(d.Hash), !validHash(d.Reward), d.Tools != "" && !validHash(d.Tools):
		return fmt.Errorf("%w: task set hashes %q, %q, %q", ErrEntry, d.Hash, d.Reward, d.Tools)
	case d.Group < 2 || d.Group > MaxTaskGroup:
		return fmt.Errorf("%w: group of %d rollouts (2 to %d)", ErrConfig, d.Group, MaxTaskGroup)
	case !(d.Holdout >= 0 && d.Holdout < 1), !(d.Ratio > 0 && d.Ratio <= 1):
		return fmt.Errorf("%w: holdout %v (in [0, 1)), ratio %v (in (0, 1])", ErrConfig, d.Holdout, d.Ratio)
	case d.PerRound < 1 || d.Epochs < 1 || d.MaxTokens < 1 || d.MaxTokens > 4096:
		return fmt.Errorf("%w: per round %d, epochs %d, max tokens %d", ErrConfig, d.PerRound, d.Epochs, d.MaxTokens)
	case len(d.Train) == 0:
		return fmt.Errorf("%w: a task set with nothing to train on", ErrConfig)
	case len(d.Train)*d.Epochs > MaxTaskItems:
		return fmt.Errorf("%w: %d prompts × %d epochs, at most %d", ErrConfig, len(d.Train), d.Epochs, MaxTaskItems)
	}
	seen := map[string]bool{}
	for _, id := range slices.Concat(d.Train, d.HeldOut) {
		if id == "" || seen[id] {
			return fmt.Errorf("%w: task id %q empty or twice", ErrEntry, id)
		}
		seen[id] = true
	}
	return nil
}

// TaskItemID is the ledger id of a task set's prompt in one epoch.
func TaskItemID(set, prompt string, epoch int) core.BatchID {
	h := sha256.Sum256([]byte("clawmesh task\x00" + set + "\x00" + prompt + "\x00" + strconv.Itoa(epoch)))
	return core.BatchID(hex.EncodeToString(h[:]))
}

// Eval is one evaluation of a version on a task set's held-out split: a
// held-out prompt passes when the verifier gives its greedy (temperature
// 0) reply a positive score; PassAt1 is the share that pass, MeanReward
// the verifier's mean score (abstentions count 0). Abstained counts the
// held-out prompts whose reply the verifier gave no score (it abstained,
// trapped or timed out): when they are most of them, PassAt1 and
// MeanReward say little.
type Eval struct {
	Version    uint64  `json:"version"`
	Task       string  `json:"task"`
	Prompts    int     `json:"prompts"`
	Passed     int     `json:"passed"`
	PassAt1    float64 `json:"pass_at_1"`
	MeanReward float64 `json:"mean_reward"`
	By         string  `json:"by,omitempty"`
	Abstained  int     `json:"abstained,omitempty"`
}

// MostlyAbstained reports whether the verifier abstained on more than
// half the evaluation's prompts.
func (e Eval) MostlyAbstained() bool { return e.Prompts > 0 && 2*e.Abstained > e.Prompts }

// SettingsDiff lists, in `clawmesh tasks add`'s terms, the settings in
// which here, a set as a trainer would add it, differs from in, the same
// set as the group holds it (defaults applied to both): "--holdout 0.25
// here, 0.1 in the group". The splits are not compared: the group keeps
// the split a set was added with, and Holdout says what was asked.
func SettingsDiff(in, here TaskSet) []string {
	in, here = in.WithDefaults(), here.WithDefaults()
	var out []string
	plugin := func(h string) string {
		if h == "" {
			return "none"
		}
		return short(h)
	}
	if here.Reward != in.Reward {
		out = append(out, fmt.Sprintf("--reward: verifier %s here, %s in the group", plugin(here.Reward), plugin(in.Reward)))
	}
	if here.Tools != in.Tools {
		out = append(out, fmt.Sprintf("--tools: tool simulator %s here, %s in the group", plugin(here.Tools), plugin(in.Tools)))
	}
	for _, f := range []struct {
		flag        string
		here, group any
	}{
		{"--group", here.Group, in.Group},
		{"--holdout", here.Holdout, in.Holdout},
		{"--ratio", here.Ratio, in.Ratio},
		{"--per-round", here.PerRound, in.PerRound},
		{"--epochs", here.Epochs, in.Epochs},
		{"--max-tokens", here.MaxTokens, in.MaxTokens},
	} {
		if f.here != f.group {
			out = append(out, fmt.Sprintf("%s %v here, %v in the group", f.flag, f.here, f.group))
		}
	}
	return out
}

func (s *State) addTasks(ts TaskSet, at time.Time) error {
	if err := ts.Validate(); err != nil {
		return err
	}
	ts = ts.WithDefaults()
	if old, ok := s.TaskSets[ts.Hash]; ok {
		// Added already: the same content keeps its ledger and the split
		// it was added with; settings that differ are refused rather than
		// ignored.
		if diff := SettingsDiff(*old, ts); len(diff) > 0 {
			return fmt.Errorf("%w: task set %s is in the group already with other settings: %s", ErrConfig, short(ts.Hash), strings.Join(diff, "; "))
		}
		return nil
	}
	ts.Train, ts.HeldOut, ts.Added = slices.Clone(ts.Train), slices.Clone(ts.HeldOut), at
	if s.TaskSets == nil {
		s.TaskSets = map[string]*TaskSet{}
	}
	s.TaskSets[ts.Hash] = &ts
	for e := range ts.Epochs {
		// Epochs in order; within one, the order of the ids' hashes (a
		// shuffle every trainer draws the same).
		added := at.Add(time.Duration(e) * time.Microsecond)
		for _, id := range ts.Train {
			b := &Batch{ID: TaskItemID(ts.Hash, id, e), Steps: ts.Group, Added: added, Task: ts.Hash, Prompt: id, Epoch: e}
			s.Batches[b.ID] = b
			s.setStatus(b, Pending)
		}
	}
	return nil
}

func (s *State) eval(ev Eval) error {
	if _, ok := s.Version(ev.Version); !ok {
		return fmt.Errorf("%w: evaluation of v%d, not committed", ErrVersion, ev.Version)
	}
	if err := s.checkEval(ev); err != nil {
		return err
	}
	evs := &s.Versions[ev.Version].Evals
	for i := range *evs {
		if (*evs)[i].Task == ev.Task {
			return nil // the first evaluation stands
		}
	}
	*evs = append(*evs, ev)
	return nil
}

// checkEval checks an evaluation against its task set.
func (s *State) checkEval(ev Eval) error {
	ts := s.TaskSets[ev.Task]
	switch {
	case ts == nil:
		return fmt.Errorf("%w: evaluation on an unknown task set", ErrEntry)
	case ev.Prompts != len(ts.HeldOut) || ev.Passed < 0 || ev.Abstained < 0 || ev.Passed+ev.Abstained > ev.Prompts ||
		!finite(ev.PassAt1) || !finite(ev.MeanReward) || math.Abs(ev.MeanReward) > 1 || ev.PassAt1 < 0 || ev.PassAt1 > 1:
		return fmt.Errorf("%w: evaluation %+v", ErrEntry, ev)
	}
	return nil
}

// TaskProgress counts a task set's ledger lines by status.
type TaskProgress struct {
	Total, Pending, Assigned, Trained int
}

// Progress counts the ledger lines of task set hash.
func (s *State) Progress(hash string) TaskProgress {
	var p TaskProgress
	for _, b := range s.Batches {
		if b.Task != hash {
			continue
		}
		p.Total++
		switch b.Status {
		case Pending:
			p.Pending++
		case Assigned:
			p.Assigned++
		case Trained:
			p.Trained++
		}
	}
	return p
}

// SortedTaskSets lists the task sets oldest first.
func (s *State) SortedTaskSets() []*TaskSet {
	out := make([]*TaskSet, 0, len(s.TaskSets))
	for _, ts := range s.TaskSets {
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b *TaskSet) int {
		if c := a.Added.Compare(b.Added); c != 0 {
			return c
		}
		return cmp.Compare(a.Hash, b.Hash)
	})
	return out
}

// Unevaluated lists, for the current version, the task sets with a
// held-out split that it has no evaluation on yet.
func (s *State) Unevaluated() []string {
	cur, ok := s.Current()
	if !ok {
		return nil
	}
	var out []string
	for _, ts := range s.SortedTaskSets() {
		if len(ts.HeldOut) == 0 || slices.ContainsFunc(cur.Evals, func(e Eval) bool { return e.Task == ts.Hash }) {
			continue
		}
		out = append(out, ts.Hash)
	}
	return out
}
