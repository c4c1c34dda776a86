package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/reward"
)

// rewardTestSteps is a small steps JSONL, as `clawmesh pool export` writes
// it, whose next states make the polite example plugin score or abstain.
var rewardTestSteps = []struct {
	id, next string
	polite   string // the polite plugin's verdict
	why      string // its reason when it abstains
}{
	{"s-thanked", "thanks! that is what I needed", "+0.50", ""},
	{"s-impatient", "come on, hurry up", "-0.50", ""},
	{"s-corrected", "No, that's wrong. You should have checked: it is Canberra.", "abstain", "neither thanked nor impatient"},
	{"s-no-reply", "", "abstain", "no user reply"},
}

func writeRewardTestSteps(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, s := range rewardTestSteps {
		next := ""
		if s.next != "" {
			next = `, "next_state": {"messages": [{"role": "user", "content": "` + s.next + `"}]}`
		}
		b.WriteString(`{"schema": "clawmesh.step/v1", "id": "` + s.id + `", "session_id": "sess-` + s.id + `", "turn": "main", "api": "chat.completions", ` +
			`"request": {"model": "m", "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is the capital of Australia?"}]}, ` +
			`"response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "The capital of Australia is Sydney."}, "finish_reason": "stop"}], "status": 200}` +
			next + "}\n")
	}
	p := filepath.Join(t.TempDir(), "steps.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// rewardLine is one line of `clawmesh reward test`: step, plugin, verdict,
// time, then optional "why:", "labels:" and "hint:" parts.
type rewardLine struct {
	step, plugin, verdict string
	took                  time.Duration
	why, labels, hint     string
}

func parseRewardLines(t *testing.T, out string) (lines []rewardLine, summary string) {
	t.Helper()
	all := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(all) == 0 {
		t.Fatalf("no output")
	}
	summary = all[len(all)-1]
	for _, l := range all[:len(all)-1] {
		f := strings.Fields(l)
		if len(f) < 4 {
			t.Errorf("line %q: want step, plugin, verdict and time", l)
			continue
		}
		rl := rewardLine{step: f[0], plugin: f[1], verdict: f[2]}
		var err error
		if rl.took, err = time.ParseDuration(f[3]); err != nil || rl.took < 0 {
			t.Errorf("line %q: time %q: %v", l, f[3], err)
		}
		// The optional parts, in the order the command writes them.
		rest := l
		for _, part := range []struct {
			key string
			dst *string
		}{{"  hint: ", &rl.hint}, {"  labels: ", &rl.labels}, {"  why: ", &rl.why}} {
			if i := strings.LastIndex(rest, part.key); i >= 0 {
				*part.dst = strings.TrimSpace(rest[i+len(part.key):])
				rest = rest[:i]
			}
		}
		if rl.verdict != "abstain" {
			v, err := strconv.ParseFloat(rl.verdict, 64)
			if err != nil || v < -1 || v > 1 {
				t.Errorf("line %q: verdict %q is neither a score in [-1, 1] nor abstain", l, rl.verdict)
			}
		} else if rl.why == "" {
			t.Errorf("line %q: an abstention without its reason", l)
		}
		lines = append(lines, rl)
	}
	return lines, summary
}

// TestRewardTestCommand builds the polite example plugin with `clawmesh
// reward build` and scores a steps file with `clawmesh reward test`, alone
// and with the built-ins: one line per step and plugin, with the score or
// "abstain" and its reason, the hint when there is one, and the time.
func TestRewardTestCommand(t *testing.T) {
	wasm := filepath.Join(t.TempDir(), "polite.wasm")
	buildPolite(t, wasm)
	steps := writeRewardTestSteps(t)

	// The plugin alone: exactly one line per step.
	out, errs, code := runCLI(t, "reward", "test", wasm, "--steps", steps)
	if code != 0 {
		t.Fatalf("reward test: code %d, %s", code, errs)
	}
	lines, summary := parseRewardLines(t, out)
	if len(lines) != len(rewardTestSteps) {
		t.Fatalf("%d lines for %d steps:\n%s", len(lines), len(rewardTestSteps), out)
	}
	for i, want := range rewardTestSteps {
		got := lines[i]
		if got.step != want.id || got.plugin != "polite" || got.verdict != want.polite {
			t.Errorf("line %d: %+v, want step %s plugin polite verdict %s", i, got, want.id, want.polite)
		}
		if want.why != "" && got.why != want.why {
			t.Errorf("%s: reason %q, want %q", want.id, got.why, want.why)
		}
		if got.hint != "" {
			t.Errorf("%s: the polite plugin gives no hint, got %q", want.id, got.hint)
		}
	}
	if lines[0].labels != "thanked" || lines[1].labels != "impatient" {
		t.Errorf("labels %q, %q: want thanked, impatient", lines[0].labels, lines[1].labels)
	}
	if summary != "4 steps, 2 scores, 2 abstentions" {
		t.Errorf("summary %q", summary)
	}

	// With the built-ins (but the judge, which needs an LLM): one line per
	// step and plugin, and the correction's hint.
	var builtins []string
	for _, b := range reward.Builtins() {
		if !b.Judge {
			builtins = append(builtins, b.Name)
		}
	}
	out, errs, code = runCLI(t, "reward", "test", wasm, "--steps", steps, "--builtin")
	if code != 0 {
		t.Fatalf("reward test --builtin: code %d, %s", code, errs)
	}
	lines, summary = parseRewardLines(t, out)
	perStep := 1 + len(builtins)
	if len(lines) != len(rewardTestSteps)*perStep {
		t.Fatalf("--builtin: %d lines, want %d steps × %d plugins:\n%s", len(lines), len(rewardTestSteps), perStep, out)
	}
	scores, abstains := 0, 0
	var hint string
	for i, l := range lines {
		want := rewardTestSteps[i/perStep]
		plugin := "polite"
		if k := i % perStep; k > 0 {
			plugin = builtins[k-1]
		}
		if l.step != want.id || l.plugin != plugin {
			t.Errorf("--builtin line %d: step %s plugin %s, want %s %s", i, l.step, l.plugin, want.id, plugin)
		}
		if l.verdict == "abstain" {
			abstains++
		} else {
			scores++
		}
		if l.step == "s-corrected" && l.hint != "" {
			hint = l.hint
		}
		if l.step != "s-corrected" && l.hint != "" {
			t.Errorf("%s/%s: a hint where no one corrected the answer: %q", l.step, l.plugin, l.hint)
		}
	}
	if !strings.Contains(hint, "Canberra") {
		t.Errorf("--builtin: no hint on the corrected step (got %q):\n%s", hint, out)
	}
	for _, l := range lines {
		if l.step == "s-corrected" && l.plugin == "correction" && !strings.HasPrefix(l.verdict, "-") {
			t.Errorf("correction built-in on the corrected step: %s, want a negative score", l.verdict)
		}
	}
	if want := strconv.Itoa(len(rewardTestSteps)) + " steps, " + strconv.Itoa(scores) + " scores, " + strconv.Itoa(abstains) + " abstentions"; summary != want {
		t.Errorf("--builtin summary %q, want %q", summary, want)
	}

	// Usage errors.
	if _, errs, code := runCLI(t, "reward", "test", wasm); code != 2 || !strings.Contains(errs, "--steps") {
		t.Errorf("without --steps: code %d, %q", code, errs)
	}
	if _, errs, code := runCLI(t, "reward", "test", "--steps", steps); code != 2 || !strings.Contains(errs, "PLUGIN.wasm") {
		t.Errorf("without a plugin: code %d, %q", code, errs)
	}
}

// TestRewardTestJudge runs the built-in PRM judge from `reward test` with
// --judge pointing at a real HTTP server that speaks chat completions and
// votes -1: the judge scores every step with a next state (and abstains on
// the one without), and the prompts
// it sent show the turn.
func TestRewardTestJudge(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var prompts []string
	up := fakeupstream.New(fakeupstream.Script{Respond: func(n int, r fakeupstream.Request) fakeupstream.Turn {
		mu.Lock()
		defer mu.Unlock()
		var body struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.Unmarshal(r.Body, &body); err == nil && len(body.Messages) > 0 {
			prompts = append(prompts, body.Messages[len(body.Messages)-1].Content)
		}
		return fakeupstream.Turn{Text: "The answer was wrong.\nScore: -1"}
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, ln)
	steps := writeRewardTestSteps(t)

	out, errs, code := runCLI(t, "reward", "test", "--steps", steps, "--builtin", "--judge", "http://"+ln.Addr().String()+"/v1", "--judge-model", "m")
	if code != 0 {
		t.Fatalf("reward test --judge: code %d, %s", code, errs)
	}
	lines, _ := parseRewardLines(t, out)
	judged := 0
	for _, l := range lines {
		if l.plugin != "judge" {
			continue
		}
		judged++
		want := "-1.00"
		if l.step == "s-no-reply" {
			want = "abstain" // nothing followed the turn to judge it by
		}
		if l.verdict != want {
			t.Errorf("%s: judge %s (%s), want %s", l.step, l.verdict, l.why, want)
		}
	}
	if judged != len(rewardTestSteps) {
		t.Fatalf("%d judge lines for %d steps:\n%s", judged, len(rewardTestSteps), out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(prompts) < 3 || !strings.Contains(prompts[0], "Sydney") {
		t.Errorf("%d judge prompts; the first: %.300q", len(prompts), strings.Join(prompts, "\n---\n"))
	}

	if _, errs, code := runCLI(t, "reward", "test", "--steps", steps, "--builtin", "--judge", "localhost:1234"); code != 2 || !strings.Contains(errs, "--judge") {
		t.Errorf("a --judge that is not a URL: code %d, %q", code, errs)
	}
}

// A file that is not a usable plugin is an error, not a plugin that
// abstains on every step.
func TestRewardTestRefusesANonPlugin(t *testing.T) {
	steps := filepath.Join("..", "..", "reward", "testdata", "steps.jsonl")
	// A WebAssembly module that exports its memory and nothing else.
	noExports := filepath.Join(t.TempDir(), "bare.wasm")
	if err := os.WriteFile(noExports, []byte("\x00asm\x01\x00\x00\x00\x05\x03\x01\x00\x01\x07\x0a\x01\x06memory\x02\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	for bad, why := range map[string]string{
		"main.go": "not a WebAssembly module",
		filepath.Join("..", "..", "reward", "testdata", "hostile"): "cannot be loaded",
		noExports: "missing export clawmesh_alloc",
	} {
		_, errs, code := runCLI(t, "reward", "test", bad, "--steps", steps)
		if code == 0 || !strings.Contains(errs, "cannot be loaded") || !strings.Contains(errs, why) || strings.Contains(errs, "meter:") {
			t.Errorf("reward test %s: code %d, %s", bad, code, errs)
		}
	}
}

// reward new into a directory that holds something says so, once, and
// leaves it as it was.
func TestRewardNewRefusesAFullDirectory(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := runCLI(t, "reward", "new", "polite", "--dir", dir)
	if code != 1 || errs != "clawmesh reward: "+dir+" already exists and is not empty\nName a new directory ('clawmesh reward new polite --dir DIR'), or empty it.\n" {
		t.Errorf("reward new into a full directory: code %d, %q", code, errs)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory now holds %d entries", len(entries))
	}
}
