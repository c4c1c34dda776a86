package session

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

func TestCanonicalKey(t *testing.T) {
	asst := func(content string, calls ...core.ToolCall) core.Message {
		return core.Message{Role: core.RoleAssistant, Content: content, ToolCalls: calls}
	}
	call := func(id, name, args string) core.ToolCall {
		return core.ToolCall{ID: id, Type: "function", Name: name, Arguments: args}
	}
	tests := []struct {
		name  string
		a, b  core.Message
		equal bool
	}{
		{"same text", asst("hi"), asst("hi"), true},
		{"reasoning ignored", core.Message{Role: core.RoleAssistant, Content: "hi", Reasoning: "hmm"}, asst("hi"), true},
		{"surrounding space trimmed", asst("  hi\n"), asst("hi"), true},
		{"inner space kept", asst("h i"), asst("hi"), false},
		{"role matters", core.Message{Role: core.RoleUser, Content: "hi"}, asst("hi"), false},
		{"content matters", asst("hi"), asst("ho"), false},
		{"tool-call id ignored", asst("", call("call_fake1", "f", `{}`)), asst("", call("callfake1", "f", `{}`)), true},
		{"tool name matters", asst("", call("1", "f", `{}`)), asst("", call("1", "g", `{}`)), false},
		{"argument order and spacing", asst("", call("1", "f", `{"b": 1, "a": [1, 2]}`)), asst("", call("1", "f", `{"a":[1,2],"b":1}`)), true},
		{"argument values matter", asst("", call("1", "f", `{"a":1}`)), asst("", call("1", "f", `{"a":2}`)), false},
		{"big numbers kept exact", asst("", call("1", "f", `{"a":12345678901234567890}`)), asst("", call("1", "f", `{"a":12345678901234567891}`)), false},
		{"empty arguments are {}", asst("", call("1", "f", "")), asst("", call("1", "f", "{}")), true},
		{"invalid JSON compared as text", asst("", call("1", "f", "{oops")), asst("", call("1", "f", "{oops")), true},
		{"invalid JSON differs", asst("", call("1", "f", "{oops")), asst("", call("1", "f", "{oops!")), false},
		{"tool-call count matters", asst("", call("1", "f", "{}")), asst("", call("1", "f", "{}"), call("2", "f", "{}")), false},
		{"tool result id ignored", core.Message{Role: core.RoleTool, ToolCallID: "call_1", Content: "42"}, core.Message{Role: core.RoleTool, ToolCallID: "call1", Content: "42"}, true},
		{"tool result content matters", core.Message{Role: core.RoleTool, Content: "42"}, core.Message{Role: core.RoleTool, Content: "43"}, false},
		{"field boundaries", asst("f", call("", "", "{}")), asst("", call("", "f", "{}")), false},
		{"parts matter", core.Message{Role: core.RoleUser, Parts: []core.Part{{Type: "image", Raw: json.RawMessage(`"a"`)}}}, core.Message{Role: core.RoleUser, Parts: []core.Part{{Type: "image", Raw: json.RawMessage(`"b"`)}}}, false},
	}
	hs := newHasher()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ka, kb := hs.sum(&tt.a), hs.sum(&tt.b)
			if (ka == kb) != tt.equal {
				t.Fatalf("keys equal = %v, want %v", ka == kb, tt.equal)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"zero", Options{}, true},
		{"negative idle", Options{IdleTimeout: -1}, false},
		{"negative sessions", Options{MaxSessions: -1}, false},
		{"negative steps", Options{MaxSteps: -1}, false},
		{"empty marker", Options{VolatileMarkers: []string{"x", ""}}, false},
		{"no volatile", Options{NoVolatile: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(tt.opts)
			if tt.ok != (err == nil) {
				t.Fatalf("New: %v", err)
			}
			if err != nil && !errors.Is(err, ErrOptions) {
				t.Fatalf("error %v is not ErrOptions", err)
			}
			if tr != nil && tt.name == "zero" {
				o := tr.opts
				if o.IdleTimeout != 30*time.Minute || o.MaxSessions != 10000 || o.MaxSteps != 4096 || len(o.VolatileMarkers) != 1 || o.VolatileMarkers[0] != OpenClawMarker {
					t.Fatalf("defaults: %+v", o)
				}
			}
		})
	}
}

