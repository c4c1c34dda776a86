package reward

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func rolloutStep(reply string) *core.Step {
	return &core.Step{
		ID: "r1", Turn: core.TurnMain,
		Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: "2+2?"}}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: reply}}}},
	}
}

// TestTaskInBothLayouts: the task section reaches the kit the same in the
// JSON and the flat layout, and is absent from both without a task.
func TestTaskInBothLayouts(t *testing.T) {
	for _, task := range []Task{
		{ID: "t1", Answer: json.RawMessage(`"four"`), Meta: json.RawMessage(`{"level":"easy"}`)},
		{ID: "t2", Answer: json.RawMessage(`4`)},
		{ID: "t3"},
		{ID: "t4", Answer: json.RawMessage(`{not json`)}, // left out, not sent broken
	} {
		in := newInput(rolloutStep("4"))
		in.task = &task
		jb, err := in.encode(PluginConfig{Name: "v"})
		if err != nil {
			t.Fatal(err)
		}
		var want rewards.Input
		if err := json.Unmarshal(jb, &want); err != nil {
			t.Fatalf("%s: %v in %s", task.ID, err, jb)
		}
		got, err := rewards.DecodeFlat(in.encodeFlat(PluginConfig{Name: "v"}))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("%s: flat %+v, json %+v", task.ID, got.Task, want.Task)
		}
		if got.Task == nil || got.Task.ID != task.ID {
			t.Fatalf("%s: task %+v", task.ID, got.Task)
		}
		w := task.wire()
		if string(got.Task.Answer) != string(w.Answer) || string(got.Task.Meta) != string(w.Meta) {
			t.Fatalf("%s: answer %s meta %s", task.ID, got.Task.Answer, got.Task.Meta)
		}
	}
	in := newInput(rolloutStep("4"))
	got, err := rewards.DecodeFlat(in.encodeFlat(PluginConfig{}))
	if err != nil || got.Task != nil {
		t.Fatalf("no task: %+v, %v", got.Task, err)
	}
	if got.AnswerText() != "" {
		t.Fatal("an answer without a task")
	}
}

// TestVerifierAndOldPlugins: a verifier built with the kit reads the
// answer; plugins written before the task section (the JSON v1 test
// plugin; the built-in correction plugin as built by the kit before the
// section existed, kept in testdata, which reads the flat layout of
// version 2; today's built-in) score a rollout exactly as they score the
// same step without it.
func TestVerifierAndOldPlugins(t *testing.T) {
	ctx := context.Background()
	gz, err := os.Open("testdata/correction-before-task.wasm.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		t.Fatal(err)
	}
	old, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(ctx, Options{CacheDir: cacheDir(), Strict: true, Plugins: []PluginConfig{
		{Name: "verifier", Path: testdataPlugin(t, "verifier"), Enabled: true},
		{Name: "jsonv1", Path: testdataPlugin(t, "jsonv1"), Enabled: true},
		{Name: "correction", Builtin: "correction", Enabled: true},
		{Name: "oldcorrection", Path: writeWasm(t, "oldcorrection", old), Enabled: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	cases := []struct {
		answer, reply string
		want          float64
	}{
		{`"four"`, " four\n", 1},
		{`"four"`, "five", -1},
		{`4`, "4.0", 1},
		{`4`, "four", -1},
	}
	for _, c := range cases {
		sc, _ := r.ScoreTask(ctx, "verifier", rolloutStep(c.reply), Task{ID: "t9", Answer: json.RawMessage(c.answer)})
		if sc.Value == nil || *sc.Value != c.want {
			t.Fatalf("answer %s reply %q: %+v, want %v", c.answer, c.reply, sc, c.want)
		}
		if len(sc.Labels) != 1 || sc.Labels[0] != "task=t9" {
			t.Fatalf("labels %v", sc.Labels)
		}
	}
	if sc, _ := r.ScorePlugin(ctx, "verifier", rolloutStep("four")); sc.Value != nil {
		t.Fatalf("the verifier scored a step with no task: %+v", sc)
	}
	step := rolloutStep("four")
	step.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "wrong, try again"}}}
	for _, name := range []string{"jsonv1", "correction", "oldcorrection"} {
		plain, _ := r.ScorePlugin(ctx, name, step)
		task, _ := r.ScoreTask(ctx, name, step, Task{ID: "t9", Answer: json.RawMessage(`"four"`), Meta: json.RawMessage(`{"k":1}`)})
		if plain.Value == nil || !reflect.DeepEqual(plain, task) {
			t.Fatalf("%s: %+v without the task, %+v with it", name, plain, task)
		}
	}
}

// TestScaffoldVerifier: the verifier `reward new --verifier` writes builds
// offline, passes its own test, and scores rollouts against the answer.
func TestScaffoldVerifier(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	dir := filepath.Join(t.TempDir(), "checker")
	if err := ScaffoldVerifier(dir, "checker"); err != nil {
		t.Fatal(err)
	}
	out := buildScaffold(t, dir)
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Path: out, Enabled: true}}})
	for _, c := range []struct {
		answer, reply string
		want          float64
	}{{`42`, "42", 1}, {`42`, "41", -1}, {`"yes"`, " yes\n", 1}, {`"yes"`, "no", -1}} {
		sc, _ := r.ScoreTask(context.Background(), "checker", rolloutStep(c.reply), Task{ID: "q", Answer: json.RawMessage(c.answer)})
		if sc.Value == nil || *sc.Value != c.want {
			t.Fatalf("answer %s reply %q: %+v", c.answer, c.reply, sc)
		}
	}
	if sc, _ := r.ScorePlugin(context.Background(), "checker", rolloutStep("42")); sc.Value != nil {
		t.Fatalf("a live step scored: %+v", sc)
	}
}
