package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// AdminPrefix is where the trainer's own admin API lives, beside the
// mesh's (peer.AdminPrefix).
const AdminPrefix = "/clawmesh/v1/trainer/"

// Status is what `clawmesh trainer status --json` prints: a stable
// contract.
type Status struct {
	Peer mesh.PeerID `json:"peer"`
	// State is leader, follower, candidate, joining (in no group yet) or
	// shutdown.
	State  string      `json:"state"`
	Leader mesh.PeerID `json:"leader,omitempty"`
	Term   uint64      `json:"term"`
	// Applied is the last log index applied to the state.
	Applied   uint64        `json:"applied"`
	Voters    []mesh.PeerID `json:"voters"`
	Nonvoters []mesh.PeerID `json:"nonvoters"`
	Config    group.Config  `json:"config"`
	// Rounds counts the rounds started; Round is the open one.
	Rounds  uint64         `json:"rounds"`
	Round   *RoundStatus   `json:"round,omitempty"`
	Version *VersionStatus `json:"version,omitempty"`
	// Versions counts the committed versions (version 0 included).
	Versions int `json:"versions"`
	// Batches counts the ledger's batches by status; Refusals the refused
	// ones by reason. Prompts counts the task sets' prompts in the ledger
	// (one line per prompt and epoch; never refused) by status.
	Batches  BatchCounts     `json:"batches"`
	Prompts  BatchCounts     `json:"prompts"`
	Refusals map[string]int  `json:"refusals"`
	Trainers []group.Trainer `json:"trainers"`
	// Trusted says whether the mesh's admin trusts this trainer (its voter
	// set names it): a voter, which votes in raft and certifies versions;
	// otherwise a volunteer. VoterSet is the voter set's sequence number
	// (0: none known), Trust the voters it names.
	Trusted  bool          `json:"trusted"`
	VoterSet uint64        `json:"voter_set"`
	Trust    []mesh.PeerID `json:"trusted_trainers"`
	// Certified says whether the current version is certified by a quorum
	// of the voters (version 0, never shared, counts as certified);
	// Retracted counts the versions taken back uncertified.
	Certified bool `json:"certified"`
	Retracted int  `json:"retracted"`
	// Benched are the trainers a spot check caught, with why: they get no
	// share until the admin clears them (`clawmesh trainer clear PEER`).
	Benched []BenchedTrainer `json:"benched,omitempty"`
}

// BenchedTrainer is a benched trainer in the status.
type BenchedTrainer struct {
	Trainer mesh.PeerID `json:"trainer"`
	group.BenchRecord
}

// BatchCounts counts the ledger's batches.
type BatchCounts struct {
	Pending  int `json:"pending"`
	Assigned int `json:"assigned"`
	Trained  int `json:"trained"`
	Refused  int `json:"refused"`
}

// RoundStatus describes the open round.
type RoundStatus struct {
	Number   uint64              `json:"number"`
	Base     uint64              `json:"base"`
	Leader   mesh.PeerID         `json:"leader"`
	Started  time.Time           `json:"started"`
	Deadline time.Time           `json:"deadline"`
	Shares   map[mesh.PeerID]int `json:"shares"` // batches per trainer
}

// VersionStatus describes the current adapter version.
type VersionStatus struct {
	group.Version
	Name string `json:"name"`
	// Dir is where this trainer keeps its bundle ("" if it has not fetched
	// it).
	Dir string `json:"dir,omitempty"`
}

