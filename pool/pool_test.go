package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/internal/core"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func openTest(t testing.TB, dir string, opts Options) *Pool {
	t.Helper()
	p, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// crashablePool opens a pool on a filesystem that keeps only synced data
// when it crashes. crash opens the pool as it would be after a power loss
// now (closed at the end of the test).
func crashablePool(t testing.TB) (p *Pool, crash func() *Pool) {
	t.Helper()
	fs := vfs.NewCrashableMem()
	p = openTest(t, "/pool", Options{FS: fs})
	return p, func() *Pool {
		t.Helper()
		q, err := Open("/pool", Options{FS: fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})})
		if err != nil {
			t.Fatalf("open after crash: %v", err)
		}
		t.Cleanup(func() { _ = q.Close() })
		return q
	}
}

func ptr[T any](v T) *T { return &v }

// richStep exercises every field of core.Step.
func richStep(id core.StepID, session core.SessionID, at time.Time) *core.Step {
	return &core.Step{
		ID:        id,
		SessionID: session,
		ChainID:   "chain-1",
		ParentID:  "parent-0",
		Turn:      core.TurnMain,
		API:       core.APIMessages,
		State:     core.StateScored,
		Request: core.Request{
			Model: "qwen3-8b",
			Messages: []core.Message{
				{Role: core.RoleSystem, Content: "You are terse. <b>&</b>"},
				{Role: core.RoleUser, Content: "look", Parts: []core.Part{{Type: "image", Raw: json.RawMessage(`{"url":"data:x"}`)}}},
				{Role: core.RoleAssistant, Reasoning: "think", ToolCalls: []core.ToolCall{{ID: "c1", Type: "function", Name: "read", Arguments: `{"path": "a"}`}}},
				{Role: core.RoleTool, ToolCallID: "c1", Name: "read", Content: "no such file", IsError: true},
			},
			Tools:  []core.Tool{{Name: "read", Description: "reads", Parameters: json.RawMessage(`{"type":"object"}`)}},
			Params: json.RawMessage(`{"max_tokens":100}`),
		},
		Response: core.Response{
			ID:    "msg_1",
			Model: "qwen3-8b",
			Choices: []core.Choice{
				{Index: 0, Message: core.Message{Role: core.RoleAssistant, Content: "It is missing."}, FinishReason: "end_turn",
					Tokens: []core.TokenLogprob{{Token: "It", ID: 12, Logprob: -0.5}, {Token: " is", ID: -1, Logprob: -1.25}}, Fidelity: core.FidelityExact},
				{Index: 1, Message: core.Message{Role: core.RoleAssistant, Content: "Gone."}, FinishReason: "end_turn"},
			},
			Usage:          &core.Usage{PromptTokens: 10, CompletionTokens: 3, TotalTokens: 13},
			PromptTokenIDs: []int{1, 2, 3},
			Status:         200,
		},
		Upstream:           "http://127.0.0.1:8000/v1",
		Model:              "qwen3-8b",
		Adapter:            "v7",
		Timings:            core.Timings{Start: at, TTFT: 120 * time.Millisecond, Total: time.Second},
		ClientDisconnected: true,
		TraceID:            "4bf92f3577b34da6a3ce929d0e0e4736",
		NextState:          &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "no, the other file"}}, StepID: "next-1"},
		Feedback:           []core.Feedback{{Score: ptr(-1.0), Text: "wrong file", At: at.Add(time.Minute)}},
		Reward: &core.Reward{Value: ptr(-0.5), Hint: "check the path", At: at.Add(2 * time.Minute),
			Scores: []core.Score{{Plugin: "correction", Hash: "ab", Value: ptr(-1.0), Weight: 0.5, Labels: []string{"re-ask"}}, {Plugin: "judge", Hash: "cd", Reason: "abstain"}}},
		Source: "gateway",
	}
}

// simpleStep is a small valid step.
func simpleStep(id core.StepID, session core.SessionID, at time.Time, state core.State, content string) *core.Step {
	return &core.Step{
		ID: id, SessionID: session, Turn: core.TurnMain, API: core.APIChat, State: state,
		Request: core.Request{Messages: []core.Message{
			{Role: core.RoleSystem, Content: "shared system prompt"},
			{Role: core.RoleUser, Content: content},
		}},
		Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "re: " + content}}}},
		Timings:  core.Timings{Start: at},
	}
}

func mustEqual(t *testing.T, got, want *core.Step) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("step differs\n got: %s\nwant: %s", g, w)
	}
}

func TestPutGetRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	p := openTest(t, dir, Options{})
	steps := []*core.Step{
		richStep("a", "s1", t0),
		simpleStep("b", "s1", t0.Add(time.Second), core.StateOpen, "hello"),
	}
	// Nil versus empty survive: no tools, empty choices, next state without messages.
	c := simpleStep("c", "s2", t0, core.StateClosed, "x")
	c.Request.Tools = []core.Tool{}
	c.Response.Choices = []core.Choice{}
	c.NextState = &core.NextState{StepID: "b"}
	steps = append(steps, c)
	for _, s := range steps {
		if err := p.Put(ctx, s); err != nil {
			t.Fatalf("Put %s: %v", s.ID, err)
		}
	}
	for _, s := range steps {
		got, err := p.Get(ctx, s.ID)
		if err != nil {
			t.Fatalf("Get %s: %v", s.ID, err)
		}
		mustEqual(t, got, s)
	}
	// Reads share decoded blobs internally; what a caller gets is its own.
	got, err := p.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	got.Request.Messages[1].Parts[0].Raw[0] = 'X'
	got.Request.Messages[2].ToolCalls[0].Name = "changed"
	got.Request.Tools[0].Parameters[0] = 'X'
	got.Request.Tools[0].Name = "changed"
	again, err := p.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, again, steps[0])
	if _, err := p.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get missing: %v, want ErrNotFound", err)
	}
	// Still there after reopening.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openTest(t, dir, Options{})
	for _, s := range steps {
		got, err := p.Get(ctx, s.ID)
		if err != nil {
			t.Fatalf("Get after reopen %s: %v", s.ID, err)
		}
		mustEqual(t, got, s)
	}
}

func TestPutDefaultsAndValidation(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	p := openTest(t, t.TempDir(), Options{Now: func() time.Time { return now }})
	s := simpleStep("a", "s", time.Time{}, core.StateUnknown, "x")
	if err := p.Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != core.StateOpen || !got.Timings.Start.Equal(now) {
		t.Fatalf("defaults: state %v start %v, want open %v", got.State, got.Timings.Start, now)
	}
	bad := simpleStep("b", "", t0, core.StateOpen, "x")
	if err := p.Put(ctx, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put without session: %v, want ErrInvalid", err)
	}
	dropped := simpleStep("c", "s", t0, core.StateDropped, "x")
	if err := p.Put(ctx, dropped); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put dropped: %v, want ErrInvalid", err)
	}
}

func TestPutReplaces(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	if err := p.Put(ctx, simpleStep("a", "s1", t0, core.StateOpen, "one")); err != nil {
		t.Fatal(err)
	}
	repl := simpleStep("a", "s2", t0.Add(time.Hour), core.StateClosed, "two")
	if err := p.Put(ctx, repl); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, got, repl)
	checkIndexOnly(t, p, Filter{Session: "s1"}, nil)
	checkIndexOnly(t, p, Filter{State: core.StateOpen}, nil)
	checkIndexOnly(t, p, Filter{Session: "s2"}, []core.StepID{"a"})
	checkIndexOnly(t, p, Filter{}, []core.StepID{"a"})
	if n := countKeys(t, p, "i/"); n != 3 {
		t.Fatalf("%d index keys for one step, want 3", n)
	}
}

func checkIndexOnly(t *testing.T, p *Pool, f Filter, want []core.StepID) {
	t.Helper()
	got, err := p.List(context.Background(), f)
	if err != nil {
		t.Fatalf("List %+v: %v", f, err)
	}
	if ids := idsOf(got); !reflect.DeepEqual(ids, want) {
		t.Fatalf("List %+v = %v, want %v", f, ids, want)
	}
}

func idsOf(steps []*core.Step) []core.StepID {
	var ids []core.StepID
	for _, s := range steps {
		ids = append(ids, s.ID)
	}
	return ids
}

