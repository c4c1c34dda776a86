package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// asPersonalWorker makes this test binary the clawmesh command, `personal
// train` included, when it is started with it set to a file: the worker
// first writes its pid and the nice value of each of its threads there
// (Linux), then runs as the command. With workerHangs set it then waits
// to be killed instead; with workerSpams it writes that many bytes of
// error output and fails.
const (
	asPersonalWorker = "CLAWMESH_TEST_PERSONAL_WORKER"
	workerHangs      = "CLAWMESH_TEST_PERSONAL_WORKER_HANGS"
	workerSpams      = "CLAWMESH_TEST_PERSONAL_WORKER_SPAMS"
)

func init() {
	report := os.Getenv(asPersonalWorker)
	if report == "" {
		return
	}
	if err := os.WriteFile(report, []byte(workerReport()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if os.Getenv(workerHangs) == "1" {
		time.Sleep(time.Hour) // until killed
		os.Exit(1)
	}
	if n, _ := strconv.Atoi(os.Getenv(workerSpams)); n > 0 {
		for i := 0; i < n; i += 64 {
			fmt.Fprintf(os.Stderr, "%063d\n", i)
		}
		fmt.Fprintln(os.Stderr, "the last line")
		os.Exit(1)
	}
	main()
}

// workerReport is "pid nice nice ...": this process's id and its threads'
// nice values (none where /proc has none).
func workerReport() string {
	s := strconv.Itoa(os.Getpid())
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, tk := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", tk.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis start at the
		// state (field 3); the nice value is field 19.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 16 {
			s += " " + f[16]
		}
	}
	return s
}

// personalSteps are n steps a user who likes replies that start with a
// word scored, on prompts starting at prompt.
func personalSteps(n int, prompt string) []*core.Step {
	replies := []string{"Sure, here it is.", "... let me see", "OK", "  hmm?", "Yes!", "** done **"}
	var steps []*core.Step
	for i := range n {
		reply := replies[i%len(replies)]
		r := -1.0
		if reply[0] >= 'A' && reply[0] <= 'Z' {
			r = 1
		}
		id := fmt.Sprintf("%s-%d", prompt, i)
		steps = append(steps, &core.Step{
			ID: core.StepID(id), SessionID: core.SessionID(id), Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
			Request: core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprintf("%s %d?", prompt, i)}}},
			Response: core.Response{Choices: []core.Choice{{
				Message: core.Message{Role: core.RoleAssistant, Content: reply}, FinishReason: "stop"}}},
			Adapter: "v3-p1",
			Reward:  &core.Reward{Value: &r},
		})
	}
	return steps
}

// worker makes this test binary the worker execTrainer runs, reporting to
// a file it returns.
func worker(t *testing.T) (*execTrainer, string) {
	t.Helper()
	report := filepath.Join(t.TempDir(), "worker")
	t.Setenv(asPersonalWorker, report)
	return &execTrainer{Exe: os.Args[0], Base: tinyModelDir(t)}, report
}

func TestExecTrainerRunsTheWorker(t *testing.T) {
	tr, report := worker(t)
	tr.Rank, tr.Recipe = 3, "binary"
	data := t.TempDir()
	out := filepath.Join(data, "personal", "p1")
	j := core.PersonalJob{SharedVersion: "v3", Steps: personalSteps(12, "Which day is it"), HeldBack: personalSteps(6, "Where is it"), Out: out, Seed: 1}
	res, err := tr.Train(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.Trained != 12 || res.HeldBack != 6 || res.ScoreBefore != 0.5 || res.ScoreAfter < 0 || res.ScoreAfter > 1 || !(res.Seconds > 0) {
		t.Errorf("result %+v", res)
	}
	if _, err := os.Stat(filepath.Join(out, "adapter_model.safetensors")); err != nil {
		t.Error(err)
	}
	if cfg, err := os.ReadFile(filepath.Join(out, "adapter_config.json")); err != nil || !strings.Contains(string(cfg), `"r": 3,`) {
		t.Errorf("adapter config %s, %v; want the rank asked for, 3", cfg, err)
	}
	// The job file, with the device's steps in it, is gone.
	if left, _ := filepath.Glob(filepath.Join(data, "personal", ".personal-job-*")); len(left) > 0 {
		t.Errorf("job files left: %v", left)
	}
	if runtime.GOOS == "linux" {
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			t.Fatalf("worker report %q: no threads", b)
		}
		for _, n := range f[1:] {
			if n != strconv.Itoa(defaultNice) {
				t.Errorf("worker threads' nice values %v, want all %d", f[1:], defaultNice)
				break
			}
		}
	}

	// A second job on the same output is refused by the worker, and its
	// error comes back.
	_, err = tr.Train(context.Background(), j)
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("second job on %s: %v", out, err)
	}
}