// Status reports the trainer's view of the group.
func (t *Trainer) Status() Status {
	st := Status{Peer: t.self, State: "joining", Voters: []mesh.PeerID{}, Nonvoters: []mesh.PeerID{}, Refusals: map[string]int{}, Trainers: []group.Trainer{}}
	g := t.group
	if servers, err := g.configuration(); err == nil && len(servers) > 0 {
		switch g.raft.State() {
		case raft.Leader:
			st.State = "leader"
		case raft.Follower:
			st.State = "follower"
		case raft.Candidate:
			st.State = "candidate"
		case raft.Shutdown:
			st.State = "shutdown"
		}
		for _, s := range servers {
			if s.Suffrage == raft.Voter {
				st.Voters = append(st.Voters, mesh.PeerID(s.ID))
			} else {
				st.Nonvoters = append(st.Nonvoters, mesh.PeerID(s.ID))
			}
		}
		slices.Sort(st.Voters)
		slices.Sort(st.Nonvoters)
	}
	if vs := t.mesh.Voters(); vs != nil {
		st.VoterSet, st.Trusted = vs.Seq(), vs.Has(string(t.self))
		for _, v := range vs.Voters() {
			st.Trust = append(st.Trust, mesh.PeerID(v.Peer))
		}
	}
	st.Leader = g.leader()
	st.Term = g.raft.CurrentTerm()
	st.Applied = g.raft.AppliedIndex()
	g.view(func(s *group.State) {
		st.Config = s.Config
		st.Rounds = s.Rounds
		st.Versions = len(s.Versions)
		st.Retracted = len(s.Retracted)
		if cur, ok := s.Current(); ok {
			st.Certified = cur.Version == 0 || cur.Cert != nil
		}
		if r := s.Round; r != nil {
			rs := &RoundStatus{Number: r.Number, Base: r.Base, Leader: r.Leader, Started: r.Started, Deadline: r.Deadline, Shares: map[mesh.PeerID]int{}}
			for p, ids := range r.Shares {
				rs.Shares[p] = len(ids)
			}
			st.Round = rs
		}
		if v, ok := s.Current(); ok {
			st.Version = &VersionStatus{Version: v, Name: v.Name()}
		}
		for h := range s.TaskSets {
			p := s.Progress(h)
			st.Prompts.Pending += p.Pending
			st.Prompts.Assigned += p.Assigned
			st.Prompts.Trained += p.Trained
		}
		st.Batches = BatchCounts{Pending: s.Counts[group.Pending] - st.Prompts.Pending, Assigned: s.Counts[group.Assigned] - st.Prompts.Assigned,
			Trained: s.Counts[group.Trained] - st.Prompts.Trained, Refused: s.Counts[group.Refused]}
		for k, v := range s.Refusals {
			st.Refusals[k] = v
		}
		for _, tr := range s.Trainers {
			st.Trainers = append(st.Trainers, *tr)
		}
		for p, b := range s.Benched {
			st.Benched = append(st.Benched, BenchedTrainer{Trainer: p, BenchRecord: b})
		}
	})
	slices.SortFunc(st.Benched, func(a, b BenchedTrainer) int { return compareIDs(a.Trainer, b.Trainer) })
	slices.SortFunc(st.Trainers, func(a, b group.Trainer) int { return compareIDs(a.ID, b.ID) })
	if st.Version != nil {
		if h, err := adapter.Hash(t.versionDir(st.Version.Version.Version)); err == nil && h == st.Version.Hash {
			st.Version.Dir = t.versionDir(st.Version.Version.Version)
		}
	}
	return st
}

