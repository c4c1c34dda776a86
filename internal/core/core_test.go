package core

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStateJSONRoundTrip(t *testing.T) {
	for s := StateUnknown; s <= MaxState; s++ {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var got State
		if err := json.Unmarshal(b, &got); err != nil || got != s {
			t.Errorf("%v: round trip gave %v, %v", s, got, err)
		}
	}
	if len(States) != int(MaxState) {
		t.Errorf("States lists %d states, want every one of the %d", len(States), MaxState)
	}
	if st, err := ParseState("failed"); err != nil || st != StateFailed {
		t.Errorf(`ParseState("failed") = %v, %v`, st, err)
	}
	var st State
	if err := json.Unmarshal([]byte(`"sideways"`), &st); err == nil {
		t.Error("an unknown state name must be an error")
	}
	if _, err := ParseState("unknown"); err == nil {
		t.Error("ParseState must not accept the unset state as a filter")
	}
}

func TestValidate(t *testing.T) {
	good := func() *Step {
		return &Step{ID: "a", SessionID: "s", Turn: TurnMain, API: APIChat, State: StateOpen,
			Request: Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}}
	}
	if err := good().Validate(); err != nil {
		t.Fatal(err)
	}
	v := 1.5
	for name, mut := range map[string]func(*Step){
		"no id":       func(s *Step) { s.ID = "" },
		"no session":  func(s *Step) { s.SessionID = "" },
		"turn":        func(s *Step) { s.Turn = "middle" },
		"api":         func(s *Step) { s.API = "soap" },
		"state":       func(s *Step) { s.State = StateUnknown },
		"no messages": func(s *Step) { s.Request.Messages = nil },
		"role":        func(s *Step) { s.Request.Messages[0].Role = "wizard" },
		"next role":   func(s *Step) { s.NextState = &NextState{Messages: []Message{{Role: "x"}}} },
		"reward":      func(s *Step) { s.Reward = &Reward{Value: &v} },
	} {
		s := good()
		mut(s)
		if err := s.Validate(); err == nil || !strings.HasPrefix(err.Error(), "core: ") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
