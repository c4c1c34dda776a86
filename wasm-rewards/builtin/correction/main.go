// Command correction is the built-in plugin that reads the user's next
// message: a correction ("no, ...", "that's wrong", "I said ...") or the
// same question asked again scores negative; the user moving on to
// something new scores mildly positive; anything else abstains, and so does
// explicit feedback (/good, /bad, a thumbs up or down), which is the
// feedback plugin's to score.
package main

import (
	"strings"
	"unicode"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(Score) }

func main() {}

// Scores given for each verdict.
const (
	corrected = -0.8
	reasked   = -0.6
	movedOn   = 0.2
)

var openers = []string{
	"no,", "no.", "no!", "no ", "nope", "wrong", "incorrect", "that's wrong", "that is wrong",
	"that's not", "that is not", "this is wrong", "this is not", "not what i", "i said", "i asked",
	"i meant", "i told you", "you didn't", "you did not", "you forgot", "you missed", "you ignored",
	"still not", "still doesn't", "still does not", "still broken", "still failing", "try again",
	"again,", "why did you", "that didn't", "that did not", "it didn't", "it did not", "doesn't work",
	"does not work", "didn't work", "not working", "stop", "don't", "do not", "please don't",
	"please do not", "why would you", "undo", "revert",
}

var anywhere = []string{
	"that's wrong", "that is wrong", "that's not what", "not what i asked", "not what i meant",
	"i already said", "i already told you", "as i said", "like i said", "you misunderstood",
	"read my message", "wrong answer", "still wrong",
}

var thanks = []string{"thanks", "thank you", "great", "perfect", "works now", "that worked", "nice", "ok,", "okay,", "cool"}

// Score scores one step.
func Score(in *rewards.Input) rewards.Result {
	if in.Meta.Turn == "side" {
		return rewards.Abstain("side turn")
	}
	next := strings.TrimSpace(in.NextUser())
	if next == "" {
		return rewards.Abstain("no user reply")
	}
	low := strings.ToLower(next)
	if explicitFeedback(low) {
		return rewards.Abstain("explicit feedback")
	}
	for _, o := range openers {
		if strings.HasPrefix(low, o) {
			return rewards.Score(corrected).WithReason("corrected: " + rewards.Trim(next, 120)).WithLabels("correction")
		}
	}
	for _, a := range anywhere {
		if strings.Contains(low, a) {
			return rewards.Score(corrected).WithReason("corrected: " + rewards.Trim(next, 120)).WithLabels("correction")
		}
	}
	prev := in.LastUser()
	sim := similarity(prev, next)
	if prev != "" && sim >= 0.7 {
		return rewards.Score(reasked).WithReason("asked again").WithLabels("re-ask")
	}
	for _, t := range thanks {
		if strings.HasPrefix(low, t) {
			return rewards.Score(movedOn).WithReason("user moved on").WithLabels("moved-on")
		}
	}
	if sim <= 0.2 {
		return rewards.Score(movedOn).WithReason("user moved on").WithLabels("moved-on")
	}
	return rewards.Abstain("unsure")
}

// explicitFeedback reports whether the (lower-cased) next message is what
// the feedback plugin scores: a /good or /bad command, or a short message
// with a thumbs up or down.
func explicitFeedback(low string) bool {
	for _, cmd := range []string{"/good", "/bad"} {
		if low == cmd || strings.HasPrefix(low, cmd+" ") || strings.HasPrefix(low, cmd+"\n") {
			return true
		}
	}
	return (strings.Contains(low, "👍") || strings.Contains(low, "👎")) && len([]rune(low)) <= 80
}

// similarity is the Jaccard index of the two texts' word sets.
func similarity(a, b string) float64 {
	wa, wb := words(a), words(b)
	if len(wa) == 0 || len(wb) == 0 {
		return 0
	}
	inter := 0
	for w := range wa {
		if wb[w] {
			inter++
		}
	}
	return float64(inter) / float64(len(wa)+len(wb)-inter)
}

func words(s string) map[string]bool {
	out := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		out[w] = true
	}
	return out
}