func countKeys(t *testing.T, p *Pool, prefix string) int {
	t.Helper()
	n := 0
	err := scan(context.Background(), p.cur.db, []byte(prefix), prefixEnd([]byte(prefix)), func(_, _ []byte) error {
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestUpdateMovesIndices(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	for i, id := range []core.StepID{"a", "b", "c"} {
		if err := p.Put(ctx, simpleStep(id, "s", t0.Add(time.Duration(i)*time.Second), core.StateOpen, string(id))); err != nil {
			t.Fatal(err)
		}
	}
	err := p.Update(ctx, "b", func(s *core.Step) error {
		s.State = core.StateClosed
		s.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "next"}}, StepID: "c"}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	checkIndexOnly(t, p, Filter{State: core.StateOpen}, []core.StepID{"a", "c"})
	checkIndexOnly(t, p, Filter{State: core.StateClosed}, []core.StepID{"b"})
	got, err := p.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if got.NextState == nil || got.NextState.Messages[0].Content != "next" {
		t.Fatalf("update lost: %+v", got.NextState)
	}

	// Through every state; the state index always holds exactly one entry.
	for _, st := range []core.State{core.StateScored, core.StateBatched, core.StateShipped} {
		if err := p.Update(ctx, "b", func(s *core.Step) error { s.State = st; return nil }); err != nil {
			t.Fatal(err)
		}
		checkIndexOnly(t, p, Filter{State: st}, []core.StepID{"b"})
	}
	if n := countKeys(t, p, "i/st/"); n != 3 {
		t.Fatalf("%d state index keys, want 3", n)
	}
	// Moving time and session moves those indices.
	if err := p.Update(ctx, "a", func(s *core.Step) error {
		s.SessionID = "other"
		s.Timings.Start = t0.Add(time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	checkIndexOnly(t, p, Filter{Session: "s"}, []core.StepID{"b", "c"})
	checkIndexOnly(t, p, Filter{Session: "other"}, []core.StepID{"a"})
	checkIndexOnly(t, p, Filter{}, []core.StepID{"b", "c", "a"})

	// Errors: fn's error is returned and nothing written; id changes and
	// invalid results are refused; missing steps are ErrNotFound.
	boom := errors.New("boom")
	if err := p.Update(ctx, "c", func(s *core.Step) error { s.State = core.StateClosed; return boom }); !errors.Is(err, boom) {
		t.Fatalf("Update fn error: %v", err)
	}
	checkIndexOnly(t, p, Filter{State: core.StateOpen}, []core.StepID{"c", "a"})
	if err := p.Update(ctx, "c", func(s *core.Step) error { s.ID = "z"; return nil }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Update changing id: %v", err)
	}
	if err := p.Update(ctx, "c", func(s *core.Step) error { s.State = core.StateDropped; return nil }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Update to dropped: %v", err)
	}
	if err := p.Update(ctx, "zz", func(*core.Step) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update missing: %v", err)
	}
}

func TestUpdateConcurrent(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	if err := p.Put(ctx, simpleStep("a", "s", t0, core.StateOpen, "x")); err != nil {
		t.Fatal(err)
	}
	const n = 40
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := p.Update(ctx, "a", func(s *core.Step) error {
				s.Feedback = append(s.Feedback, core.Feedback{Text: "f", At: t0})
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, err := p.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Feedback) != n {
		t.Fatalf("%d feedback entries after %d concurrent updates: lost updates", len(got.Feedback), n)
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	// 30 steps over 3 sessions; pairs share a time so ties sort by id.
	var all []core.StepID
	for i := 0; i < 30; i++ {
		id := core.StepID(fmt.Sprintf("st%02d", i))
		st := core.StateOpen
		if i%3 == 0 {
			st = core.StateClosed
		}
		s := simpleStep(id, core.SessionID(fmt.Sprintf("sess%d", i%3)), t0.Add(time.Duration(i/2)*time.Minute), st, string(id))
		all = append(all, id)
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	pick := func(fn func(i int) bool) []core.StepID {
		var out []core.StepID
		for i, id := range all {
			if fn(i) {
				out = append(out, id)
			}
		}
		return out
	}
	// A session whose name is a prefix of another's must not leak into it.
	if err := p.Put(ctx, simpleStep("zz", "sess1x", t0, core.StateOpen, "z")); err != nil {
		t.Fatal(err)
	}
	withZZ := append([]core.StepID{all[0], all[1], "zz"}, all[2:]...)

	tests := []struct {
		name string
		f    Filter
		want []core.StepID
	}{
		{"all", Filter{}, withZZ},
		{"session", Filter{Session: "sess1"}, pick(func(i int) bool { return i%3 == 1 })},
		{"state", Filter{State: core.StateClosed}, pick(func(i int) bool { return i%3 == 0 })},
		{"session+state", Filter{Session: "sess0", State: core.StateOpen}, nil},
		{"session+state2", Filter{Session: "sess2", State: core.StateOpen}, pick(func(i int) bool { return i%3 == 2 })},
		{"since-until", Filter{Since: t0.Add(5 * time.Minute), Until: t0.Add(7 * time.Minute)}, all[10:14]},
		{"session+time", Filter{Session: "sess0", Since: t0.Add(5 * time.Minute)}, pick(func(i int) bool { return i%3 == 0 && i >= 10 })},
		{"limit", Filter{Limit: 4}, withZZ[:4]},
		{"after", Filter{After: "st10", Limit: 3}, all[11:14]},
		{"after tie", Filter{After: "st10", Until: t0.Add(6 * time.Minute)}, all[11:12]},
		{"state after", Filter{State: core.StateClosed, After: "st12"}, pick(func(i int) bool { return i%3 == 0 && i > 12 })},
		{"empty range", Filter{Since: t0.Add(time.Hour)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkIndexOnly(t, p, tc.f, tc.want) })
	}

	// Paging with a cursor visits every step once, in order.
	var paged []core.StepID
	f := Filter{Limit: 7}
	for range 100 {
		page, err := p.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, idsOf(page)...)
		f.After = page[len(page)-1].ID
	}
	if !reflect.DeepEqual(paged, withZZ) {
		t.Fatalf("paged = %v\nwant %v", paged, withZZ)
	}
	if _, err := p.List(ctx, Filter{After: "missing"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown cursor: %v", err)
	}
	// Listed steps are full steps.
	got, err := p.List(ctx, Filter{Session: "sess1", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Request.Messages[0].Content != "shared system prompt" || got[0].Action().Content != "re: st01" {
		t.Fatalf("listed step not materialized: %+v", got[0])
	}
}

func TestDedupe(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	gen := NewStepGen("d", 20)
	if n := len(gen.Step(0).Request.Messages[0].Content); n < 40000 {
		t.Fatalf("system prompt is %d characters, want 40k", n)
	}
	var naive int64
	diskAt := map[int]int64{}
	for i := 0; i < 200; i++ {
		s := gen.Step(i)
		b, _ := json.Marshal(s)
		naive += int64(len(b))
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
		if i+1 == 20 || i+1 == 200 {
			if err := p.cur.db.Flush(); err != nil {
				t.Fatal(err)
			}
			diskAt[i+1] = int64(p.cur.db.Metrics().DiskSpaceUsage())
		}
	}
	st, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v naive %d disk %v", st, naive, diskAt)
	if st.Steps != 200 || st.Sessions != 10 {
		t.Fatalf("steps %d sessions %d, want 200, 10", st.Steps, st.Sessions)
	}
	if st.ToolListsStored != 1 || st.ToolListsReferenced != 200 {
		t.Fatalf("tool lists stored %d referenced %d, want 1, 200", st.ToolListsStored, st.ToolListsReferenced)
	}
	// Per session of 20 steps: 1 system prompt shared by all, 20 users and 20
	// replies each stored once; references grow with the history.
	if want := 1 + 10*40; st.MessagesStored != want {
		t.Fatalf("messages stored %d, want %d", st.MessagesStored, want)
	}
	if st.MessagesReferenced < 10*st.MessagesStored {
		t.Fatalf("messages referenced %d, stored %d: expected heavy sharing", st.MessagesReferenced, st.MessagesStored)
	}
	if st.Bytes*10 > naive {
		t.Fatalf("step data %d bytes, naive %d: dedupe saves less than 10x", st.Bytes, naive)
	}
	// On disk: 200 steps carry 8 MB of system prompt; the pool must hold far
	// less, and the 180 steps after the first 20 must add less than one
	// system prompt copy per 4 steps.
	if diskAt[200]*4 > naive {
		t.Fatalf("on disk %d bytes for %d naive bytes", diskAt[200], naive)
	}
	if grow := diskAt[200] - diskAt[20]; grow > 180*40000/4 {
		t.Fatalf("180 more steps grew the disk by %d bytes", grow)
	}
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	p, err := Open(t.TempDir(), Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx, simpleStep("a", "s", t0, core.StateOpen, "x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if _, err := p.Get(ctx, "a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if _, err := p.List(ctx, Filter{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("List after Close: %v", err)
	}
	if err := p.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	if _, err := Open(t.TempDir(), Options{MaxAge: -1}); err == nil {
		t.Fatal("negative MaxAge accepted")
	}
	if _, err := Open(t.TempDir(), Options{MaxBytes: -1}); err == nil {
		t.Fatal("negative MaxBytes accepted")
	}
}

func TestLockedInProcess(t *testing.T) {
	dir := t.TempDir()
	p := openTest(t, dir, Options{})
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p2, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	p2.Close()
}

func TestTimeOrder(t *testing.T) {
	times := []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, -1),
		time.Unix(0, 0),
		t0,
		t0.Add(time.Nanosecond),
		time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i := 1; i < len(times); i++ {
		a, b := timeKey(times[i-1], "x"), timeKey(times[i], "x")
		if string(a) > string(b) {
			t.Errorf("%v sorts after %v", times[i-1], times[i])
		}
	}
	if got := ordTime(timeOrd(t0)); !got.Equal(t0) {
		t.Fatalf("time round trip: %v", got)
	}
}
