package reward

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

// checkFlatMatchesJSON encodes a step in both layouts and checks that the
// kit decodes the same Input from each.
func checkFlatMatchesJSON(t *testing.T, s *core.Step, c PluginConfig) {
	t.Helper()
	in := newInput(s)
	jb, err := in.encode(c)
	if err != nil {
		t.Fatal(err)
	}
	var want rewards.Input
	if err := json.Unmarshal(jb, &want); err != nil {
		t.Fatal(err)
	}
	got, err := rewards.DecodeFlat(in.encodeFlat(c))
	if err != nil {
		t.Fatalf("%s: %v", s.ID, err)
	}
	if !reflect.DeepEqual(*got, want) {
		g, _ := json.Marshal(got)
		t.Fatalf("%s: flat and JSON inputs differ\nflat %s\njson %s", s.ID, g, jb)
	}
}

func TestFlatMatchesJSON(t *testing.T) {
	cfg := PluginConfig{Name: "p", Config: map[string]string{"votes": "3", "": "empty key", "k": ""}}
	for _, s := range readTestSteps(t) {
		checkFlatMatchesJSON(t, s, cfg)
		checkFlatMatchesJSON(t, s, PluginConfig{})
	}
	one := 1.0
	odd := &core.Step{
		ID: "odd", Turn: core.TurnSide, API: core.APIMessages, Model: "m",
		Request: core.Request{
			Messages: []core.Message{
				{Role: core.RoleSystem, Content: "bad \xff\xfe utf-8 \xe2\x82 and \u2028 and <html>"},
				{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "c1", Type: "function", Name: "ls", Arguments: `{"a":1}`}, {Name: "x"}}},
				{Role: core.RoleTool, ToolCallID: "c1", Content: "boom", IsError: true, Name: "ls"},
			},
			Tools: []core.Tool{{Name: "ls"}, {Name: "cat"}},
		},
		Response:  core.Response{Choices: []core.Choice{{Message: core.Message{Content: "ok", Reasoning: "think"}}}},
		NextState: &core.NextState{},
		Feedback:  []core.Feedback{{Score: &one, Text: "good"}, {Text: "no score"}},
	}
	checkFlatMatchesJSON(t, odd, cfg)
	odd.NextState = nil
	odd.Request.Messages = nil
	checkFlatMatchesJSON(t, odd, cfg)
}

// FuzzFlatMatchesJSON: whatever text a step holds, the two layouts carry
// the same input.
func FuzzFlatMatchesJSON(f *testing.F) {
	f.Add("user", "hello", "call_1", `{"x":1}`, "k", "v", true)
	f.Add("", "\xff\x80", "", "\u2028", "", "", false)
	f.Fuzz(func(t *testing.T, role, content, id, args, k, v string, next bool) {
		s := &core.Step{
			ID: "f", Turn: core.TurnMain,
			Request: core.Request{Messages: []core.Message{{Role: role, Content: content, ToolCallID: id}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Content: content,
				ToolCalls: []core.ToolCall{{ID: id, Name: role, Arguments: args}}}}}},
			Feedback: []core.Feedback{{Text: args}},
		}
		if next {
			s.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: args}}}
		}
		checkFlatMatchesJSON(t, s, PluginConfig{Name: role, Config: map[string]string{k: v}})
	})
}

func TestDecodeFlatResult(t *testing.T) {
	r, err := DecodeFlatResult(flatResultBytes(-0.5, "  check first ", "a", "", "b"))
	if err != nil || r.Score == nil || *r.Score != -0.5 || r.Hint != "check first" || !reflect.DeepEqual(r.Labels, []string{"a", "b"}) {
		t.Fatalf("%+v %v", r, err)
	}
	abstain := flatResultBytes(0, "h")
	abstain[4] = 0
	if r, err := DecodeFlatResult(abstain); err != nil || r.Score != nil {
		t.Fatalf("abstain: %+v %v", r, err)
	}
	bad := map[string][]byte{
		"short":        flatResultBytes(0.5, "h")[:39],
		"layout":       append([]byte{1}, flatResultBytes(0.5, "h")[1:]...),
		"out of range": flatResultBytes(1.5, ""),
		"nan":          flatResultBytes(math.NaN(), ""),
		"hint oob":     flatResultBytes(0.5, "hint")[:41],
		"labels oob":   flatResultBytes(0.5, "", "a", "b")[:50],
	}
	for name, b := range bad {
		if _, err := DecodeFlatResult(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	long := flatResultBytes(0, strings.Repeat("é", maxHint), strings.Split(strings.Repeat("l,", 100), ",")...)
	r, err = DecodeFlatResult(long)
	if err != nil || len(r.Hint) > maxHint || !utf8.ValidString(r.Hint) || len(r.Labels) != maxLabels {
		t.Fatalf("caps: %v, hint %d bytes, %d labels", err, len(r.Hint), len(r.Labels))
	}
}

// FuzzDecodeFlatResult: whatever bytes a plugin returns, decoding never
// panics, and what it accepts is in range, bounded and valid UTF-8.
func FuzzDecodeFlatResult(f *testing.F) {
	f.Add(flatResultBytes(0.5, "hint", "a", "b"))
	f.Add(flatResultBytes(-1, ""))
	f.Add([]byte{2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeFlatResult(b); err == nil {
			checkAccepted(t, r)
		}
	})
}
