package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// TasksDir holds, in a trainer's data directory, the task sets' canonical
// files and their plugins, each named by its SHA-256. The raft log carries
// only the hashes and the metadata (group.TaskSet); the bytes travel
// between trainers over Protocol (opTaskFile), fetched by hash and checked
// against it, as adapter versions do.
const TasksDir = "tasks"

// maxTaskFile bounds a file fetched for a task set: a set's canonical file
// is at most tasks.MaxSet, a plugin at most this.
const maxTaskFile = 64 << 20

// ErrTasks reports a task set a trainer refuses to add.
var ErrTasks = errors.New("trainer: task set refused")

// verifierName and toolsName name the plugins in a task set's runner.
const (
	verifierName = "verifier"
	toolsName    = "tools"
)

// AddTasks is a task set as `clawmesh tasks add` hands it to a trainer.
type AddTasks struct {
	// Name is the task file's name, for people.
	Name string `json:"name"`
	// Tasks is the task file (JSONL), Reward the verifier plugin and Tools
	// the optional tool simulator plugin (WASM modules).
	Tasks  []byte `json:"tasks"`
	Reward []byte `json:"reward"`
	Tools  []byte `json:"tools,omitempty"`
	// Group, Ratio, PerRound, Epochs and MaxTokens: see group.TaskSet
	// (0: its defaults). Holdout is taken as it is: 0 holds nothing out.
	Group     int     `json:"group,omitempty"`
	Holdout   float64 `json:"holdout"`
	Ratio     float64 `json:"ratio,omitempty"`
	PerRound  int     `json:"per_round,omitempty"`
	Epochs    int     `json:"epochs,omitempty"`
	MaxTokens int     `json:"max_tokens,omitempty"`
}

// TasksAdded is what AddTasks did: the set as the group holds it, and
// whether the group held it already with the same settings (then nothing
// changed: its ledger and its split are the ones it was added with).
type TasksAdded struct {
	group.TaskSet
	Existing bool `json:"existing,omitempty"`
}

// AddTasks checks a task set (its lines, that its plugins load, that its
// verifier scores some of its first tasks), keeps its files, and has the
// group's leader add it. A set the group holds already is not added
// again: with the same settings AddTasks says so (Existing), with others
// it is refused, naming them. Nothing it does before the group commits
// the set touches what the rounds run.
func (t *Trainer) AddTasks(ctx context.Context, a AddTasks) (*TasksAdded, error) {
	set, err := tasks.Parse(bytes.NewReader(a.Tasks))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTasks, err)
	}
	if len(a.Reward) == 0 {
		return nil, fmt.Errorf("%w: no verifier plugin", ErrTasks)
	}
	if !(a.Holdout >= 0 && a.Holdout < 1) {
		return nil, fmt.Errorf("%w: holdout %v outside [0, 1)", ErrTasks, a.Holdout)
	}
	ts := group.TaskSet{Hash: set.Hash, Name: filepath.Base(a.Name), Reward: tasks.Hash(a.Reward), Group: a.Group,
		Holdout: a.Holdout, Ratio: a.Ratio, PerRound: a.PerRound, Epochs: a.Epochs, MaxTokens: a.MaxTokens}
	if len(a.Tools) > 0 {
		ts.Tools = tasks.Hash(a.Tools)
	}
	train, held := set.Split(a.Holdout)
	ts.Train, ts.HeldOut = taskIDs(train), taskIDs(held)
	if err := ts.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTasks, err)
	}
	if in, err := t.compareTaskSet(&ts); in != nil || err != nil {
		return in, err
	}
	for _, b := range [][]byte{set.Canonical, a.Reward, a.Tools} {
		if len(b) > 0 {
			if err := t.putTaskFile(b); err != nil {
				return nil, err
			}
		}
	}
	// The plugins must load here, and the verifier score something,
	// before the group learns of them. The runner is this check's alone:
	// the rounds' runtimes are made from what the group commits.
	runner, err := t.taskRunner(ctx, &ts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTasks, err)
	}
	err = probeVerifier(ctx, runner, set)
	runner.Close(context.Background())
	if err != nil {
		return nil, err
	}
	// The set's ids may not fit a request line: they go as its payload.
	payload, err := json.Marshal(&ts)
	if err != nil {
		return nil, err
	}
	out, err := t.toLeader(ctx, request{Op: opTasks}, payload)
	if err != nil {
		return nil, err
	}
	var rep addReply
	if len(out) > 0 && json.Unmarshal(out, &rep) == nil && rep.Existing {
		// Added by someone else since this trainer looked.
		if in, err := t.compareTaskSet(&ts); in != nil || err != nil {
			return in, err
		}
		return &TasksAdded{TaskSet: ts.WithDefaults(), Existing: true}, nil
	}
	return &TasksAdded{TaskSet: ts.WithDefaults()}, nil
}

// addReply is the leader's answer to opTasks: Existing says the group
// holds the set already, with the same settings.
type addReply struct {
	Existing bool `json:"existing"`
}

