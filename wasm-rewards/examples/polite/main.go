// Command polite is an example reward plugin: it rewards a step when the
// user's next message thanks the assistant and penalizes one that the user
// answers with impatience.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o polite.wasm
package main

import (
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func score(in *rewards.Input) rewards.Result {
	next := strings.ToLower(in.NextUser())
	if next == "" {
		return rewards.Abstain("no user reply")
	}
	for _, w := range []string{"thanks", "thank you", "great", "perfect"} {
		if strings.Contains(next, w) {
			return rewards.Score(0.5).WithLabels("thanked")
		}
	}
	for _, w := range []string{"hurry up", "useless", "come on"} {
		if strings.Contains(next, w) {
			return rewards.Score(-0.5).WithLabels("impatient")
		}
	}
	return rewards.Abstain("neither thanked nor impatient")
}

func main() {}
