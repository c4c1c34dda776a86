package pool

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/internal/core"
)

// TestApply: a put and changes of other steps land together, in one WAL
// sync, and an Apply that fails anywhere writes nothing.
func TestApply(t *testing.T) {
	ctx := context.Background()
	syncs := new(atomic.Int64)
	p := openTest(t, t.TempDir(), Options{FS: syncCountFS{vfs.Default, syncs}})
	for _, id := range []core.StepID{"a", "b"} {
		if err := p.Put(ctx, simpleStep(id, "s", t0, core.StateOpen, string(id))); err != nil {
			t.Fatal(err)
		}
	}
	closeWith := func(next string) func(*core.Step) error {
		return func(s *core.Step) error {
			s.State = core.StateClosed
			s.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: next}}, StepID: "c"}
			return nil
		}
	}

	before := syncs.Load()
	c := simpleStep("c", "s", t0.Add(time.Second), core.StateUnknown, "c")
	if err := p.Apply(ctx, []*core.Step{c}, []Change{{ID: "a", Fn: closeWith("for a")}, {ID: "b", Fn: closeWith("for b")}}); err != nil {
		t.Fatal(err)
	}
	if n := syncs.Load() - before; n != 1 {
		t.Errorf("Apply of a put and two changes synced the WAL %d times, want 1", n)
	}
	if c.State != core.StateOpen {
		t.Errorf("Apply left the put's state %s, want open filled in", c.State)
	}
	checkIndexOnly(t, p, Filter{State: core.StateOpen}, []core.StepID{"c"})
	checkIndexOnly(t, p, Filter{State: core.StateClosed}, []core.StepID{"a", "b"})
	if got, err := p.Get(ctx, "b"); err != nil || got.NextState == nil || got.NextState.Messages[0].Content != "for b" {
		t.Fatalf("b after Apply: %+v, %v", got, err)
	}

	// Failures: a missing step, a change function's error, a backward
	// move, a step twice. Each leaves everything as it was.
	boom := errors.New("boom")
	for name, tc := range map[string]struct {
		puts    []*core.Step
		changes []Change
		want    error
	}{
		"missing": {[]*core.Step{simpleStep("d", "s", t0, core.StateOpen, "d")},
			[]Change{{ID: "zz", Fn: closeWith("x")}}, ErrNotFound},
		"fn error": {[]*core.Step{simpleStep("d", "s", t0, core.StateOpen, "d")},
			[]Change{{ID: "c", Fn: func(s *core.Step) error { s.State = core.StateClosed; return boom }}}, boom},
		"backwards": {[]*core.Step{simpleStep("d", "s", t0, core.StateOpen, "d")},
			[]Change{{ID: "c", Fn: closeWith("x")}, {ID: "a", Fn: func(s *core.Step) error { s.State = core.StateOpen; return nil }}}, ErrTransition},
		"twice": {[]*core.Step{simpleStep("c", "s", t0, core.StateClosed, "c")},
			[]Change{{ID: "c", Fn: closeWith("x")}}, ErrInvalid},
		"no fn": {nil, []Change{{ID: "c"}}, ErrInvalid},
	} {
		if err := p.Apply(ctx, tc.puts, tc.changes); !errors.Is(err, tc.want) {
			t.Errorf("%s: Apply = %v, want %v", name, err, tc.want)
		}
		checkIndexOnly(t, p, Filter{State: core.StateOpen}, []core.StepID{"c"})
		checkIndexOnly(t, p, Filter{State: core.StateClosed}, []core.StepID{"a", "b"})
		if _, err := p.Get(ctx, "d"); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: the put of a failed Apply was stored (%v)", name, err)
		}
	}
	if err := p.Apply(ctx, nil, nil); err != nil {
		t.Errorf("empty Apply: %v", err)
	}
}

