package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
)

func runScrubCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := 0
	if err := runScrub(context.Background(), args, strings.NewReader(stdin), &out, &errb); err != nil {
		code = 1
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), code
}

// TestScrubText: each line comes out scrubbed, one table for the input,
// a key spanning lines as one placeholder; --report counts by kind;
// [share] names and --name are hidden.
func TestScrubText(t *testing.T) {
	data := t.TempDir()
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("[share]\nnames = [\"Project Falcon\"]\n"), 0o600)
	in := "Mail alice@example.org about project falcon.\n" +
		"ssh deploy@10.0.4.17 -i key; cc alice@example.org and Zoe\r\n" +
		"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n" +
		"version 1.2.3.4, commit 3f786850e387550fdab836ed7e6dc881de23001b\n"
	out, errs, code := runScrubCLI(t, in, "--data", data, "--report", "--name", "Zoe")
	if code != 0 {
		t.Fatalf("code %d: %s", code, errs)
	}
	want := "Mail <EMAIL_1> about <NAME_1>.\n" +
		"ssh deploy@<IP_1> -i key; cc <EMAIL_1> and <NAME_2>\r\n" +
		"<PRIVATE_KEY_1>\n" +
		"version 1.2.3.4, commit 3f786850e387550fdab836ed7e6dc881de23001b\n"
	if out != want {
		t.Errorf("got\n%q\nwant\n%q", out, want)
	}
	for _, line := range []string{"scrubbed 6:", "EMAIL        2", "IP           1", "PRIVATE_KEY  1", "NAME         2"} {
		if !strings.Contains(errs, line) {
			t.Errorf("report lacks %q:\n%s", line, errs)
		}
	}
	if _, errs, code := runScrubCLI(t, "", "extra"); code == 0 || !strings.Contains(errs, "standard input") {
		t.Errorf("an argument: %d %s", code, errs)
	}
	if _, errs, code := runScrubCLI(t, "x", "--name", "A"); code == 0 || !strings.Contains(errs, "too short") {
		t.Errorf("a one-letter name: %d %s", code, errs)
	}
}