// chain runs call → reply → call and returns the second call's assignment.
func chain(t *testing.T, tr *Tracker, first, second []core.Message, reply core.Message) Assignment {
	t.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr.Begin(Call{Now: now, StepID: "a", Messages: first})
	tr.Complete("a", []core.Message{reply}, now)
	return tr.Begin(Call{Now: now, StepID: "b", Messages: second})
}

func TestVolatileMarkers(t *testing.T) {
	u := func(s string) core.Message { return core.Message{Role: core.RoleUser, Content: s} }
	a := core.Message{Role: core.RoleAssistant, Content: "ok"}
	tests := []struct {
		name       string
		opts       Options
		parent     core.StepID
		nextStates int
	}{
		{"custom marker skipped", Options{VolatileMarkers: []string{"[ctx]"}}, "a", 1},
		{"default marker does not know it", Options{}, "", 0},
		{"disabled", Options{NoVolatile: true}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			asg := chain(t, tr, []core.Message{u("hi"), u("[ctx] 10:00")}, []core.Message{u("hi"), a, u("more"), u("[ctx] 10:01")}, a)
			if asg.Parent != tt.parent || len(asg.Closures) != tt.nextStates {
				t.Fatalf("parent %q closures %+v; want %q and %d", asg.Parent, asg.Closures, tt.parent, tt.nextStates)
			}
			if tt.nextStates == 1 {
				ns := asg.Closures[0].NextState
				if ns == nil || len(ns.Messages) != 1 || ns.Messages[0].Content != "more" || ns.StepID != "b" {
					t.Fatalf("next state %+v", ns)
				}
			}
		})
	}
}

func TestNextStateIsACopy(t *testing.T) {
	tr, _ := New(Options{})
	u := core.Message{Role: core.RoleUser, Content: "hi"}
	second := []core.Message{u, {Role: core.RoleAssistant, Content: "ok"}, {Role: core.RoleUser, Content: "more"}}
	asg := chain(t, tr, []core.Message{u}, second, core.Message{Role: core.RoleAssistant, Content: "ok"})
	second[2].Content = "changed by the caller"
	if got := asg.Closures[0].NextState.Messages[0].Content; got != "more" {
		t.Fatalf("next state changed with the caller's slice: %q", got)
	}
}

func TestRepeatedAndUnknownIDs(t *testing.T) {
	tr, _ := New(Options{})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	u := core.Message{Role: core.RoleUser, Content: "hi"}
	a := core.Message{Role: core.RoleAssistant, Content: "ok"}
	tr.Begin(Call{Now: now, StepID: "a", Messages: []core.Message{u}})
	tr.Complete("a", []core.Message{a}, now)
	next := []core.Message{u, a, {Role: core.RoleUser, Content: "more"}}
	first := tr.Begin(Call{Now: now, StepID: "b", Messages: next})
	again := tr.Begin(Call{Now: now, StepID: "b", Messages: next})
	if len(first.Closures) != 1 || len(again.Closures) != 0 {
		t.Fatalf("closures %v then %v", first.Closures, again.Closures)
	}
	first.Closures = nil
	if first.Session != again.Session || first.Chain != again.Chain || first.Parent != again.Parent {
		t.Fatalf("repeated Begin: %+v then %+v", first, again)
	}
	if cl := tr.Complete("nope", []core.Message{a}, now); len(cl) != 0 {
		t.Fatalf("unknown Complete closed %v", cl)
	}
	tr.Abort("nope")
	tr.Abort("a") // completed: ignored
	if cl := tr.Complete("a", []core.Message{a}, now); len(cl) != 0 {
		t.Fatalf("second Complete closed %v", cl)
	}
	if st := tr.Stats(); st.Steps != 2 || st.InFlight != 1 || st.Open != 0 {
		t.Fatalf("stats %+v", st)
	}
	if err := tr.check(); err != nil {
		t.Fatal(err)
	}
}

