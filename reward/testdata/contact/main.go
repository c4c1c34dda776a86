// Command contact is a reward plugin for the tests of replays: its verdict
// reads the personal data a device scrubs before a step leaves it.
//
//   - the assistant's reply gives an e-mail address: score +1, hint "write
//     to <the address>";
//   - it gives none: score -1;
//   - meta.config["sign"] = "-1" flips the sign, so its verdict depends on
//     its config;
//   - a reply of exactly "trap" makes it panic on another goroutine (a
//     failure, not a verdict).
package main

import (
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func main() {}

func score(in *rewards.Input) rewards.Result {
	if in.Action.Content == "trap" {
		done := make(chan bool)
		go func() { panic("trap asked for") }()
		<-done
	}
	sign := 1.0
	if in.Meta.Config["sign"] == "-1" {
		sign = -1
	}
	if addr := address(in.Action.Content); addr != "" {
		return rewards.Score(sign).WithHint("write to " + addr).WithLabels("address")
	}
	return rewards.Score(-sign).WithLabels("no address")
}

// address returns the first word of s that looks like an e-mail address.
func address(s string) string {
	for _, w := range strings.Fields(s) {
		w = strings.Trim(w, ".,;:!?()<>\"'")
		at := strings.IndexByte(w, '@')
		if at > 0 && strings.Contains(w[at+1:], ".") {
			return w
		}
	}
	return ""
}
