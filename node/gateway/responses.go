package gateway

import (
	"slices"

	"github.com/clawmesh/clawmesh/internal/core"
)

// maxConversations bounds how many Responses conversations the gateway
// remembers for previous_response_id: the most recent ones, each the
// messages of one recorded call and its reply (their strings shared with
// the steps, not copied).
const maxConversations = 1024

// conversations remembers, by upstream response id, the whole conversation
// a Responses call ended with, so that a later call that names it as
// previous_response_id (and sends only what it adds) is recorded, and
// matched to its session, with its whole context.
type conversations struct {
	byID  map[string][]core.Message
	order []string // oldest first
}

// add remembers the conversation of a recorded Responses step.
func (c *conversations) add(step *core.Step) {
	if step.API != core.APIResponses || step.Response.ID == "" || len(step.Response.Choices) == 0 {
		return
	}
	if c.byID == nil {
		c.byID = make(map[string][]core.Message)
	}
	id := step.Response.ID
	if _, ok := c.byID[id]; !ok {
		c.order = append(c.order, id)
	}
	msgs := slices.Clip(step.Request.Messages)
	c.byID[id] = append(msgs, step.Response.Choices[0].Message)
	for len(c.order) > maxConversations {
		delete(c.byID, c.order[0])
		c.order = c.order[1:]
	}
}

// join returns the whole context of a call that continues the response
// prev with msgs, and whether prev was known. As the Responses API does,
// the earlier call's instructions are not carried over: the system
// messages are this call's.
func (c *conversations) join(prev string, msgs []core.Message) ([]core.Message, bool) {
	before, ok := c.byID[prev]
	if !ok {
		return msgs, false
	}
	sys := leadingSystem(msgs)
	out := make([]core.Message, 0, len(before)+len(msgs))
	out = append(out, msgs[:sys]...)
	out = append(out, before[leadingSystem(before):]...)
	return append(out, msgs[sys:]...), true
}

func leadingSystem(msgs []core.Message) int {
	n := 0
	for n < len(msgs) && msgs[n].Role == core.RoleSystem {
		n++
	}
	return n
}
