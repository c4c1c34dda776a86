package session_test

import (
	"fmt"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/session"
)

func ExampleTracker() {
	tr, err := session.New(session.Options{})
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	sys := core.Message{Role: core.RoleSystem, Content: "You are terse."}
	hi := core.Message{Role: core.RoleUser, Content: "hi"}
	hello := core.Message{Role: core.RoleAssistant, Content: "Hello."}

	a := tr.Begin(session.Call{Now: now, StepID: "a", Turn: core.TurnMain, Messages: []core.Message{sys, hi}})
	tr.Complete("a", []core.Message{hello}, now.Add(time.Second))
	fmt.Println(a.Session, a.Chain)

	b := tr.Begin(session.Call{Now: now.Add(time.Minute), StepID: "b", Turn: core.TurnMain,
		Messages: []core.Message{sys, hi, hello, {Role: core.RoleUser, Content: "bye"}}})
	fmt.Println(b.Session, b.Chain, b.Parent)
	for _, c := range b.Closures {
		fmt.Println(c.StepID, "next state:", c.NextState.Messages[0].Content)
	}
	// Output:
	// s-a c-a
	// s-a c-a a
	// a next state: bye
}
