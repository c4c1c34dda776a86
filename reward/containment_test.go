package reward

import (
	"bufio"
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// TestHostileContainedWithinDeadline runs the hostile plugin's infinite loop
// and memory bomb under the default deadline and memory cap and checks that
// each call abstains with the reason. The first call of each mode runs on
// the instance the runner started at load time; that instance is then
// discarded, so the second call also starts a replacement instance (the Go
// runtime's _initialize) before it misbehaves. A good input afterwards
// starts yet another one and scores.
//
// How long each call took is logged, not asserted: the machines the tests
// run on are shared. That a call stops within its deadline plus a small
// margin is what the meter guarantees (the host is asked at least every
// fuelChunk instructions; reward/internal/meter's tests count the refills),
// and a call that was not contained at all would never return
// (scoreWithin fails the test then).
func TestHostileContainedWithinDeadline(t *testing.T) {
	path := hostilePlugin(t)
	modes := []struct{ mode, reason string }{
		{"spin", "deadline exceeded"},
		{"oom", ""}, // out of memory, or the deadline if that comes first
	}
	for _, m := range modes {
		// A runner per mode, so the first call finds the instance started
		// at load time.
		r := newTestRunner(t, Options{
			Plugins:  []PluginConfig{{Name: "hostile", Path: path, Enabled: true}},
			Deadline: DefaultDeadline, // newTestRunner would make it generous
			// MemoryLimit left 0: DefaultMemoryLimit.
		})
		if r.opts.Deadline != DefaultDeadline || r.opts.MemoryLimit != DefaultMemoryLimit {
			t.Fatalf("runner options: deadline %v, memory limit %d", r.opts.Deadline, r.opts.MemoryLimit)
		}
		for i, what := range []string{"pooled instance", "replacement instance"} {
			start := time.Now()
			sc := scoreWithin(t, r, "hostile", stepSaying(m.mode))
			t.Logf("%s, %s: %v (%s)", m.mode, what, time.Since(start).Round(time.Microsecond), sc.Reason)
			if sc.Value != nil {
				t.Errorf("%s call %d: want abstain, got %v", m.mode, i+1, *sc.Value)
			}
			if m.reason != "" && !strings.Contains(sc.Reason, m.reason) {
				t.Errorf("%s call %d: reason %q, want %q", m.mode, i+1, sc.Reason, m.reason)
			}
			if m.reason == "" && !strings.Contains(sc.Reason, "out of memory") && !strings.Contains(sc.Reason, "deadline exceeded") {
				t.Errorf("%s call %d: reason %q, want out of memory or deadline exceeded", m.mode, i+1, sc.Reason)
			}
		}
		start := time.Now()
		sc := scoreWithin(t, r, "hostile", stepSaying("ok"))
		t.Logf("%s, then a good input on a new instance: %v", m.mode, time.Since(start).Round(time.Microsecond))
		if sc.Value == nil || *sc.Value != 0.25 {
			t.Errorf("after %s: good input gave %v %q", m.mode, fmtVal(sc.Value), sc.Reason)
		}
	}
}

// TestHostileMemoryReleased runs the memory bomb many times, each in a new
// instance that grows its linear memory to the default cap (64 MiB) and
// traps, and checks that the process's resident memory stays bounded: the
// discarded instances' memory is released, not accumulated.
func TestHostileMemoryReleased(t *testing.T) {
	if _, err := readProcStatus("VmRSS"); err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	path := hostilePlugin(t)
	ctx := context.Background()
	// The default deadline is generous here (newTestRunner's), so that every
	// run reaches the memory cap rather than its deadline on a slow machine;
	// the plugin fails every call, and is never set aside for it here.
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{Name: "hostile", Path: path, Enabled: true}}, FailureLimit: -1})
	if r.opts.MemoryLimit != DefaultMemoryLimit {
		t.Fatalf("memory limit %d, want the default %d", r.opts.MemoryLimit, DefaultMemoryLimit)
	}
	// 16 runs: accumulated, their memory would be 1 GiB, twice the bound;
	// each run takes about 0.3-0.5 s on the shared 2-core machine.
	const runs = 16
	const bound = 512 << 20

	runtime.GC()
	base, _ := readProcStatus("VmRSS")
	hwm0, _ := readProcStatus("VmHWM")

	// Sample the resident set while the bombs go off, to see the peaks
	// within calls, not only what is left between them.
	var (
		mu   sync.Mutex
		peak uint64
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, err := readProcStatus("VmRSS"); err == nil {
				mu.Lock()
				peak = max(peak, rss)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	start := time.Now()
	var after []uint64
	for i := 0; i < runs; i++ {
		sc, _ := r.ScorePlugin(ctx, "hostile", stepSaying("oom"))
		if sc.Value != nil || !strings.Contains(sc.Reason, "out of memory") {
			t.Errorf("run %d: want abstain with out of memory, got %v %q", i+1, fmtVal(sc.Value), sc.Reason)
		}
		rss, _ := readProcStatus("VmRSS")
		after = append(after, rss)
	}
	took := time.Since(start)
	close(stop)
	<-done
	hwm, _ := readProcStatus("VmHWM")
	runtime.GC()
	final, _ := readProcStatus("VmRSS")

	mib := func(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB" }
	var steps []string
	for _, a := range after {
		steps = append(steps, strconv.FormatUint(a>>20, 10))
	}
	t.Logf("%d memory bombs in %v: VmRSS baseline %s, peak sampled %s (+%s), after each run [%s] MiB, after GC %s; VmHWM %s before, %s after",
		runs, took.Round(time.Millisecond), mib(base), mib(peak), mib(peak-min(peak, base)),
		strings.Join(steps, " "), mib(final), mib(hwm0), mib(hwm))
	if peak > base+bound {
		t.Errorf("resident memory peaked at %s, more than the baseline %s + %s", mib(peak), mib(base), mib(bound))
	}
	for i, a := range after {
		if a > base+bound {
			t.Errorf("after run %d: resident memory %s, more than the baseline %s + %s", i+1, mib(a), mib(base), mib(bound))
			break
		}
	}
	// What the last runs leave behind is no more than what the first ones
	// did: nothing grows with the number of runs.
	if first, last := after[2], after[len(after)-1]; last > first+256<<20 {
		t.Errorf("resident memory grew from %s after run 3 to %s after run %d", mib(first), mib(last), runs)
	}
}

// readProcStatus reads a field in kB of /proc/self/status, in bytes.
func readProcStatus(field string) (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != field {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, err
		}
		return n << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New(field + " not in /proc/self/status")
}

// TestJSONPluginEndToEnd runs a real ABI version 1 plugin (testdata/jsonv1:
// Go, encoding/json, no clawmesh_abi export) on two steps: what it answers
// depends on fields it can only have read from the JSON input the runner
// sent it.
func TestJSONPluginEndToEnd(t *testing.T) {
	path := testdataPlugin(t, "jsonv1")
	r := newTestRunner(t, Options{Plugins: []PluginConfig{{
		Name: "jsonv1", Path: path, Enabled: true, Config: map[string]string{"echo": "hello-config"},
	}}})
	ctx := context.Background()
	if s, err := r.acquire(); err != nil {
		t.Fatal(err)
	} else {
		abi := s.all["jsonv1"].abi
		s.release()
		if abi != abiJSON {
			t.Fatalf("jsonv1 speaks ABI %d, want %d (JSON)", abi, abiJSON)
		}
	}
	fb := 1.0
	wrong := &core.Step{
		ID: "j1", SessionID: "sess", Turn: core.TurnMain, API: core.APIChat, State: core.StateClosed,
		Request: core.Request{Messages: []core.Message{
			{Role: core.RoleSystem, Content: "be brief"},
			{Role: core.RoleUser, Content: "what is 2+2?"},
		}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{
			Role: core.RoleAssistant, Content: "5"}}}},
		NextState: &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "that is wrong"}}},
	}
	right := &core.Step{
		ID: "j2", SessionID: "sess", Turn: core.TurnSide, API: core.APIChat, State: core.StateClosed,
		Request: core.Request{Messages: []core.Message{
			{Role: core.RoleSystem, Content: "you may run commands"},
			{Role: core.RoleUser, Content: "list the files"},
			{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "call_0", Type: "function", Name: "run_shell", Arguments: `{"cmd":"pwd"}`}}},
			{Role: core.RoleTool, ToolCallID: "call_0", Content: "/home/u"},
		}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{
			Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "call_1", Type: "function", Name: "list_files", Arguments: `{}`}}}}}},
		NextState: &core.NextState{Messages: []core.Message{
			{Role: core.RoleTool, ToolCallID: "call_1", Content: "a.txt b.txt"},
			{Role: core.RoleUser, Content: "thanks, right"},
		}},
		Feedback: []core.Feedback{{Score: &fb, Text: "good"}},
	}
	cases := []struct {
		step   *core.Step
		score  float64
		hint   string
		labels []string
	}{
		{wrong, -1, "last=user n=2", []string{"plugin=jsonv1", "turn=main", "echo=hello-config", "tool=", "feedback=0"}},
		{right, 0.5, "last=tool n=4", []string{"plugin=jsonv1", "turn=side", "echo=hello-config", "tool=list_files", "feedback=1"}},
	}
	for _, c := range cases {
		sc, took := r.ScorePlugin(ctx, "jsonv1", c.step)
		t.Logf("%s: %v hint %q labels %q reason %q in %v", c.step.ID, fmtVal(sc.Value), sc.Hint, sc.Labels, sc.Reason, took)
		if sc.Value == nil || *sc.Value != c.score {
			t.Errorf("%s: score %v, want %v (reason %q)", c.step.ID, fmtVal(sc.Value), c.score, sc.Reason)
		}
		if sc.Hint != c.hint {
			t.Errorf("%s: hint %q, want %q", c.step.ID, sc.Hint, c.hint)
		}
		if strings.Join(sc.Labels, "|") != strings.Join(c.labels, "|") {
			t.Errorf("%s: labels %q, want %q", c.step.ID, sc.Labels, c.labels)
		}
		if sc.Reason != "next_state null: false" {
			t.Errorf("%s: reason %q", c.step.ID, sc.Reason)
		}
	}
	// A step with nothing after it: next_state is null in the JSON.
	none := *right
	none.NextState = nil
	sc, _ := r.ScorePlugin(ctx, "jsonv1", &none)
	if sc.Value == nil || *sc.Value != 0.5 || sc.Reason != "next_state null: true" {
		t.Errorf("no next state: %v %q", fmtVal(sc.Value), sc.Reason)
	}
}