func taskIDs(xs []*tasks.Task) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.ID
	}
	return out
}

// compareTaskSet compares ts with the set of the same hash in the group:
// nil, nil when the group lacks it; the group's set (Existing) when it
// holds it with the same settings; ErrTasks naming the settings that
// differ otherwise.
func (t *Trainer) compareTaskSet(ts *group.TaskSet) (*TasksAdded, error) {
	var (
		in   group.TaskSet
		ok   bool
		diff []string
	)
	t.group.view(func(s *group.State) {
		if p := s.TaskSets[ts.Hash]; p != nil {
			in, ok = *p, true
			diff = group.SettingsDiff(in, *ts)
		}
	})
	switch {
	case !ok:
		return nil, nil
	case len(diff) > 0:
		return nil, fmt.Errorf("%w: %s (sha256 %s) is in the group already, added as %s with other settings: %s; "+
			"add it with the group's settings, or change the file to add it as another set",
			ErrTasks, orName(ts.Name), short(ts.Hash), orName(in.Name), strings.Join(diff, "; "))
	}
	in.Train, in.HeldOut = slices.Clone(in.Train), slices.Clone(in.HeldOut)
	return &TasksAdded{TaskSet: in, Existing: true}, nil
}

func orName(name string) string {
	if name == "" {
		return "a set"
	}
	return name
}

// addTasks is the leader's side of AddTasks: it fetches the set's files
// from the trainer that asked (if it lacks them), checks the split against
// its own reading of the file and that the plugins load, and commits the
// set. A set the group holds already is not proposed again: with the same
// settings the reply says so, with others it is refused, naming them.
func (t *Trainer) addTasks(ctx context.Context, from mesh.PeerID, payload []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	ts := new(group.TaskSet)
	if err := dec.Decode(ts); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTasks, err)
	}
	if err := ts.Validate(); err != nil {
		return nil, err
	}
	if in, err := t.compareTaskSet(ts); err != nil {
		return nil, err
	} else if in != nil {
		return json.Marshal(addReply{Existing: true})
	}
	set, err := t.loadTaskSet(ctx, ts, from)
	if err != nil {
		return nil, err
	}
	// A trainer of an earlier version draws the split as it did.
	train, held := set.Split(ts.Holdout)
	ltrain, lheld := set.LegacySplit(ts.Holdout)
	if !(slices.Equal(taskIDs(train), ts.Train) && slices.Equal(taskIDs(held), ts.HeldOut)) &&
		!(slices.Equal(taskIDs(ltrain), ts.Train) && slices.Equal(taskIDs(lheld), ts.HeldOut)) {
		return nil, fmt.Errorf("%w: the split does not match the set's holdout", ErrTasks)
	}
	if from != t.self {
		runner, err := t.taskRunner(ctx, ts)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTasks, err)
		}
		runner.Close(context.Background())
	}
	if err := t.group.propose(ctx, &group.Entry{Tasks: ts}); err != nil {
		if errors.Is(err, group.ErrConfig) {
			return nil, fmt.Errorf("%w: %w", ErrTasks, err)
		}
		return nil, err
	}
	t.log.Info("task set added", "set", short(ts.Hash), "name", ts.Name, "train", len(ts.Train), "held_out", len(ts.HeldOut))
	return nil, nil
}

func (t *Trainer) taskPath(hash string) string {
	return filepath.Join(t.cfg.DataDir, TasksDir, hash)
}

// putTaskFile keeps b under its hash.
func (t *Trainer) putTaskFile(b []byte) error {
	p := t.taskPath(tasks.Hash(b))
	if exists(p) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(p, b, 0o600)
}

