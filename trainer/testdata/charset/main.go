// Command charset is the verifier of the task set the trainer's tests
// generate: a task's answer is a set of characters, and a reply passes
// when it is made of those characters only.
//
//   - no task in the input: abstain;
//   - an empty reply (after trimming spaces): -1;
//   - every character of the reply in the answer: +1;
//   - else the share s of its characters in the answer, as s - 1 (in
//     [-1, 0)): partial credit, so that the group comparisons of a
//     rollout's samples have a signal before any sample passes.
package main

import (
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func main() {}

func score(in *rewards.Input) rewards.Result {
	if in.Task == nil {
		return rewards.Abstain("not a task rollout")
	}
	allowed := in.AnswerText()
	reply := strings.TrimSpace(in.Action.Content)
	if reply == "" {
		return rewards.Score(-1).WithReason("empty reply")
	}
	in_, all := 0, 0
	for _, r := range reply {
		all++
		if strings.ContainsRune(allowed, r) {
			in_++
		}
	}
	if in_ == all {
		return rewards.Score(1)
	}
	return rewards.Score(float64(in_)/float64(all) - 1)
}
