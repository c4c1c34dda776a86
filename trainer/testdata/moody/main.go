// Command moody is a verifier of the trainer's tests whose behaviour a
// task's meta chooses:
//
//   - "trap": true: it traps (panics) on every call;
//   - "abstain": true: it abstains;
//   - "same": true: it scores every reply 0.5, so that every group of a
//     prompt's rollouts is flat (no learning signal);
//   - otherwise it scores as charset does: +1 for a reply made of the
//     answer's characters only, the share s of them as s - 1 else, -1 for
//     an empty reply.
package main

import (
	"encoding/json"
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func main() {}

func score(in *rewards.Input) rewards.Result {
	if in.Task == nil {
		return rewards.Abstain("not a task rollout")
	}
	var meta struct{ Trap, Abstain, Same bool }
	json.Unmarshal(in.Task.Meta, &meta)
	switch {
	case meta.Trap:
		panic("moody: a trap, as the task asks")
	case meta.Abstain:
		return rewards.Abstain("the task asks to abstain")
	case meta.Same:
		return rewards.Score(0.5)
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
