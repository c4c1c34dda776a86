// Command judge is the built-in process reward model: it shows the node's
// LLM the turn and what followed it, asks m times (meta.config "votes",
// default 3) whether the turn was good, and returns the majority vote: +1,
// -1 or 0, with 0 on a tie. It needs judge permission.
package main

import (
	"fmt"
	"strconv"
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(Score) }

func main() {}

const defaultVotes = 3

// Score judges one step.
func Score(in *rewards.Input) rewards.Result {
	if in.NextState == nil {
		return rewards.Abstain("no next state to judge by")
	}
	m := defaultVotes
	if v, err := strconv.Atoi(in.Meta.Config["votes"]); err == nil && v >= 1 && v <= 15 {
		m = v
	}
	prompt := Prompt(in)
	counts := map[int]int{}
	var failures int
	for i := 0; i < m; i++ {
		reply, err := rewards.Judge(prompt)
		if err != nil {
			failures++
			continue
		}
		v, ok := Parse(reply)
		if !ok {
			failures++
			continue
		}
		counts[v]++
	}
	if failures == m {
		return rewards.Abstain(fmt.Sprintf("judge gave no usable vote in %d tries", m))
	}
	v := Majority(counts)
	tally := fmt.Sprintf("votes +1:%d -1:%d 0:%d", counts[1], counts[-1], counts[0])
	return rewards.Score(float64(v)).WithReason(tally).WithLabels("judge")
}

// Majority returns the vote with the most counts; a tie for first is 0.
func Majority(counts map[int]int) int {
	best, bestN, tie := 0, -1, false
	for _, v := range []int{1, -1, 0} {
		switch n := counts[v]; {
		case n > bestN:
			best, bestN, tie = v, n, false
		case n == bestN:
			tie = true
		}
	}
	if tie {
		return 0
	}
	return best
}

// Parse reads the vote from a judge reply: the last "Score: N" (or
// \boxed{N}) with N one of 1, +1, -1, 0.
func Parse(reply string) (int, bool) {
	low := strings.ToLower(reply)
	best, found := 0, false
	for _, key := range []string{"score:", "\\boxed{"} {
		i := strings.LastIndex(low, key)
		if i < 0 {
			continue
		}
		rest := strings.TrimSpace(low[i+len(key):])
		for _, c := range []struct {
			s string
			v int
		}{{"+1", 1}, {"-1", -1}, {"1", 1}, {"0", 0}} {
			if strings.HasPrefix(rest, c.s) {
				best, found = c.v, true
				break
			}
		}
		if found {
			return best, true
		}
	}
	return 0, false
}

// Prompt shows the judge the turn and its next state.
func Prompt(in *rewards.Input) string {
	var b strings.Builder
	b.WriteString("You are judging one turn of an AI assistant's conversation by what happened next.\n\n")
	b.WriteString("## Conversation so far (most recent last)\n")
	ctx := in.Context
	if len(ctx) > 6 {
		ctx = ctx[len(ctx)-6:]
	}
	for _, m := range ctx {
		writeMsg(&b, m)
	}
	b.WriteString("\n## The assistant's turn being judged\n")
	writeMsg(&b, in.Action)
	b.WriteString("\n## What followed (the next state)\n")
	if len(in.NextState) == 0 {
		b.WriteString("(nothing)\n")
	}
	for _, m := range in.NextState {
		writeMsg(&b, m)
	}
	b.WriteString("\nDid the assistant's turn move the user's goal forward? Judge from the next state: " +
		"a satisfied user or a successful tool result is good; a correction, a repeated request or an " +
		"error is bad. Think briefly, then end with exactly one line: \"Score: 1\" (good), " +
		"\"Score: -1\" (bad) or \"Score: 0\" (unclear).\n")
	return b.String()
}

func writeMsg(b *strings.Builder, m rewards.Message) {
	fmt.Fprintf(b, "[%s] %s\n", m.Role, rewards.Trim(m.Content, 2000))
	for _, c := range m.ToolCalls {
		fmt.Fprintf(b, "[%s calls %s] %s\n", m.Role, c.Name, rewards.Trim(c.Arguments, 500))
	}
}