func TestSourceString(t *testing.T) {
	for s, want := range map[Source]string{SourceNone: "none", SourcePath: "path", SourceHeader: "header", SourceBody: "body", 9: "source(9)"} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", s, s.String(), want)
		}
	}
}

// TestRestore: steps an earlier tracker left open, restored into a new one,
// are continued by new calls as if the tracker had never stopped: by
// message prefix and by explicit session, a restored parent chains, and a
// restored step whose idle timeout has passed closes at the next Tick.
func TestRestore(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	msg := func(role, text string) core.Message { return core.Message{Role: role, Content: text} }
	sys, u1, a1 := msg(core.RoleSystem, "sys"), msg(core.RoleUser, "one"), msg(core.RoleAssistant, "reply one")
	u2, a2 := msg(core.RoleUser, "two"), msg(core.RoleAssistant, "reply two")
	tr, err := New(Options{IdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Restored{
		// A prefix-matched session: two open steps, the second continuing
		// the first (its parent is restored too, and already closed on disk
		// would be fine as well).
		{StepID: "a1", Session: "s-a1", Chain: "c-a1", Turn: core.TurnMain, Messages: []core.Message{sys, u1}, Actions: []core.Message{a1}, Completed: t0},
		// An explicit session.
		{StepID: "x1", Session: "explicit", Chain: "c-x1", Turn: core.TurnMain, Messages: []core.Message{msg(core.RoleUser, "hi")}, Actions: []core.Message{msg(core.RoleAssistant, "hello")}, Completed: t0},
		// Idle for longer than the timeout by the time of the restart.
		{StepID: "old", Session: "s-old", Chain: "c-old", Turn: core.TurnMain, Messages: []core.Message{msg(core.RoleUser, "old")}, Actions: []core.Message{msg(core.RoleAssistant, "stale")}, Completed: t0.Add(-2 * time.Hour)},
	} {
		if cl := tr.Restore(r); len(cl) != 0 {
			t.Fatalf("restoring %s closed %+v", r.StepID, cl)
		}
	}
	if cl := tr.Restore(Restored{StepID: "a1", Session: "s-a1"}); cl != nil {
		t.Errorf("restoring a known id again: %+v", cl)
	}
	now := t0.Add(time.Minute)
	cl := tr.Tick(now)
	if len(cl) != 1 || cl[0].StepID != "old" || cl[0].NextState != nil {
		t.Fatalf("tick after restore: %+v, want the stale step closed", cl)
	}

	// A new call continuing a1 by prefix: a1 gets its next state.
	a := tr.Begin(Call{Now: now, StepID: "a2", Turn: core.TurnMain, Messages: []core.Message{sys, u1, a1, u2}})
	if a.Session != "s-a1" || a.Parent != "a1" || a.Chain != "c-a1" {
		t.Errorf("continuation of a restored step: %+v", a)
	}
	if len(a.Closures) != 1 || a.Closures[0].StepID != "a1" || a.Closures[0].NextState == nil ||
		len(a.Closures[0].NextState.Messages) != 1 || a.Closures[0].NextState.Messages[0].Content != "two" {
		t.Errorf("restored step's next state: %+v", a.Closures)
	}
	tr.Complete("a2", []core.Message{a2}, now)

	// The explicit session goes on too.
	a = tr.Begin(Call{Now: now, StepID: "x2", Session: "explicit", Source: SourceHeader, Turn: core.TurnMain,
		Messages: []core.Message{msg(core.RoleUser, "hi"), msg(core.RoleAssistant, "hello"), msg(core.RoleUser, "more")}})
	if a.Parent != "x1" || len(a.Closures) != 1 || a.Closures[0].StepID != "x1" || a.Closures[0].NextState == nil {
		t.Errorf("explicit session after restore: %+v", a)
	}
	if err := tr.check(); err != nil {
		t.Fatal(err)
	}
}