func TestExecTrainerKillsTheWorkerWhenTheJobEnds(t *testing.T) {
	tr, report := worker(t)
	t.Setenv(workerHangs, "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := tr.Train(ctx, core.PersonalJob{Steps: personalSteps(2, "Now"), Out: filepath.Join(t.TempDir(), "p")})
		done <- err
	}()
	var pid int
	for range 3000 {
		if b, err := os.ReadFile(report); err == nil && len(b) > 0 {
			pid, _ = strconv.Atoi(strings.Fields(string(b))[0])
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pid == 0 {
		t.Fatal("the worker did not start")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Train = %v, want the context's end", err)
	}
	// Killed and reaped: no such process.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("worker %d after the job ended: %v", pid, err)
	}
}

func TestExecTrainerBoundsTheWorkersErrorOutput(t *testing.T) {
	tr, _ := worker(t)
	t.Setenv(workerSpams, strconv.Itoa(1<<20))
	_, err := tr.Train(context.Background(), core.PersonalJob{Steps: personalSteps(2, "Now"), Out: filepath.Join(t.TempDir(), "p")})
	if err == nil {
		t.Fatal("a failed worker's job succeeded")
	}
	// A megabyte written, the end of it kept.
	if msg := err.Error(); len(msg) > 16<<10 || !strings.HasSuffix(msg, "the last line") {
		t.Errorf("error of %d bytes ending %q", len(msg), msg[max(len(msg)-80, 0):])
	}
}

func TestPersonalTrainCommand(t *testing.T) {
	base := tinyModelDir(t)
	dir := t.TempDir()
	write := func(name string, v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	out := filepath.Join(dir, "p1")
	good := write("good.json", jobFile(core.PersonalJob{Steps: personalSteps(6, "Now"), HeldBack: personalSteps(3, "Then"), Out: out}))
	var stdout, stderr bytes.Buffer
	if err := runPersonalTrain(context.Background(), []string{"--job", good, "--base", base, "--recipe", "binary", "--rank", "2"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var res core.PersonalResult
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil || res.Trained != 6 || res.HeldBack != 3 {
		t.Fatalf("stdout decodes to %+v, %v", res, err)
	}
	cfg, err := os.ReadFile(filepath.Join(out, "adapter_config.json"))
	if err != nil || !strings.Contains(string(cfg), `"r": 2,`) {
		t.Errorf("adapter config %s, %v; want rank 2", cfg, err)
	}

	for _, c := range []struct {
		name string
		args []string
		says string
	}{
		{"no job", []string{"--base", base}, "needs --job FILE"},
		{"no base", []string{"--job", good}, "needs --base DIR"},
		{"bad rank", []string{"--job", good, "--base", base, "--rank", "0"}, "want a positive rank"},
		{"bad recipe", []string{"--job", good, "--base", base, "--recipe", "sft"}, "want binary, opd or combined"},
		{"missing job", []string{"--job", filepath.Join(dir, "nothing.json"), "--base", base}, "no such file"},
		{"unknown field", []string{"--job", write("unknown.json", map[string]any{"out": out + "x", "stepz": []int{}}), "--base", base}, `unknown field "stepz"`},
		{"no out", []string{"--job", write("noout.json", map[string]any{"steps": []int{}}), "--base", base}, `no "out" directory`},
		{"out exists", []string{"--job", good, "--base", base}, "exists"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := runPersonalTrain(context.Background(), c.args, &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("personal train %q: %v; want an error saying %q", c.args, err, c.says)
			}
		})
	}
	var help bytes.Buffer
	if err := runPersonalTrain(context.Background(), []string{"--help"}, &bytes.Buffer{}, &help); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(help.String(), "-job") || !strings.Contains(help.String(), "held_back") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
}
