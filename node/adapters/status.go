package adapters

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// Status is what `clawmesh weights ls --json` prints: a stable contract.
type Status struct {
	// Pin is the version pinned ("vN" or "base"); "" follows the newest.
	Pin string `json:"pin"`
	// Serving is the version requests go to now ("base" or "vN").
	Serving string `json:"serving"`
	// Personal is the device's personal version stacked on Serving ("p3";
	// "" when none).
	Personal string `json:"personal,omitempty"`
	// Latest is the newest version the mesh announced ("" if none).
	Latest string `json:"latest"`
	// Driver is the upstream kind that hot-swaps ("" when the upstream
	// cannot).
	Driver   string    `json:"driver"`
	Versions []Version `json:"versions"`
	// Error says why the wanted version is not serving yet.
	Error string `json:"error,omitempty"`
}

// Version is one version the node knows of.
type Version struct {
	Version string `json:"version"`
	// State is known (announced, not fetched), downloading, held
	// (fetched), installed, or serving.
	State  string `json:"state"`
	Bytes  uint64 `json:"bytes"`
	Bundle string `json:"bundle"` // SHA-256 of the bundle fetched, hex
	// Hash is the version's identity: the trainers' adapter hash, as
	// `trainer status` and the trainers' logs print it (core.ShortHash).
	Hash string `json:"hash,omitempty"`
	// Downloaded is the bytes on disk of a fetch in progress or stopped.
	Downloaded int64  `json:"downloaded,omitempty"`
	Term       uint64 `json:"term"`
	Index      uint64 `json:"index"`
	// Failed says why the model server would not serve it.
	Failed string `json:"failed,omitempty"`
	// Evals are the version's evaluations on the task sets' held-out
	// splits, from its signed manifest (none: not evaluated, or no task
	// set).
	Evals []Eval `json:"evals,omitempty"`
}

// Eval is a version's evaluation on one task set's held-out split, as the
// trainers signed it in the version's manifest.
type Eval struct {
	Task       string  `json:"task"` // the task set's SHA-256, hex
	Prompts    int     `json:"prompts"`
	Passed     int     `json:"passed"`
	PassAt1    float64 `json:"pass_at_1"` // Passed / Prompts
	MeanReward float64 `json:"mean_reward"`
}

// FormatEvals is how `weights ls` and the dashboard show a version's
// evaluations: "0.75 (3/4)" for one task set; with several, each prefixed
// by its set's first 8 hex characters and joined with ", ". "" for none.
func FormatEvals(evs []Eval) string {
	parts := make([]string, len(evs))
	for i, e := range evs {
		parts[i] = fmt.Sprintf("%.2f (%d/%d)", e.PassAt1, e.Passed, e.Prompts)
		if len(evs) > 1 {
			parts[i] = e.Task[:min(8, len(e.Task))] + " " + parts[i]
		}
	}
	return strings.Join(parts, ", ")
}

// EvalsOf returns m's evaluations as Status shows them (nil when it has
// none).
func EvalsOf(m *chunks.Manifest) []Eval {
	var out []Eval
	for _, e := range m.Evals {
		out = append(out, Eval{Task: e.Task, Prompts: e.Prompts, Passed: e.Passed, PassAt1: e.PassAt1(), MeanReward: e.MeanReward})
	}
	return out
}

// Status reports the versions known and which one serves.
func (f *Follower) Status() Status {
	f.mu.Lock()
	st := Status{Pin: f.st.Pin, Error: f.lastErr}
	st.Serving, st.Personal = SplitStack(f.Route().Version)
	progress := make(map[string]int64, len(f.progress))
	for id, p := range f.progress {
		progress[id] = p.Bytes
	}
	failed := make(map[string]string, len(f.failed))
	for k, v := range f.failed {
		failed[k] = v
	}
	f.mu.Unlock()
	if f.cfg.Driver != nil {
		st.Driver = f.cfg.Driver.Kind()
	}
	seen := map[string]bool{}
	add := func(m *chunks.Manifest, held bool) {
		name := m.Name()
		if seen[name] {
			return
		}
		seen[name] = true
		v := Version{Version: name, Bytes: m.Size, Bundle: m.BundleID(), Hash: m.AdapterHash, Term: m.Term, Index: m.Index, State: "known", Failed: failed[name], Evals: EvalsOf(m)}
		switch n, downloading := progress[v.Bundle]; {
		case name == st.Serving:
			v.State = "serving"
		case exists(f.VersionDir(name)):
			v.State = "installed"
		case held:
			v.State = "held"
		case downloading:
			v.State, v.Downloaded = "downloading", n
		}
		st.Versions = append(st.Versions, v)
	}
	if m := f.cfg.Weights.Latest(); m != nil {
		st.Latest = m.Name()
		_, err := f.cfg.Weights.Dir().Manifest(m.BundleID())
		add(m, err == nil && exists(f.cfg.Weights.Dir().BundlePath(m.BundleID())))
	}
	for _, m := range f.cfg.Weights.Dir().Held() {
		add(m, true)
	}
	sort.Slice(st.Versions, func(i, j int) bool {
		a, _ := ParseVersion(st.Versions[i].Version)
		b, _ := ParseVersion(st.Versions[j].Version)
		return a > b
	})
	if st.Versions == nil {
		st.Versions = []Version{}
	}
	return st
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