// taskFile returns the file named hash, fetching it from the hint, the
// leader or any trainer when this one lacks it.
func (t *Trainer) taskFile(ctx context.Context, hash string, hint mesh.PeerID) ([]byte, error) {
	if b, err := os.ReadFile(t.taskPath(hash)); err == nil && tasks.Hash(b) == hash {
		return b, nil
	}
	var errs []error
	seen := map[mesh.PeerID]bool{t.self: true, "": true}
	for _, p := range append([]mesh.PeerID{hint, t.group.leader()}, t.group.trainerPeers()...) {
		if seen[p] {
			continue
		}
		seen[p] = true
		b, err := t.call(ctx, p, request{Op: opTaskFile, Hash: hash}, nil)
		if err == nil && tasks.Hash(b) != hash {
			err = fmt.Errorf("trainer: %s gave a file that is not %s", p, short(hash))
		}
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if err := t.putTaskFile(b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("trainer: task file %s: %w", short(hash), errors.Join(append(errs, errors.New("no trainer could give it"))...))
}

// serveTaskFile answers opTaskFile.
func (t *Trainer) serveTaskFile(hash string) ([]byte, error) {
	if len(hash) != 64 {
		return nil, &rpcError{Code: codeNotFound, Msg: "bad hash"}
	}
	b, err := os.ReadFile(t.taskPath(hash))
	if err != nil || tasks.Hash(b) != hash || len(b) > maxTaskFile {
		return nil, &rpcError{Code: codeNotFound, Msg: fmt.Sprintf("no task file %s here", short(hash))}
	}
	return b, nil
}

// TaskSetStatus is a task set as `clawmesh tasks ls|status --json` print
// it (a stable format).
type TaskSetStatus struct {
	// Hash is the SHA-256 of the canonical task file; Name the file's
	// name; Reward and Tools the plugins' SHA-256 ("" for no tools).
	Hash   string `json:"hash"`
	Name   string `json:"name"`
	Reward string `json:"reward"`
	Tools  string `json:"tools,omitempty"`
	// Group is G, the rollouts per prompt; Holdout, Ratio, PerRound,
	// Epochs and MaxTokens as `tasks add` set them (defaults applied).
	Group     int     `json:"group"`
	Holdout   float64 `json:"holdout"`
	Ratio     float64 `json:"ratio"`
	PerRound  int     `json:"per_round"`
	Epochs    int     `json:"epochs"`
	MaxTokens int     `json:"max_tokens"`
	// Prompts is the training split's size, HeldOut the held-out one's.
	Prompts int `json:"prompts"`
	HeldOut int `json:"held_out"`
	// Items = Prompts × Epochs ledger lines; Done of them are trained
	// into a version, Assigned in the open round, Pending waiting.
	Items    int `json:"items"`
	Done     int `json:"done"`
	Assigned int `json:"assigned"`
	Pending  int `json:"pending"`
	// Added is when the group committed the set (the leader's clock).
	Added time.Time `json:"added"`
	// Evals are the versions' evaluations on the held-out split, oldest
	// version first: version, pass_at_1, mean_reward, prompts, passed,
	// abstained, mostly_abstained.
	Evals []TaskEval `json:"evals"`
}

// TaskEval is a version's evaluation as `tasks status --json` prints it:
// the lineage's, with the held-out prompts the verifier gave no score
// (Abstained, always printed) and whether they were more than half of
// them (MostlyAbstained: then pass@1 and the mean reward say little).
type TaskEval struct {
	group.Eval
	Abstained       int  `json:"abstained"`
	MostlyAbstained bool `json:"mostly_abstained"`
}

// TaskSets lists the group's task sets with their progress and their
// evaluations, oldest first.
func (t *Trainer) TaskSets() []TaskSetStatus {
	out := []TaskSetStatus{}
	t.group.view(func(s *group.State) {
		for _, ts := range s.SortedTaskSets() {
			p := s.Progress(ts.Hash)
			st := TaskSetStatus{Hash: ts.Hash, Name: ts.Name, Reward: ts.Reward, Tools: ts.Tools, Group: ts.Group,
				Holdout: ts.Holdout, Ratio: ts.Ratio, PerRound: ts.PerRound, Epochs: ts.Epochs, MaxTokens: ts.MaxTokens,
				Prompts: len(ts.Train), HeldOut: len(ts.HeldOut), Items: p.Total, Done: p.Trained, Assigned: p.Assigned,
				Pending: p.Pending, Added: ts.Added, Evals: []TaskEval{}}
			for _, v := range s.Versions {
				for _, e := range v.Evals {
					if e.Task == ts.Hash {
						st.Evals = append(st.Evals, TaskEval{Eval: e, Abstained: e.Abstained, MostlyAbstained: e.MostlyAbstained()})
					}
				}
			}
			out = append(out, st)
		}
	})
	return out
}

// handleTasks adds the task routes to the admin API.
func (t *Trainer) handleTasks(mux *http.ServeMux) {
	mux.HandleFunc("GET "+AdminPrefix+"tasks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, t.TaskSets())
	})
	mux.HandleFunc("POST "+AdminPrefix+"tasks", func(w http.ResponseWriter, r *http.Request) {
		var a AddTasks
		dec := json.NewDecoder(io.LimitReader(r.Body, 4*maxTaskFile))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a); err != nil {
			adminapi.WriteError(w, http.StatusBadRequest, err)
			return
		}
		added, err := t.AddTasks(r.Context(), a)
		if err != nil {
			code := http.StatusConflict
			if errors.Is(err, ErrTasks) {
				code = http.StatusBadRequest
			}
			adminapi.WriteError(w, code, err)
			return
		}
		writeJSON(w, added)
	})
}

// AddTasks hands a task set to the trainer, which has the group add it.
func (c *Client) AddTasks(ctx context.Context, a AddTasks) (*TasksAdded, error) {
	var added TasksAdded
	if err := c.do(ctx, http.MethodPost, "tasks", a, &added); err != nil {
		return nil, err
	}
	return &added, nil
}

// TaskSets lists the group's task sets.
func (c *Client) TaskSets(ctx context.Context) ([]TaskSetStatus, error) {
	var out []TaskSetStatus
	err := c.do(ctx, http.MethodGet, "tasks", nil, &out)
	return out, err
}
