package adapters_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/node/adapters"
)

// TestStatusShowsEvals: each version in Status carries the held-out
// evaluations its manifest holds, whether the node holds the bundle or
// only knows the version, and `weights ls --json` names them as its
// contract says; a version evaluated on no task set has no "evals".
func TestStatusShowsEvals(t *testing.T) {
	root := t.TempDir()
	wd, err := weights.OpenDir(filepath.Join(root, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	h := &held{dir: wd}
	arith, words := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	for v, evals := range map[uint64][]chunks.Eval{
		1: nil,
		2: {{Task: arith, Prompts: 4, Passed: 3, MeanReward: 0.5}, {Task: words, Prompts: 10, Passed: 1, MeanReward: -0.25}},
	} {
		b := []byte(strings.Repeat("bundle ", int(v)))
		if err := wd.Add(signed(t, b, v, evals), b); err != nil {
			t.Fatal(err)
		}
	}
	h.latest.Store(signed(t, []byte("a bundle not fetched"), 3, []chunks.Eval{{Task: arith, Prompts: 8, Passed: 8, MeanReward: 1}}))
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(root, "adapters"), Weights: h})
	if err != nil {
		t.Fatal(err)
	}
	st := f.Status()
	got := map[string]adapters.Version{}
	for _, v := range st.Versions {
		got[v.Version] = v
	}
	if len(got) != 3 || got["v3"].State != "known" || got["v2"].State != "held" {
		t.Fatalf("versions %+v", st.Versions)
	}
	if evs := got["v1"].Evals; evs != nil {
		t.Fatalf("v1 has no evaluation, shows %+v", evs)
	}
	want := map[string][]adapters.Eval{
		"v2": {{Task: arith, Prompts: 4, Passed: 3, PassAt1: 0.75, MeanReward: 0.5}, {Task: words, Prompts: 10, Passed: 1, PassAt1: 0.1, MeanReward: -0.25}},
		"v3": {{Task: arith, Prompts: 8, Passed: 8, PassAt1: 1, MeanReward: 1}},
	}
	for name, evs := range want {
		if g := got[name].Evals; len(g) != len(evs) {
			t.Fatalf("%s: evaluations %+v, want %+v", name, g, evs)
		}
		for i, e := range evs {
			if got[name].Evals[i] != e {
				t.Errorf("%s: evaluation %d is %+v, want %+v", name, i, got[name].Evals[i], e)
			}
		}
	}

	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Versions []map[string]json.RawMessage `json:"versions"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, v := range raw.Versions {
		name := strings.Trim(string(v["version"]), `"`)
		if _, ok := v["evals"]; ok != (name != "v1") {
			t.Errorf("%s: \"evals\" present %v in %s", name, ok, b)
		}
	}
	if !strings.Contains(string(b), `{"task":"`+arith+`","prompts":4,"passed":3,"pass_at_1":0.75,"mean_reward":0.5}`) {
		t.Fatalf("weights ls --json lacks v2's evaluation as the contract names it: %s", b)
	}
}

func TestFormatEvals(t *testing.T) {
	a, b := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	for _, c := range []struct {
		evals []adapters.Eval
		want  string
	}{
		{nil, ""},
		{[]adapters.Eval{{Task: a, Prompts: 4, Passed: 3, PassAt1: 0.75}}, "0.75 (3/4)"},
		{[]adapters.Eval{{Task: a, Prompts: 0}}, "0.00 (0/0)"},
		{[]adapters.Eval{{Task: a, Prompts: 4, Passed: 3, PassAt1: 0.75}, {Task: b, Prompts: 3, Passed: 1, PassAt1: 1.0 / 3}},
			"a1a1a1a1 0.75 (3/4), b2b2b2b2 0.33 (1/3)"},
		{[]adapters.Eval{{Task: "ab", Prompts: 1, Passed: 1, PassAt1: 1}, {Task: b, Prompts: 2}}, "ab 1.00 (1/1), b2b2b2b2 0.00 (0/2)"},
	} {
		if got := adapters.FormatEvals(c.evals); got != c.want {
			t.Errorf("%+v: %q, want %q", c.evals, got, c.want)
		}
	}
}
