package reward

// The files `clawmesh reward new --verifier` writes in place of the
// scaffold's main.go, test and README.

const verifierMain = `// Command %s is a clawmesh verifier plugin: it scores a reply to a task
// of a task set against the task's answer (input.task), for
// "clawmesh tasks add FILE --reward %s.wasm".
//
// The answer is compared with the reply trimmed of spaces: a number
// answer passes a reply that reads as the same number, any other answer
// a reply equal to its text. A passing reply scores +1, any other -1
// (the trainers count a positive score as a pass). A step with no task
// (a live step) abstains.
package main

import (
	"strconv"
	"strings"

	rewards "%s"
)

func init() { rewards.Register(score) }

func score(in *rewards.Input) rewards.Result {
	if in.Task == nil {
		return rewards.Abstain("not a task rollout")
	}
	got := strings.TrimSpace(in.Action.Content)
	if want, err := strconv.ParseFloat(string(in.Task.Answer), 64); err == nil {
		if g, err := strconv.ParseFloat(got, 64); err == nil && g == want {
			return rewards.Score(1)
		}
		return rewards.Score(-1).WithReason("not the number " + string(in.Task.Answer))
	}
	if got == strings.TrimSpace(in.AnswerText()) {
		return rewards.Score(1)
	}
	return rewards.Score(-1).WithReason("not the answer")
}

// main is not called: the trainer calls the exports the kit defines.
func main() {}
`

const verifierTest = `package main

import (
	"encoding/json"
	"testing"

	rewards "%s"
)

func verdict(t *testing.T, answer, reply string) float64 {
	t.Helper()
	in := []byte(` + "`" + `{"context":[{"role":"user","content":"q"}],"action":{"role":"assistant","content":` + "`" + ` + reply + ` + "`" + `},"next_state":null,"meta":{"turn":"main"},"task":{"id":"t1","answer":` + "`" + ` + answer + ` + "`" + `}}` + "`" + `)
	var res rewards.Result
	if err := json.Unmarshal(rewards.Handle(in), &res); err != nil {
		t.Fatal(err)
	}
	if res.Score == nil {
		t.Fatalf("abstained: %%s", res.Reason)
	}
	return *res.Score
}

func TestScore(t *testing.T) {
	for _, c := range []struct {
		answer, reply string
		want          float64
	}{
		{` + "`" + `4` + "`" + `, ` + "`" + `" 4.0 "` + "`" + `, 1},
		{` + "`" + `4` + "`" + `, ` + "`" + `"five"` + "`" + `, -1},
		{` + "`" + `"Paris"` + "`" + `, ` + "`" + `"Paris\n"` + "`" + `, 1},
		{` + "`" + `"Paris"` + "`" + `, ` + "`" + `"Lyon"` + "`" + `, -1},
	} {
		if got := verdict(t, c.answer, c.reply); got != c.want {
			t.Errorf("answer %%s, reply %%s: %%v, want %%v", c.answer, c.reply, got, c.want)
		}
	}
}
`

const verifierReadme = "# %s\n\nA clawmesh verifier plugin: it scores a rollout of a task set against the task's answer.\n\n" +
	"```sh\n" +
	"go test ./...                                                # the logic, natively\n" +
	"clawmesh reward build .                                      # -> %s.wasm\n" +
	"clawmesh tasks add tasks.jsonl --reward %s.wasm --data DIR   # on a trainer\n" +
	"```\n\nIts input is a step with `task` added (`{\"id\", \"answer\", \"meta\"}`, see the kit's ABI.md); a live step has none.\n"