// TestApplySurvivesPowerLoss: what Apply wrote is there after a crash that
// keeps only synced data.
func TestApplySurvivesPowerLoss(t *testing.T) {
	ctx := context.Background()
	p, crash := crashablePool(t)
	gen := NewStepGen("pl", 4)
	if err := p.Put(ctx, gen.Step(0)); err != nil {
		t.Fatal(err)
	}
	next := gen.Step(1)
	err := p.Apply(ctx, []*core.Step{next}, []Change{{ID: gen.Step(0).ID, Fn: func(s *core.Step) error {
		s.State = core.StateClosed
		s.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "go on"}}, StepID: next.ID}
		return nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	q := crash()
	got, err := q.Get(ctx, next.ID)
	if err != nil {
		t.Fatalf("the put of an Apply lost in the crash: %v", err)
	}
	mustEqual(t, got, next)
	parent, err := q.Get(ctx, gen.Step(0).ID)
	if err != nil || parent.State != core.StateClosed || parent.NextState == nil || parent.NextState.StepID != next.ID {
		t.Fatalf("the change of an Apply lost in the crash: %+v, %v", parent, err)
	}
}

func TestTransitions(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	if err := p.Put(ctx, simpleStep("a", "s", t0, core.StateOpen, "a")); err != nil {
		t.Fatal(err)
	}
	set := func(st core.State) error {
		return p.Update(ctx, "a", func(s *core.Step) error { s.State = st; return nil })
	}
	for _, step := range []struct {
		to core.State
		ok bool
	}{
		{core.StateOpen, true}, // unchanged
		{core.StateClosed, true},
		{core.StateOpen, false},
		{core.StateScored, true},
		{core.StateClosed, true}, // feedback after scoring: score again
		{core.StateScored, true},
		{core.StateBatched, true},
		{core.StateScored, false},
		{core.StateClosed, false},
		{core.StateShipped, true},
		{core.StateBatched, false},
		{core.StateOpen, false},
	} {
		got, err := p.Get(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		err = set(step.to)
		if step.ok && err != nil {
			t.Fatalf("%s → %s refused: %v", got.State, step.to, err)
		}
		if !step.ok && !errors.Is(err, ErrTransition) {
			t.Fatalf("%s → %s: %v, want ErrTransition", got.State, step.to, err)
		}
		if !step.ok {
			checkIndexOnly(t, p, Filter{State: got.State}, []core.StepID{"a"})
		}
	}
	// A Put that replaces a stored step obeys the same rule.
	if err := p.Put(ctx, simpleStep("a", "s", t0, core.StateOpen, "again")); !errors.Is(err, ErrTransition) {
		t.Fatalf("Put replacing a shipped step with an open one: %v", err)
	}
}

// TestFailedIsADeadEnd: a failed call's step enters failed from open (or is
// put failed) and never reaches a state that is scored, batched or shipped.
func TestFailedIsADeadEnd(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	if err := p.Put(ctx, simpleStep("f", "s", t0, core.StateOpen, "f")); err != nil {
		t.Fatal(err)
	}
	if err := p.Update(ctx, "f", func(s *core.Step) error { s.State = core.StateFailed; return nil }); err != nil {
		t.Fatalf("open → failed: %v", err)
	}
	for _, to := range []core.State{core.StateOpen, core.StateClosed, core.StateScored, core.StateHeld, core.StateBatched, core.StateShipped} {
		err := p.Update(ctx, "f", func(s *core.Step) error { s.State = to; return nil })
		if !errors.Is(err, ErrTransition) {
			t.Errorf("failed → %s: %v, want ErrTransition", to, err)
		}
	}
	if err := p.Put(ctx, simpleStep("g", "s", t0.Add(time.Second), core.StateFailed, "g")); err != nil {
		t.Fatalf("put failed: %v", err)
	}
	if err := p.Put(ctx, simpleStep("c", "s", t0.Add(2*time.Second), core.StateClosed, "c")); err != nil {
		t.Fatal(err)
	}
	if err := p.Update(ctx, "c", func(s *core.Step) error { s.State = core.StateFailed; return nil }); !errors.Is(err, ErrTransition) {
		t.Errorf("closed → failed: %v, want ErrTransition", err)
	}
	checkIndexOnly(t, p, Filter{State: core.StateFailed}, []core.StepID{"f", "g"})
	st, err := p.Stats(ctx)
	if err != nil || st.ByState[core.StateFailed] != 2 || st.ByState[core.StateClosed] != 1 {
		t.Fatalf("stats %v, %v: want 2 failed and 1 closed", st.ByState, err)
	}
}

// TestKnownBlobsForgottenBySweep: a blob the write path knows as stored,
// then deleted by the sweep once no step references it, is written again by
// the next step that references it.
func TestKnownBlobsForgottenBySweep(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(48 * time.Hour)
	p := openTest(t, t.TempDir(), Options{MaxAge: 24 * time.Hour, Now: func() time.Time { return now }})
	if err := p.Put(ctx, simpleStep("old", "s", t0, core.StateClosed, "said once")); err != nil {
		t.Fatal(err)
	}
	if n, err := p.ApplyRetention(ctx); err != nil || n != 1 {
		t.Fatalf("retention: %d, %v", n, err)
	}
	again := simpleStep("new", "s", now, core.StateClosed, "said once")
	if err := p.Put(ctx, again); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, "new")
	if err != nil {
		t.Fatalf("a step whose messages were swept before it was put: %v", err)
	}
	mustEqual(t, got, again)
}

// TestFingerprintCoversFields: a fingerprint changes with every field that
// a blob's canonical JSON holds, so equal fingerprints mean equal blobs. It
// fails when core's message or tool types gain a field the fingerprint
// does not cover.
func TestFingerprintCoversFields(t *testing.T) {
	covered := map[reflect.Type][]string{
		reflect.TypeFor[core.Message]():  {"Role", "Content", "Parts", "Reasoning", "Name", "ToolCalls", "ToolCallID", "IsError"},
		reflect.TypeFor[core.Part]():     {"Type", "Raw"},
		reflect.TypeFor[core.ToolCall](): {"ID", "Type", "Name", "Arguments"},
		reflect.TypeFor[core.Tool]():     {"Name", "Description", "Parameters"},
	}
	for typ, names := range covered {
		var have []string
		for f := range typ.Fields() {
			have = append(have, f.Name)
		}
		if !reflect.DeepEqual(have, names) {
			t.Errorf("%v has fields %v; the fingerprint covers %v: update fingerprinter", typ, have, names)
		}
	}

	fp := newKnownBlobs(8).fingerprinter()
	base := core.Message{Role: "assistant", Content: "c", Parts: []core.Part{{Type: "image", Raw: json.RawMessage(`{"u":1}`)}},
		Reasoning: "r", Name: "n", ToolCalls: []core.ToolCall{{ID: "i", Type: "function", Name: "f", Arguments: "{}"}}, ToolCallID: "t"}
	mutations := map[string]func(m *core.Message){
		"role":         func(m *core.Message) { m.Role = "user" },
		"content":      func(m *core.Message) { m.Content = "d" },
		"content→name": func(m *core.Message) { m.Content, m.Name = "", "cn" },
		"parts nil":    func(m *core.Message) { m.Parts = nil },
		"part type":    func(m *core.Message) { m.Parts = []core.Part{{Type: "file", Raw: m.Parts[0].Raw}} },
		"part raw":     func(m *core.Message) { m.Parts = []core.Part{{Type: "image", Raw: json.RawMessage(`{"u":2}`)}} },
		"reasoning":    func(m *core.Message) { m.Reasoning = "s" },
		"name":         func(m *core.Message) { m.Name = "o" },
		"call id": func(m *core.Message) {
			m.ToolCalls = []core.ToolCall{{ID: "j", Type: "function", Name: "f", Arguments: "{}"}}
		},
		"call type": func(m *core.Message) { m.ToolCalls = []core.ToolCall{{ID: "i", Type: "x", Name: "f", Arguments: "{}"}} },
		"call name": func(m *core.Message) {
			m.ToolCalls = []core.ToolCall{{ID: "i", Type: "function", Name: "g", Arguments: "{}"}}
		},
		"call args": func(m *core.Message) {
			m.ToolCalls = []core.ToolCall{{ID: "i", Type: "function", Name: "f", Arguments: `{"a":1}`}}
		},
		"tool calls":    func(m *core.Message) { m.ToolCalls = nil },
		"tool call id":  func(m *core.Message) { m.ToolCallID = "u" },
		"is error":      func(m *core.Message) { m.IsError = true },
		"two tool call": func(m *core.Message) { m.ToolCalls = append(m.ToolCalls, m.ToolCalls[0]) },
	}
	want := fp.message(&base)
	if again := fp.message(&base); again != want {
		t.Fatal("fingerprint of the same message differs")
	}
	for name, mut := range mutations {
		m := base
		m.Parts = append([]core.Part(nil), base.Parts...)
		m.ToolCalls = append([]core.ToolCall(nil), base.ToolCalls...)
		mut(&m)
		if fp.message(&m) == want {
			t.Errorf("%s: fingerprint unchanged", name)
		}
	}
	tools := []core.Tool{{Name: "a", Description: "d", Parameters: json.RawMessage(`{}`)}}
	wantT := fp.tools(tools)
	for name, ts := range map[string][]core.Tool{
		"nil":         nil,
		"empty":       {},
		"name":        {{Name: "b", Description: "d", Parameters: json.RawMessage(`{}`)}},
		"description": {{Name: "a", Description: "e", Parameters: json.RawMessage(`{}`)}},
		"parameters":  {{Name: "a", Description: "d", Parameters: json.RawMessage(`{"x":1}`)}},
		"two":         {tools[0], tools[0]},
	} {
		if fp.tools(ts) == wantT {
			t.Errorf("tools %s: fingerprint unchanged", name)
		}
	}
}

// Long strings enter a fingerprint as their own hash: equal texts still
// fingerprint the same, and texts that differ anywhere (one byte in the
// middle, a long one against a short one) do not.
func TestFingerprintLongStrings(t *testing.T) {
	k := newKnownBlobs(16)
	long := strings.Repeat("rule: keep it short. ", 2000)
	mid := []byte(long)
	mid[len(mid)/2] ^= 1
	fp := func(content string) fingerprint {
		return k.fingerprinter().message(&core.Message{Role: core.RoleSystem, Content: content})
	}
	if fp(long) != fp(strings.Clone(long)) {
		t.Fatal("equal long texts fingerprint differently")
	}
	seen := map[fingerprint]string{}
	for name, c := range map[string]string{"long": long, "one byte changed": string(mid), "shorter": long[:len(long)-1],
		"at the threshold": long[:longString], "below it": long[:longString-1]} {
		f := fp(c)
		if other, ok := seen[f]; ok {
			t.Fatalf("%s and %s fingerprint the same", name, other)
		}
		seen[f] = name
	}
	tools := func(params string) fingerprint {
		return k.fingerprinter().tools([]core.Tool{{Name: "t", Parameters: json.RawMessage(params)}})
	}
	big := `{"description":"` + strings.Repeat("x", 1000) + `"}`
	if tools(big) == tools(strings.Replace(big, "xx", "xy", 1)) || tools(big) != tools(strings.Clone(big)) {
		t.Fatal("long tool parameters fingerprinted wrongly")
	}
}
