// Command toolerror is the built-in plugin that scores a step negative when
// a tool call it made failed: a tool result flagged is_error, a traceback, a
// non-zero exit code, "command not found" and the like. The error, trimmed,
// becomes the hint for on-policy distillation.
package main

import (
	"strconv"
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(Score) }

func main() {}

const failed = -0.5

// Anywhere in a result.
var signatures = []string{
	"traceback (most recent call last)", "command not found", "no such file or directory",
	"permission denied", "segmentation fault", "syntaxerror:", "modulenotfounderror",
	"is not recognized as an internal or external command", "goroutine 1 [running]",
}

// At the start of a result (or of one of its first lines).
var leaders = []string{"error", "err:", "fatal:", "fatal error", "exception", "panic:", "failed", "failure", "bash:", "sh:", "zsh:"}

// Score scores one step.
func Score(in *rewards.Input) rewards.Result {
	results := in.ToolResults()
	if len(results) == 0 {
		return rewards.Abstain("no tool results")
	}
	names := map[string]string{}
	for _, c := range in.Action.ToolCalls {
		names[c.ID] = c.Name
	}
	for _, m := range results {
		if why := failure(m); why != "" {
			name := names[m.ToolCallID]
			if name == "" {
				name = m.Name
			}
			what := "a tool call"
			if name != "" {
				what = "the " + name + " call"
			}
			hint := what + " failed: " + rewards.Trim(m.Content, 400)
			return rewards.Score(failed).WithReason(why).WithHint(hint).WithLabels("tool-error")
		}
	}
	return rewards.Abstain("tool calls succeeded")
}

// failure says why a tool result looks like an error, or "".
func failure(m rewards.Message) string {
	if m.IsError {
		return "tool result flagged is_error"
	}
	low := strings.ToLower(m.Content)
	for _, s := range signatures {
		if strings.Contains(low, s) {
			return "tool output contains " + strconv.Quote(s)
		}
	}
	lines := strings.Split(low, "\n")
	if len(lines) > 5 {
		lines = lines[:5]
	}
	for _, l := range lines {
		l = strings.TrimSpace(l)
		for _, p := range leaders {
			if strings.HasPrefix(l, p) {
				return "tool output starts with " + strconv.Quote(p)
			}
		}
	}
	if code, ok := exitCode(low); ok && code != 0 {
		return "exit code " + strconv.Itoa(code)
	}
	return ""
}

// exitCode finds "exit code N", "exit status N", "exited with code N" or
// "returncode: N".
func exitCode(s string) (int, bool) {
	for _, key := range []string{"exit code", "exit status", "exited with code", "exit_code", "returncode", "return code"} {
		i := strings.Index(s, key)
		if i < 0 {
			continue
		}
		rest := strings.TrimLeft(s[i+len(key):], " :=\"'")
		j := 0
		for j < len(rest) && (rest[j] >= '0' && rest[j] <= '9' || j == 0 && rest[j] == '-') {
			j++
		}
		if n, err := strconv.Atoi(rest[:j]); err == nil {
			return n, true
		}
	}
	return 0, false
}
