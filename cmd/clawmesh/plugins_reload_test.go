package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
)

// buildPolite builds the polite example plugin (wasm-rewards/examples/polite)
// with `clawmesh reward build` into out, and returns the module's bytes. It
// skips the test if there is no go toolchain on PATH.
func buildPolite(t *testing.T, out string) []byte {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH to build the plugin")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		t.Fatal(err)
	}
	got, errs, code := runCLI(t, "reward", "build", filepath.Join("..", "..", "wasm-rewards", "examples", "polite"), "-o", out)
	if code != 0 || strings.TrimSpace(got) != out {
		t.Fatalf("reward build: code %d, stdout %q, stderr %s", code, got, errs)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds, failing the test if it never does
// (a bound against hanging, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitLong(t, time.Minute, what, cond)
}

// exportSteps reads the pool of data with `clawmesh pool export`, by step id.
func exportSteps(t *testing.T, data string) (map[core.StepID]core.Step, string) {
	t.Helper()
	out, errs, code := runCLI(t, "pool", "export", "--data", data)
	if code != 0 {
		t.Fatalf("pool export: code %d, %s", code, errs)
	}
	steps := map[core.StepID]core.Step{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var s core.Step
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatalf("pool export: %v\n%s", err, l)
		}
		steps[s.ID] = s
	}
	return steps, out
}

// stepClosedBy returns the step whose next state's user message is next.
func stepClosedBy(steps map[core.StepID]core.Step, next string) (core.Step, bool) {
	for _, s := range steps {
		if s.NextState != nil && len(s.NextState.Messages) > 0 && s.NextState.Messages[len(s.NextState.Messages)-1].Content == next {
			return s, true
		}
	}
	return core.Step{}, false
}