func compareIDs(a, b mesh.PeerID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Ledger lists the ledger's batches, oldest first.
func (t *Trainer) Ledger() []group.Batch {
	var out []group.Batch
	t.group.view(func(s *group.State) {
		for _, b := range s.Batches {
			out = append(out, *b)
		}
	})
	slices.SortFunc(out, func(a, b group.Batch) int {
		if c := a.Added.Compare(b.Added); c != 0 {
			return c
		}
		return compareIDs(mesh.PeerID(a.ID), mesh.PeerID(b.ID))
	})
	return out
}

// Lineage lists the committed versions.
func (t *Trainer) Lineage() []group.Version {
	var out []group.Version
	t.group.view(func(s *group.State) { out = slices.Clone(s.Versions) })
	return out
}

// Leave hands this trainer's part over and takes it out of the group: a
// leader first transfers its leadership. The trainer keeps running until
// its caller stops it.
func (t *Trainer) Leave(ctx context.Context) error {
	g := t.group
	if !g.inGroup() {
		return errors.New("trainer: not in a group")
	}
	if g.isLeader() {
		servers, _ := g.configuration()
		if len(servers) > 1 {
			if err := g.raft.LeadershipTransfer().Error(); err != nil {
				return fmt.Errorf("trainer: handing the leadership over: %w", err)
			}
		}
	}
	if servers, _ := g.configuration(); len(servers) <= 1 {
		return nil // the last trainer: the group stays on its disk
	}
	t.left.Store(true)
	if _, err := t.toLeader(ctx, request{Op: opLeave}, nil); err != nil {
		t.left.Store(false)
		return err
	}
	return nil
}

// Configure changes the group's configuration: the fields of c that are
// set replace the group's.
func (t *Trainer) Configure(ctx context.Context, c group.Config) (group.Config, error) {
	var cur group.Config
	t.group.view(func(s *group.State) { cur = s.Config })
	merged := mergeConfig(cur, c)
	if err := merged.Validate(); err != nil {
		return cur, err
	}
	if _, err := t.toLeader(ctx, request{Op: opConfigure, Config: &merged}, nil); err != nil {
		return cur, err
	}
	return merged, nil
}

func mergeConfig(cur, c group.Config) group.Config {
	out := cur
	if c.Recipe != "" {
		out.Recipe = c.Recipe
	}
	if c.Base != "" {
		out.Base, out.BaseHash = c.Base, c.BaseHash
	}
	if c.Seed != 0 {
		out.Seed = c.Seed
	}
	if c.MaxLag != 0 {
		out.MaxLag = c.MaxLag
	}
	if c.LocalSteps != 0 {
		out.LocalSteps = c.LocalSteps
	}
	if c.LR != 0 {
		out.LR = c.LR
	}
	if c.Quota != 0 {
		out.Quota = c.Quota
	}
	if c.RoundSteps != 0 {
		out.RoundSteps = c.RoundSteps
	}
	if c.Deadline != 0 {
		out.Deadline = c.Deadline
	}
	if c.MinRoundSteps != 0 {
		out.MinRoundSteps = c.MinRoundSteps
	}
	if c.RoundWait != 0 {
		out.RoundWait = c.RoundWait
	}
	if c.Aggregate != "" {
		out.Aggregate = c.Aggregate
	}
	if c.RLWeight != 0 {
		out.RLWeight = c.RLWeight
	}
	if c.OPDWeight != 0 {
		out.OPDWeight = c.OPDWeight
	}
	if c.MaxNorm != 0 {
		out.MaxNorm = c.MaxNorm
	}
	if c.Trim != 0 {
		out.Trim = c.Trim
	}
	return out.WithDefaults()
}

// handler is the admin API: the mesh's (when this trainer runs its own
// peer) and the trainer's. stop ends Run after a leave.
func (t *Trainer) handler(stop func()) http.Handler {
	mux := http.NewServeMux()
	if t.peer != nil {
		mux.Handle(peer.AdminPrefix, peer.Handler(t.peer, Batches{t.store}))
	}
	mux.HandleFunc("GET "+AdminPrefix+"status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, t.Status())
	})
	mux.Handle("GET /metrics", t.Metrics())
	t.handleTasks(mux)
	mux.HandleFunc("GET "+AdminPrefix+"ledger", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, t.Ledger())
	})
	mux.HandleFunc("GET "+AdminPrefix+"lineage", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, t.Lineage())
	})
	mux.HandleFunc("POST "+AdminPrefix+"leave", func(w http.ResponseWriter, r *http.Request) {
		if err := t.Leave(r.Context()); err != nil {
			adminapi.WriteError(w, http.StatusConflict, err)
			return
		}
		writeJSON(w, map[string]any{"left": true, "leader": t.group.leader()})
		go func() {
			time.Sleep(200 * time.Millisecond) // let the reply go out
			stop()
		}()
	})
	mux.HandleFunc("POST "+AdminPrefix+"clear", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Trainer mesh.PeerID `json:"trainer"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			adminapi.WriteError(w, http.StatusBadRequest, err)
			return
		}
		if err := t.Clear(r.Context(), req.Trainer); err != nil {
			code := http.StatusConflict
			if errors.Is(err, ErrNotBenched) {
				code = http.StatusNotFound
			}
			adminapi.WriteError(w, code, err)
			return
		}
		writeJSON(w, map[string]any{"cleared": req.Trainer})
	})
	mux.HandleFunc("POST "+AdminPrefix+"config", func(w http.ResponseWriter, r *http.Request) {
		var c group.Config
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			adminapi.WriteError(w, http.StatusBadRequest, err)
			return
		}
		merged, err := t.Configure(r.Context(), c)
		if err != nil {
			code := http.StatusConflict
			if errors.Is(err, group.ErrConfig) {
				code = http.StatusBadRequest
			}
			adminapi.WriteError(w, code, err)
			return
		}
		writeJSON(w, merged)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