// TestScrubSteps: `pool export` JSONL in, the steps as they would leave
// out: ids hashed with the device's key (the same hash each run), times
// rounded, withheld tool results, one table per session.
func TestScrubSteps(t *testing.T) {
	data := t.TempDir()
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("[share]\ntools = [\"read\"]\n"), 0o600)
	mk := func(id, sess, text string) string {
		s := core.Step{ID: core.StepID(id), SessionID: core.SessionID(sess), Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
			Request: core.Request{Messages: []core.Message{
				{Role: core.RoleUser, Content: text},
				{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "c1", Name: "read", Arguments: `{"p":"/home/ann/x"}`}, {ID: "c2", Name: "web", Arguments: "{}"}}},
				{Role: core.RoleTool, ToolCallID: "c1", Content: "ann@example.org"},
				{Role: core.RoleTool, ToolCallID: "c2", Content: "secret page"},
			}},
			Timings: core.Timings{Start: time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC)}}
		b, _ := json.Marshal(core.ExportedStep{Schema: core.SchemaVersion, Step: s})
		return string(b) + "\n"
	}
	in := mk("st1", "A", "to bob@example.org") + "\n" + mk("st2", "A", "and ann@example.org") + mk("st3", "B", "ann@example.org")
	out, errs, code := runScrubCLI(t, in, "--steps", "--data", data)
	if code != 0 {
		t.Fatalf("code %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	var steps []core.ExportedStep
	for _, l := range lines {
		var e core.ExportedStep
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Schema != core.SchemaVersion {
			t.Fatalf("line %q: %v", l, err)
		}
		steps = append(steps, e)
	}
	a1, a2, b1 := steps[0], steps[1], steps[2]
	if a1.SessionID != a2.SessionID || a1.SessionID == b1.SessionID || a1.SessionID == "A" || len(a1.ID) != 24 {
		t.Errorf("ids: %s %s %s, step %s", a1.SessionID, a2.SessionID, b1.SessionID, a1.ID)
	}
	if got := a2.Request.Messages[0].Content; got != "and <EMAIL_2>" {
		t.Errorf("session A, step 2: %q (bob is 1, ann is 2 from step 1's tool result)", got)
	}
	if got := b1.Request.Messages[0].Content; got != "<EMAIL_1>" {
		t.Errorf("session B: %q", got)
	}
	if a1.Request.Messages[3].Content != "<TOOL_RESULT_WITHHELD>" || a1.Request.Messages[2].Content != "<EMAIL_2>" {
		t.Errorf("tool results: %+v", a1.Request.Messages[2:])
	}
	if !a1.Timings.Start.Equal(time.Date(2026, 2, 3, 4, 0, 0, 0, time.UTC)) {
		t.Errorf("time %v", a1.Timings.Start)
	}
	again, _, _ := runScrubCLI(t, in, "--steps", "--data", data)
	if again != out {
		t.Error("the same input, the same data dir: different output")
	}
	if _, errs, code := runScrubCLI(t, in+"{\"id\":\"x\"}\n", "--steps", "--data", data); code == 0 || !strings.Contains(errs, "line 5") {
		t.Errorf("a bad line: %d %s", code, errs)
	}
}

// TestPoolPreview: `pool preview` shows the next batch as it would leave,
// from a stopped node's data, under the config's [share] policy; --json
// is the share.Preview.
func TestPoolPreview(t *testing.T) {
	data := t.TempDir()
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, text := range []string{"call me at +1 415 555 0132", "my card is 4111 1111 1111 1111", "thanks"} {
		s := &core.Step{ID: core.StepID("p" + string(rune('1'+i))), SessionID: "S", Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: text}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
			Timings:  core.Timings{Start: time.Date(2026, 2, 3, 4, 5, i, 0, time.UTC)},
			Reward:   &core.Reward{Value: fptr(1), Scores: []core.Score{{Plugin: "p", Hash: fakeHash("p"), Value: fptr(1), Weight: 1}}}}
		if i == 2 {
			s.Reward = &core.Reward{Scores: []core.Score{}}
		}
		if err := p.Put(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()

	// No [share] mode: nothing leaves.
	out, errs, code := runCLI(t, "pool", "preview", "--data", data)
	if code != 0 || !strings.Contains(out, "nothing would leave now") || !strings.Contains(out, "mode = \"none\"") {
		t.Fatalf("mode none: %d %s %q", code, errs, out)
	}
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("[share]\nmode = \"scored\"\n"), 0o600)
	out, errs, code = runCLI(t, "pool", "preview", "--data", data, "--limit", "1")
	if code != 0 {
		t.Fatalf("%d %s", code, errs)
	}
	for _, want := range []string{"not sealed yet", "2 steps in 1 session", "held        1 step stays", "p3  (every plugin abstained", "1 of its 2 steps", "<PHONE_1>", "scrubbed    PHONE 1, CARD 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("preview lacks %q:\n%s", want, out)
		}
	}
	// The phone number's digits, not "415" alone: the preview's ids are
	// random hex, which now and then holds "415".
	if strings.Contains(out, "555 0132") || strings.Contains(out, "415 555") || strings.Contains(out, "<CARD_1>") {
		t.Errorf("preview shows more than asked or leaks:\n%s", out)
	}
	js, _, code := runCLI(t, "pool", "preview", "--data", data, "--json", "--limit", "0")
	var pv share.Preview
	if err := json.Unmarshal([]byte(js), &pv); code != 0 || err != nil || len(pv.Steps) != 2 || pv.Sealed || pv.Mode != share.ModeScored {
		t.Fatalf("--json: %d %v %+v", code, err, pv)
	}
	// A preview changes nothing.
	stats, _, _ := runCLI(t, "pool", "stats", "--data", data)
	if !strings.Contains(stats, "scored 3") {
		t.Errorf("stats after previews: %s", stats)
	}
	if _, errs, code := runCLI(t, "pool", "preview", "--data", data, "--limit", "-1"); code != 2 {
		t.Errorf("--limit -1: %d %s", code, errs)
	}
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("[share]\nmode = \"most\"\n"), 0o600)
	if _, errs, code := runCLI(t, "pool", "preview", "--data", data); code != 1 || !strings.Contains(errs, "[share]: mode \"most\"") {
		t.Errorf("a bad mode: %d %s", code, errs)
	}
}

// TestReloadShare: SIGHUP's reload reads [share] again and puts it in
// force; a config that does not parse changes nothing.
func TestReloadShare(t *testing.T) {
	data := t.TempDir()
	conf := filepath.Join(data, "config.toml")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := node.New(ctx, node.Config{DataDir: data, Upstream: "http://127.0.0.1:9/v1", NoScoring: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if m := n.Outbox().Policy().Mode; m != share.ModeNone {
		t.Fatalf("default mode %s", m)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := settings{Data: data}
	os.WriteFile(conf, []byte("[share]\nmode = \"all\"\ntools = [\"*\"]\n"), 0o600)
	reloadShare(s, n, log)
	if p := n.Outbox().Policy(); p.Mode != share.ModeAll || len(p.Tools) != 1 || !strings.Contains(logs.String(), "sharing policy reloaded") {
		t.Fatalf("after reload: %+v\n%s", p, logs.String())
	}
	os.WriteFile(conf, []byte("[share]\nmode = \"everything\"\n"), 0o600)
	reloadShare(s, n, log)
	if p := n.Outbox().Policy(); p.Mode != share.ModeAll || !strings.Contains(logs.String(), "the policy in force stays") {
		t.Fatalf("after a bad reload: %+v\n%s", p, logs.String())
	}
}

// TestPoolPreviewNothingWaiting: with sharing on and no scored step,
// `pool preview` says once that nothing would leave, and why.
func TestPoolPreviewNothingWaiting(t *testing.T) {
	data := t.TempDir()
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	os.WriteFile(filepath.Join(data, "config.toml"), []byte("[share]\nmode = \"scored\"\n"), 0o600)
	out, errs, code := runCLI(t, "pool", "preview", "--data", data)
	if code != 0 || strings.Count(out, "nothing would leave now") != 1 || !strings.Contains(out, "no scored step is waiting") {
		t.Fatalf("%d %s %q", code, errs, out)
	}
}