// TestNodeLoadsUserPluginAndReloads follows the README: it builds the polite
// example, enables it in DATA/config.toml by a path relative to the config
// file (the test runs elsewhere), and runs `clawmesh node` in-process. A
// turn driven through the gateway is scored by polite (with the hash of the
// .wasm built) and the other plugin configured, and `pool show` shows it.
// Then the config is rewritten and the node sent SIGHUP: the next turn is
// scored by the new set (a new weight, another built-in). A rewrite naming
// a plugin that cannot be loaded is refused with an error in the log that
// names it, and the set in use stays. The recorded steps, exported with
// `pool export`, feed `reward test`, which gives polite's stored verdicts.
// Last, a node whose config enables a missing plugin does not start.
func TestNodeLoadsUserPluginAndReloads(t *testing.T) {
	data := t.TempDir()
	module := buildPolite(t, filepath.Join(data, "plugins", "polite.wasm"))
	sum := sha256.Sum256(module)
	politeHash := hex.EncodeToString(sum[:])
	config := filepath.Join(data, "config.toml")
	writeConfig := func(body string) {
		t.Helper()
		if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig("[[plugins]]\npath = \"plugins/polite.wasm\"\n\n[[plugins]]\nbuiltin = \"correction\"\n")
	if _, err := os.Stat(filepath.Join("plugins", "polite.wasm")); err == nil {
		t.Fatal("plugins/polite.wasm exists in the test's working directory: the test would not show where the path is resolved from")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up := fakeupstream.New(fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "The capital of Australia is Canberra."}}})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, upLn)
	gw := freeAddr(t)
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"node", "--data", data, "--upstream", "http://" + upLn.Addr().String() + "/v1", "--listen", gw}, &logs, &logs)
	}()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	waitFor(t, "the node's address file", func() bool {
		select {
		case code := <-done:
			stopped = true
			t.Fatalf("the node stopped at once (code %d):\n%s", code, logs.String())
		default:
		}
		_, err := node.ReadAddr(data)
		return err == nil
	})

	// One conversation, pinned to a session; each user message closes the
	// step before it.
	answer := `{"role":"assistant","content":"The capital of Australia is Canberra."}`
	msgs := []string{`{"role":"user","content":"What is the capital of Australia?"}`}
	say := func(user string) {
		t.Helper()
		if user != "" {
			b, _ := json.Marshal(map[string]string{"role": "user", "content": user})
			msgs = append(msgs, answer, string(b))
		}
		resp, err := http.Post("http://"+gw+"/s/polite/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[`+strings.Join(msgs, ",")+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("gateway: status %d", resp.StatusCode)
		}
	}
	// scored waits until the background scorer has scored the step that
	// next closed, and returns it.
	scored := func(next string) core.Step {
		t.Helper()
		var s core.Step
		waitFor(t, "the step closed by "+next+" to be scored", func() bool {
			steps, _ := exportSteps(t, data)
			var ok bool
			s, ok = stepClosedBy(steps, next)
			return ok && s.State == core.StateScored
		})
		return s
	}
	type want struct {
		plugin string
		value  float64 // 2: abstain
		weight float64
	}
	check := func(s core.Step, wants ...want) {
		t.Helper()
		if s.Reward == nil || len(s.Reward.Scores) != len(wants) {
			t.Fatalf("step %s: reward %+v, want %d scores", s.ID, s.Reward, len(wants))
		}
		for i, w := range wants {
			sc := s.Reward.Scores[i]
			got := 2.0
			if sc.Value != nil {
				got = *sc.Value
			}
			if sc.Plugin != w.plugin || got != w.value || sc.Weight != w.weight || len(sc.Hash) != 64 {
				t.Errorf("step %s: score %d %+v (value %v), want %s %v at weight %v", s.ID, i, sc, got, w.plugin, w.value, w.weight)
			}
			if sc.Plugin == "polite" && sc.Hash != politeHash {
				t.Errorf("step %s: polite's hash %s, want the SHA-256 of the .wasm built, %s", s.ID, sc.Hash, politeHash)
			}
		}
	}

	say("")
	say("thanks, that is what I needed")
	first := scored("thanks, that is what I needed")
	check(first, want{"polite", 0.5, 1}, want{"correction", 0.2, 1})
	show, errs, code := runCLI(t, "pool", "show", string(first.ID), "--data", data)
	if code != 0 {
		t.Fatalf("pool show: code %d, %s", code, errs)
	}
	if !strings.Contains(show, "polite") || !strings.Contains(show, "+0.50") || !strings.Contains(show, politeHash[:12]) {
		t.Errorf("pool show does not show polite's +0.50 and hash %s:\n%s", politeHash[:12], show)
	}

	// A new set, as SIGHUP reloads it: polite at a quarter, and feedback
	// instead of correction.
	writeConfig("[[plugins]]\npath = \"plugins/polite.wasm\"\nweight = 0.25\n\n[[plugins]]\nbuiltin = \"feedback\"\n")
	hup := func(logged string) {
		t.Helper()
		n := strings.Count(logs.String(), logged)
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the log to say "+logged, func() bool { return strings.Count(logs.String(), logged) > n })
	}
	hup(`msg="reward plugins reloaded"`)
	if !strings.Contains(logs.String(), "enabled=polite,feedback") {
		t.Errorf("the reload's log does not list the new set:\n%s", logs.String())
	}
	say("/good thanks")
	check(scored("/good thanks"), want{"polite", 0.5, 0.25}, want{"feedback", 1, 1})

	// A set with a plugin that cannot be loaded: an error naming it, and
	// the set in use stays.
	writeConfig("[[plugins]]\npath = \"plugins/polite.wasm\"\n\n[[plugins]]\npath = \"plugins/missing.wasm\"\n")
	hup(`msg="reward plugins not reloaded; the plugins in use stay"`)
	var refused string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "reward plugins not reloaded") {
			refused = l
		}
	}
	if !strings.Contains(refused, "level=ERROR") || !strings.Contains(refused, `\"missing\"`) ||
		!strings.Contains(refused, filepath.Join(data, "plugins", "missing.wasm")+": no such file") {
		t.Errorf("the refused reload's log line %q: want an error naming the plugin, its path and why", refused)
	}
	say("/bad")
	check(scored("/bad"), want{"polite", 2, 0.25}, want{"feedback", -1, 1})

	// What the pool holds feeds `reward test`: it gives the verdicts polite
	// gave in the node.
	steps, export := exportSteps(t, data)
	file := filepath.Join(t.TempDir(), "steps.jsonl")
	if err := os.WriteFile(file, []byte(export), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCLI(t, "reward", "test", filepath.Join(data, "plugins", "polite.wasm"), "--steps", file)
	if code != 0 {
		t.Fatalf("reward test: code %d, %s", code, errs)
	}
	lines, summary := parseRewardLines(t, out)
	if len(lines) != len(steps) || len(steps) != 4 {
		t.Fatalf("reward test: %d lines for %d steps exported (want 4):\n%s", len(lines), len(steps), out)
	}
	for _, l := range lines {
		s := steps[core.StepID(l.step)]
		if l.plugin != "polite" {
			t.Errorf("reward test line %+v: plugin %q", l, l.plugin)
		}
		if s.Reward == nil {
			if l.verdict != "abstain" || l.why != "no user reply" {
				t.Errorf("the open step %s: %s (%s), want abstain, no user reply", l.step, l.verdict, l.why)
			}
			continue
		}
		var stored string
		for _, sc := range s.Reward.Scores {
			if sc.Plugin == "polite" {
				stored = "abstain"
				if sc.Value != nil {
					stored = fmt.Sprintf("%+.2f", *sc.Value) // as reward test writes it
				}
			}
		}
		if l.verdict != stored {
			t.Errorf("step %s: reward test says %s, the node stored %s", l.step, l.verdict, stored)
		}
	}
	if summary != "4 steps, 2 scores, 2 abstentions" {
		t.Errorf("reward test summary %q", summary)
	}

	cancel()
	if code := <-done; code != 0 {
		t.Errorf("node exited with code %d:\n%s", code, logs.String())
	}
	stopped = true

	// A node whose config enables a plugin that cannot be loaded does not
	// start, and says which and why.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "config.toml"), []byte("[[plugins]]\npath = \"polite/polite.wasm\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code = runCLI(t, "node", "--data", other, "--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errs, `"polite"`) || !strings.Contains(errs, filepath.Join(other, "polite", "polite.wasm")+": no such file") {
		t.Errorf("node with a missing plugin: code %d, stderr %q; want 1 and an error naming polite and its path", code, errs)
	}
}
