package share

import (
	"strings"
	"testing"
)

// TestPolicySummary: the line the node logs and `mesh init` prints says
// what leaves, by mode and tools.
func TestPolicySummary(t *testing.T) {
	for _, c := range []struct {
		p    Policy
		want []string
	}{
		{Policy{Mode: ModeNone, Tools: []string{"*"}}, []string{"nothing leaves", `mode = "none"`}},
		{Policy{Mode: ModeScored}, []string{"learning signal", `mode = "scored"`, "no tool result"}},
		{Policy{Mode: ModeAll, Tools: []string{"*"}}, []string{"every scored step", "every tool's results"}},
		{Policy{Mode: ModeScored, Tools: []string{"read", "exec"}}, []string{"the tools read, exec"}},
	} {
		got := c.p.Summary()
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: %q, want %q in it", c.p, got, w)
			}
		}
	}
}
