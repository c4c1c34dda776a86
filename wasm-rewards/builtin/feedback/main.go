// Command feedback is the built-in plugin that turns explicit feedback into
// a score: records from the node's feedback endpoint, or a next user message
// that is a thumbs up or down, "/good" or "/bad" (whose remaining text, if
// any, becomes the hint).
package main

import (
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(Score) }

func main() {}

// Score scores one step.
func Score(in *rewards.Input) rewards.Result {
	var sum float64
	var n int
	var notes []string
	for _, f := range in.Feedback {
		switch {
		case f.Score != nil:
			sum += *f.Score
			n++
		case thumbs(f.Text) != 0:
			sum += thumbs(f.Text)
			n++
		}
		if t := strings.TrimSpace(f.Text); t != "" && thumbs(t) == 0 {
			notes = append(notes, t)
		}
	}
	if n > 0 {
		r := rewards.Score(sum / float64(n)).WithReason("explicit feedback").WithLabels("feedback")
		if len(notes) > 0 {
			r = r.WithHint(rewards.Trim(strings.Join(notes, " "), 500))
		}
		return r
	}
	next := strings.TrimSpace(in.NextUser())
	lower := strings.ToLower(next)
	for _, c := range []struct {
		cmd   string
		score float64
	}{{"/good", 1}, {"/bad", -1}} {
		if lower == c.cmd || strings.HasPrefix(lower, c.cmd+" ") || strings.HasPrefix(lower, c.cmd+"\n") {
			r := rewards.Score(c.score).WithReason(c.cmd).WithLabels("feedback")
			if rest := strings.TrimSpace(next[len(c.cmd):]); rest != "" {
				r = r.WithHint(rewards.Trim(rest, 500))
			}
			return r
		}
	}
	if t := thumbs(next); t != 0 && len([]rune(next)) <= 80 {
		return rewards.Score(t).WithReason("thumbs in the next message").WithLabels("feedback")
	}
	return rewards.Abstain("no explicit feedback")
}

// thumbs is +1 for a thumbs up, -1 for a thumbs down, 0 for neither or both.
func thumbs(s string) float64 {
	up := strings.Contains(s, "👍")
	down := strings.Contains(s, "👎")
	switch {
	case up && !down:
		return 1
	case down && !up:
		return -1
	}
	return 0
}
