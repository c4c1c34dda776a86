// Command verifier is a verifier plugin for the tests of task rollouts: it
// reads the task's answer from its input (input.task, ABI addition) and
// compares the reply with it.
//
//   - no task in the input (a live step): abstain;
//   - an answer that is a JSON number: +1 if the reply reads as that
//     number, else -1;
//   - any other answer: +1 if the reply, trimmed, is the answer's text,
//     else -1; the label "task=<id>" says which task it checked.
package main

import (
	"strconv"
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func main() {}

func score(in *rewards.Input) rewards.Result {
	if in.Task == nil {
		return rewards.Abstain("not a task rollout")
	}
	want, got := in.AnswerText(), strings.TrimSpace(in.Action.Content)
	label := "task=" + in.Task.ID
	if n, err := strconv.ParseFloat(string(in.Task.Answer), 64); err == nil {
		if g, err := strconv.ParseFloat(got, 64); err == nil && g == n {
			return rewards.Score(1).WithLabels(label)
		}
		return rewards.Score(-1).WithLabels(label)
	}
	if got == want {
		return rewards.Score(1).WithLabels(label)
	}
	return rewards.Score(-1).WithLabels(label)
}
