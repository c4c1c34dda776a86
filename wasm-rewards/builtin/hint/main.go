// Command hint is the built-in plugin that extracts directives from the
// user's next message ("you should have...", "don't...", "instead...",
// "check the file first") as a hint for on-policy distillation. It abstains
// on the score: a directive says how to do better, not how good the step was.
package main

import (
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(Score) }

func main() {}

var starts = []string{
	"you should", "you need to", "you must", "you have to", "you could have", "you forgot to",
	"don't", "do not", "dont", "never", "always", "instead", "next time", "make sure", "remember to",
	"please use", "please don't", "please do not", "please check", "please run", "use ", "check ",
	"try ", "first ", "stop ", "avoid ", "prefer ", "run ", "read ", "look at ", "rather ",
}

var inside = []string{"should have", "instead of", "instead,", " first.", " first,", "next time", "make sure", "rather than", "don't ", "do not "}

// Score extracts the hint of one step.
func Score(in *rewards.Input) rewards.Result {
	next := in.NextUser()
	if strings.TrimSpace(next) == "" {
		return rewards.Abstain("no user reply")
	}
	for _, cmd := range []string{"/good", "/bad"} {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(next), cmd); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\n') {
			next = rest
		}
	}
	var picked []string
	for _, s := range sentences(next) {
		if directive(s) {
			picked = append(picked, s)
		}
	}
	if len(picked) == 0 {
		return rewards.Abstain("no directive in the next message")
	}
	return rewards.Abstain("hint only").WithHint(rewards.Trim(strings.Join(picked, " "), 500)).WithLabels("directive")
}

func directive(s string) bool {
	low := strings.ToLower(s)
	for _, p := range []string{"no, ", "no ", "ok, ", "okay, ", "but ", "also ", "and ", "please "} {
		if strings.HasPrefix(low, p) {
			if p == "please " && directive(s[len(p):]) {
				return true
			}
			low = low[len(p):]
		}
	}
	for _, p := range starts {
		if strings.HasPrefix(low, p) {
			return true
		}
	}
	for _, p := range inside {
		if strings.Contains(low, p) {
			return true
		}
	}
	return false
}

// sentences splits text at sentence ends and line breaks.
func sentences(s string) []string {
	var out []string
	start := 0
	flush := func(end int) {
		if t := strings.TrimSpace(s[start:end]); t != "" {
			out = append(out, t)
		}
		start = end
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\n':
			flush(i)
		case '.', '!', '?', ';':
			if i+1 == len(s) || s[i+1] == ' ' || s[i+1] == '\n' {
				flush(i + 1)
			}
		}
	}
	flush(len(s))
	return out
}
