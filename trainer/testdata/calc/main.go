// Command calc is the tool simulator of the trainer's tests: a plugin of
// the reward ABI that answers the tool call in its action (hint: the
// tool's output) instead of scoring. It knows one tool, add(a, b): the
// output is a + b; any other tool, or arguments that are not two numbers,
// give an error (label "error").
package main

import (
	"encoding/json"
	"strconv"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(answer) }

func main() {}

func answer(in *rewards.Input) rewards.Result {
	if len(in.Action.ToolCalls) != 1 {
		return rewards.Abstain("no tool call")
	}
	call := in.Action.ToolCalls[0]
	if call.Name != "add" {
		return rewards.Abstain("unknown tool").WithHint("error: no tool " + strconv.Quote(call.Name)).WithLabels("error")
	}
	var args struct{ A, B *float64 }
	if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil || args.A == nil || args.B == nil {
		return rewards.Abstain("bad arguments").WithHint("error: add takes two numbers a and b").WithLabels("error")
	}
	return rewards.Abstain("tool output").WithHint(strconv.FormatFloat(*args.A+*args.B, 'f', -1, 64))
}
