package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// buildChecker scaffolds a verifier with `reward new --verifier` in dir,
// builds it with `reward build`, and returns the module's path.
func buildChecker(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	plugin := filepath.Join(dir, "checker")
	if out, errOut, code := runCLI(t, "reward", "new", "--verifier", "checker", "--dir", plugin); code != 0 {
		t.Fatalf("reward new: %s %s", out, errOut)
	}
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	t.Setenv("GOWORK", "off")
	if out, errOut, code := runCLI(t, "reward", "build", plugin); code != 0 {
		t.Fatalf("reward build: %s %s", out, errOut)
	}
	return filepath.Join(plugin, "checker.wasm")
}

// buildCharset builds the trainer tests' charset verifier (a reply passes
// when it is made of the answer's characters; partial credit otherwise)
// and returns the module's path.
func buildCharset(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	out := filepath.Join(dir, "charset.wasm")
	if _, err := reward.Build(context.Background(), filepath.Join("..", "..", "trainer", "testdata", "charset"), out, os.Stderr); err != nil {
		t.Fatal(err)
	}
	return out
}

// letterTaskFile writes 8 prompts asking for lower-case words (charset's
// tasks) to dir/letters.jsonl.
func letterTaskFile(t *testing.T, dir string) string {
	t.Helper()
	var lines strings.Builder
	for i := range 8 {
		fmt.Fprintf(&lines, `{"id":"w%d","messages":[{"role":"user","content":"Answer in lower-case words only. Item %d."}],"answer":"abcdefghijklmnopqrstuvwxyz ","meta":{"max_tokens":4}}`+"\n", i, i)
	}
	file := filepath.Join(dir, "letters.jsonl")
	if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// numberTasks writes a task set of 8 prompts ("Say 3.", answer 3) to
// dir/numbers.jsonl.
func numberTasks(t *testing.T, dir string) string {
	t.Helper()
	var lines strings.Builder
	for i := range 8 {
		fmt.Fprintf(&lines, `{"id":"q%d","messages":[{"role":"user","content":"Say %d."}],"answer":%d,"meta":{"max_tokens":3}}`+"\n", i, i, i)
	}
	file := filepath.Join(dir, "numbers.jsonl")
	if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestTasksCommands: a verifier scaffolded by `reward new --verifier` and
// built by `reward build`, a task set added by `tasks add` to a running
// trainer, then `tasks ls` and `tasks status` (text and --json) showing the
// set, its progress and its versions' evaluations.
func TestTasksCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin and runs a trainer")
	}
	dir := t.TempDir()
	wasm := buildChecker(t, dir)
	file := numberTasks(t, dir)
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"id":"a","messages":[]}`+"\n"), 0o600)

	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Dir: filepath.Join(dir, "mesh"),
		Timing: trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond},
		Group:  group.Config{Deadline: 4 * time.Second, LocalSteps: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := c.DataDir(0)
	if err := c.WaitUntil(ctx, time.Minute, "version 0 and the admin API", func() bool {
		_, err := trainer.ReadAddr(data)
		return err == nil && len(c.Trainer(0).Lineage()) > 0
	}); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"tasks", "add", file, "--data", data},                                   // no --reward
		{"tasks", "add", "--reward", wasm, "--data", data},                       // no file
		{"tasks", "add", bad, "--reward", wasm, "--data", data},                  // a bad line
		{"tasks", "add", file, "--reward", file, "--data", data},                 // not a plugin
		{"tasks", "add", file, "--reward", wasm, "--group", "1", "--data", data}, // G < 2
		{"tasks", "frob", "--data", data},
	} {
		if out, errOut, code := runCLI(t, args...); code == 0 || errOut == "" {
			t.Errorf("%v: exit %d, %q %q", args, code, out, errOut)
		}
	}
	out, errOut, code := runCLI(t, "tasks", "add", file, "--reward", wasm, "--group", "4", "--holdout", "0.25", "--per-round", "3", "--data", data)
	if code != 0 || !strings.Contains(out, "numbers.jsonl added") {
		t.Fatalf("tasks add: %d %q %q", code, out, errOut)
	}
	// The same set again says it is there; with another holdout it is
	// refused, naming it.
	out, errOut, code = runCLI(t, "tasks", "add", file, "--reward", wasm, "--group", "4", "--holdout", "0.25", "--per-round", "3", "--data", data)
	if code != 0 || !strings.Contains(out, "is there already, with the same settings: nothing changed") {
		t.Fatalf("tasks add again: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, "tasks", "add", file, "--reward", wasm, "--group", "4", "--holdout", "0.1", "--per-round", "3", "--data", data)
	if code == 0 || !strings.Contains(errOut, "--holdout 0.1 here, 0.25 in the group") {
		t.Fatalf("tasks add with another holdout: %d %q %q", code, out, errOut)
	}
	var sets []trainer.TaskSetStatus
	if err := c.WaitUntil(ctx, time.Minute, "every prompt trained and evaluated", func() bool {
		out, _, code := runCLI(t, "tasks", "status", "--json", "--data", data)
		sets = nil
		if code != 0 || json.Unmarshal([]byte(out), &sets) != nil || len(sets) != 1 {
			return false
		}
		s := sets[0]
		// The verifier scores ±1 and the tiny model rarely says a number:
		// rounds whose groups are all flat publish no version.
		return s.Done == s.Items && len(s.Evals) >= 1 && s.Evals[len(s.Evals)-1].Version == uint64(len(c.Trainer(0).Lineage())-1)
	}); err != nil {
		t.Fatal(err)
	}
	s := sets[0]
	if s.Name != "numbers.jsonl" || s.Group != 4 || s.Prompts+s.HeldOut != 8 || s.HeldOut == 0 || s.Items != s.Prompts || s.Evals[0].Version != 0 {
		t.Fatalf("status %+v", s)
	}
	out, _, code = runCLI(t, "tasks", "ls", "--data", data)
	if code != 0 || !strings.Contains(out, "numbers.jsonl") || !strings.Contains(out, "PASS@1") {
		t.Fatalf("tasks ls: %q", out)
	}
	out, _, code = runCLI(t, "tasks", "status", "--data", data)
	if code != 0 || !strings.Contains(out, "v0") || !strings.Contains(out, "MEAN REWARD") {
		t.Fatalf("tasks status: %q", out)
	}
	// The lineage record carries the evaluations too.
	lin := c.Trainer(0).Lineage()
	if len(lin[0].Evals) != 1 || lin[0].Evals[0].Task != s.Hash {
		t.Fatalf("v0's lineage record: %+v", lin[0])
	}
}

func TestBenchRollouts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	t.Setenv("GOWORK", "off")
	out, errOut, code := runCLI(t, "bench", "rollouts", "--group", "2", "--prompts", "2", "--rounds", "1", "--max-tokens", "4", "--json")
	if code != 0 {
		t.Fatalf("bench rollouts: %s %s", out, errOut)
	}
	var rep harness.RolloutBenchReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Rounds) != 1 || rep.Rounds[0].Samples != 4 || !(rep.RolloutTokensPerS > 0) || !(rep.RawTokensPerS > 0) || !(rep.RolloutShare > 0) {
		t.Fatalf("report %+v", rep)
	}
	if _, errOut, code := runCLI(t, "bench", "rollouts", "--tasks", "x.jsonl"); code == 0 || !strings.Contains(errOut, "go together") {
		t.Fatalf("--tasks alone: %d %s", code, errOut)
	}
}

// TestTaskEvalsReachTheDevice: a trainer given a task set evaluates each
// new version on the held-out split before it publishes it; the version's
// signed manifest carries the evaluation to a device of the mesh, whose
// `weights ls` (text and --json) shows it.
func TestTaskEvalsReachTheDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin, runs a model server, a node and a trainer")
	}
	dir := t.TempDir()
	// A verifier with partial credit: a ±1 one on a tiny model gives flat
	// groups, which publish no version.
	wasm := buildCharset(t, dir)
	file := letterTaskFile(t, dir)
	modelAddr := serveTiny(t)
	log := failureLog(t, "the node and the trainer")

	a := filepath.Join(dir, "device")
	cli(t, "mesh", "init", "--data", a)
	na := runWeightsNode(t, a, "http://"+modelAddr+"/v1", "clawmesh", nil, log.With("device", "a"))
	d := filepath.Join(dir, "trainer")
	tr := joinTrainer(t, a, d, trainer.Config{Bootstrap: na.Peer().Host.Addrs(),
		Timing: trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond},
		Group:  group.Config{Deadline: 5 * time.Second, LocalSteps: 1}, Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond, Logger: log.With("trainer", 0)})
	waitLong(t, time.Minute, "version 0", func() bool { return len(tr.Lineage()) > 0 })

	if out, errOut, code := runCLI(t, "tasks", "add", file, "--reward", wasm, "--group", "4", "--holdout", "0.25", "--per-round", "3", "--data", d); code != 0 {
		t.Fatalf("tasks add: %d %q %q", code, out, errOut)
	}
	var v adapters.Version
	waitLong(t, 4*time.Minute, "a version with its evaluation on the device", func() bool {
		var ls adapters.Status
		if json.Unmarshal([]byte(cli(t, "weights", "ls", "--json", "--data", a)), &ls) != nil {
			return false
		}
		for _, x := range ls.Versions {
			if len(x.Evals) > 0 && (x.State == "serving" || x.State == "installed") {
				v = x
				return true
			}
		}
		return false
	})
	var committed *group.Eval
	for _, lv := range tr.Lineage() {
		if fmt.Sprint("v", lv.Version) == v.Version && len(lv.Evals) == 1 {
			committed = &lv.Evals[0]
		}
	}
	ev := v.Evals[0]
	if committed == nil || len(v.Evals) != 1 || ev.Task != committed.Task || ev.Prompts != committed.Prompts || ev.Passed != committed.Passed ||
		ev.Prompts < 1 || ev.PassAt1 != committed.PassAt1 || ev.MeanReward != committed.MeanReward {
		t.Fatalf("%s on the device: %+v; in the lineage: %+v", v.Version, v.Evals, committed)
	}
	if out := cli(t, "weights", "ls", "--data", a); !strings.Contains(out, "HELD-OUT PASS@1") || !strings.Contains(out, fmt.Sprintf("(%d/%d)", ev.Passed, ev.Prompts)) {
		t.Errorf("weights ls does not show the evaluation:\n%s", out)
	}
}

// TestPrintTaskSetsAbstentions: `tasks status` counts each version's
// abstentions and says when they are most of its held-out prompts; `ls`
// flags the latest mean reward then.
func TestPrintTaskSetsAbstentions(t *testing.T) {
	ev := func(v uint64, passed, abstained int) trainer.TaskEval {
		e := group.Eval{Version: v, Task: strings.Repeat("a", 64), Prompts: 10, Passed: passed, PassAt1: float64(passed) / 10, Abstained: abstained}
		return trainer.TaskEval{Eval: e, Abstained: abstained, MostlyAbstained: e.MostlyAbstained()}
	}
	sets := []trainer.TaskSetStatus{{Hash: strings.Repeat("a", 64), Name: "numbers.jsonl", Reward: strings.Repeat("b", 64), Prompts: 40, HeldOut: 10,
		Items: 40, Group: 4, Evals: []trainer.TaskEval{ev(0, 2, 0), ev(1, 3, 5), ev(2, 0, 9)}}}
	var b strings.Builder
	printTaskSets(&b, sets, true)
	out := b.String()
	rows := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		rows[strings.Join(strings.Fields(l), " ")] = true
	}
	for _, want := range []string{"VERSION PASS@1 PASSED MEAN REWARD ABSTAINED", "v1 0.30 3/10 +0.000 5/10", "v2 0.00 0/10 +0.000 9/10"} {
		if !rows[want] {
			t.Errorf("no row %q in\n%s", want, out)
		}
	}
	for _, want := range []string{
		"the verifier gave no score to more than half the held-out prompts of v2:", "(verifier abstained on 9/10)"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "prompts of v1") {
		t.Errorf("v1 (half abstained) flagged:\n%s", out)
	}
	js, err := json.Marshal(sets)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"abstained":0,"mostly_abstained":false`, `"abstained":9,"mostly_abstained":true`, `"pass_at_1":0.3`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("no %s in %s", want, js)
		}
	}
}
