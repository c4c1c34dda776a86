package reward

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// stepReplying is a closed step whose reply is text.
func stepReplying(text string) *core.Step {
	s := stepSaying("Mail Bob for me")
	s.Response.Choices[0].Message.Content = text
	return s
}

func hashOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestRescore: Rescore keeps the verdicts a peer can replay from the step
// alone, leaves out failures and verdicts that depend on a config, keeps a
// judge plugin's earlier score without asking the judge, and combines what
// it keeps.
func TestRescore(t *testing.T) {
	contact := testdataPlugin(t, "contact")
	judged := 0
	r := newTestRunner(t, Options{
		Plugins: []PluginConfig{
			{Name: "contact", Path: contact, Enabled: true},
			{Name: "signed", Path: contact, Enabled: true, Config: map[string]string{"sign": "-1"}},
			{Name: "echo", Path: testdataPlugin(t, "jsonv1"), Enabled: true, Weight: 0.5, Config: map[string]string{"echo": "x"}},
			{Name: "judge", Builtin: "judge", Enabled: true, Judge: true, Config: map[string]string{"votes": "3"}},
			{Name: "off", Builtin: "correction"},
		},
		Judge: func(context.Context, string) (string, error) { judged++; return "Score: 1", nil },
	})
	ctx := context.Background()
	step := stepReplying("Write to bob@example.com.")
	jm, _ := builtin.Module("judge")
	prior := core.Score{Plugin: "judge", Hash: hashOf(jm), Value: ptr(1), Weight: 1, Labels: []string{"judge"}, Reason: "votes +1:3"}
	step.Reward = &core.Reward{Scores: []core.Score{prior}}

	rw := r.Rescore(ctx, step)
	if judged != 0 {
		t.Fatalf("the judge was asked %d times", judged)
	}
	var names []string
	for _, s := range rw.Scores {
		names = append(names, s.Plugin)
	}
	if !slices.Equal(names, []string{"contact", "echo", "judge"}) {
		t.Fatalf("scores of %v, want contact, echo and judge (signed depends on its config, off is disabled)", names)
	}
	c, e, j := rw.Scores[0], rw.Scores[1], rw.Scores[2]
	if c.Value == nil || *c.Value != 1 || c.Hint != "write to bob@example.com" {
		t.Errorf("contact: %+v", c)
	}
	if e.Value == nil || *e.Value != 0.5 || !slices.Contains(e.Labels, "echo=x") {
		t.Errorf("echo (run with its config, which changes only its labels): %+v", e)
	}
	if j.Value == nil || *j.Value != 1 || j.Reason != prior.Reason {
		t.Errorf("judge: %+v, want the earlier score %+v", j, prior)
	}
	if rw.Value == nil || *rw.Value != 1 { // 1 + 0.5*0.5 + 1, clamped
		t.Errorf("combined %v", fmtVal(rw.Value))
	}

	// No earlier judge score: the judge plugin is left out, not asked.
	step.Reward = nil
	rw = r.Rescore(ctx, step)
	if len(rw.Scores) != 2 || judged != 0 {
		t.Fatalf("no earlier judge score: %+v, judge asked %d times", rw.Scores, judged)
	}
	// A plugin that fails gives no score.
	rw = r.Rescore(ctx, stepReplying("trap"))
	for _, s := range rw.Scores {
		if s.Plugin == "contact" {
			t.Fatalf("a failed call kept: %+v", s)
		}
	}
}

// TestReplay: a replay refuses judge calls and says the plugin asked; with
// NoConfig the plugin sees no config.
func TestReplay(t *testing.T) {
	contact := testdataPlugin(t, "contact")
	asked := false
	r := newTestRunner(t, Options{
		Plugins: []PluginConfig{
			{Name: "signed", Path: contact, Enabled: true, Config: map[string]string{"sign": "-1"}},
			{Name: "judge", Builtin: "judge", Enabled: true, Judge: true},
		},
		Judge: func(context.Context, string) (string, error) { asked = true; return "Score: 1", nil },
	})
	ctx := context.Background()
	step := stepReplying("Write to bob@example.com.")
	j := r.Replay(ctx, "judge", step, ReplayOptions{})
	if !j.Judged || j.Failed || asked || j.Score.Value != nil {
		t.Fatalf("judge replay %+v, judge asked: %v", j, asked)
	}
	with, without := r.Replay(ctx, "signed", step, ReplayOptions{}), r.Replay(ctx, "signed", step, ReplayOptions{NoConfig: true})
	if with.Judged || without.Judged || *with.Score.Value != -1 || *without.Score.Value != 1 {
		t.Fatalf("with config %+v, without %+v", with, without)
	}
	if SameVerdict(with.Score, without.Score, 1e-9) {
		t.Fatal("SameVerdict: -1 and 1 the same")
	}
	if got := r.Replay(ctx, "nope", step, ReplayOptions{}); !got.Failed {
		t.Fatalf("unknown plugin: %+v", got)
	}
	if got := r.Replay(ctx, "signed", stepReplying("trap"), ReplayOptions{}); !got.Failed {
		t.Fatalf("a trap: %+v", got)
	}
}

func TestSameVerdict(t *testing.T) {
	cases := []struct {
		a, b core.Score
		same bool
	}{
		{core.Score{}, core.Score{}, true},
		{core.Score{Value: ptr(0.5)}, core.Score{}, false},
		{core.Score{Value: ptr(0.5)}, core.Score{Value: ptr(0.5 + 1e-12)}, true},
		{core.Score{Value: ptr(0.5)}, core.Score{Value: ptr(0.6)}, false},
		{core.Score{Hint: "a"}, core.Score{Hint: "b"}, false},
		{core.Score{Value: ptr(1), Labels: []string{"x"}, Reason: "r"}, core.Score{Value: ptr(1)}, true},
	}
	for i, c := range cases {
		if got := SameVerdict(c.a, c.b, 1e-9); got != c.same {
			t.Errorf("%d: SameVerdict = %v", i, got)
		}
	}
}

// TestModule: the runner serves the modules it loaded by hash, after a
// Reload too, and not one whose file changed.
func TestModule(t *testing.T) {
	src, err := os.ReadFile(testdataPlugin(t, "contact"))
	if err != nil {
		t.Fatal(err)
	}
	path := writeWasm(t, "contact", src)
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: path, Enabled: true}, {Builtin: "hint", Enabled: true}}})
	hm, _ := builtin.Module("hint")
	for _, want := range [][]byte{src, hm} {
		got, err := r.Module(hashOf(want))
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("module %s: %d bytes, %v", hashOf(want)[:12], len(got), err)
		}
	}
	if _, err := r.Module(hashOf([]byte("nothing"))); !errors.Is(err, ErrUnknownPlugin) {
		t.Fatalf("unknown hash: %v", err)
	}
	ctx := context.Background()
	if err := r.Reload(ctx, []PluginConfig{{Builtin: "correction", Enabled: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Module(hashOf(hm)); err != nil {
		t.Fatalf("a module of the set before the reload: %v", err)
	}
	if err := os.WriteFile(path, append(src, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Module(hashOf(src)); !errors.Is(err, ErrUnknownPlugin) {
		t.Fatalf("a changed file: %v", err)
	}
}