// TestJudgeComputeBudget checks how a judge plugin's time is bounded: the
// time its judge calls take does not count against its deadline (a slow
// judge still gets its votes counted), but its own computing does (a judge
// plugin that spins is stopped at its deadline, not at the end of the judge
// timeout).
func TestJudgeComputeBudget(t *testing.T) {
	steps := readTestSteps(t)
	// Every judge call moves the runner's clock an hour on: were the time
	// spent judging counted against the deadline, the plugin would be
	// stopped at the first refill after it. The reply is long, so that the
	// plugin computes on it (its parsing reads it all) for many refills.
	var ahead atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	reply := strings.Repeat("the turn was fine, ", 40_000) + "\nScore: -1"
	calls := 0
	slow := func(ctx context.Context, prompt string) (string, error) {
		calls++
		ahead.Add(int64(time.Hour))
		return reply, nil
	}
	r := newTestRunner(t, Options{
		Plugins:      []PluginConfig{{Builtin: "judge", Enabled: true, Judge: true}},
		JudgeTimeout: 20 * time.Second,
		Judge:        slow,
		Now:          now,
	})
	sc := scoreWithin(t, r, "judge", steps["01-correction"])
	t.Logf("slow judge: %v %q after %d calls of an hour", fmtVal(sc.Value), sc.Reason, calls)
	if sc.Value == nil || *sc.Value != -1 || calls != 3 {
		t.Errorf("slow judge: %v %q after %d judge calls, want -1 after 3", fmtVal(sc.Value), sc.Reason, calls)
	}

	// A plugin permitted to judge that spins instead: its own computing
	// has the default deadline. Were it bounded by the judge timeout (an
	// hour) instead, the call would not return and scoreWithin would fail.
	r = newTestRunner(t, Options{
		Plugins:      []PluginConfig{{Name: "hostile", Path: hostilePlugin(t), Enabled: true, Judge: true}},
		Deadline:     DefaultDeadline,
		JudgeTimeout: time.Hour,
	})
	start := time.Now()
	sc = scoreWithin(t, r, "hostile", stepSaying("spin"))
	t.Logf("spinning judge plugin: %q in %v", sc.Reason, time.Since(start).Round(time.Millisecond))
	if sc.Value != nil || sc.Reason != "deadline exceeded" {
		t.Errorf("spinning judge plugin: %v %q, want deadline exceeded", fmtVal(sc.Value), sc.Reason)
	}
}
