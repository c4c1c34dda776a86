package scrub

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
)

// TestScrubJSONL: one table per session across lines, and errors that name
// the line.
func TestScrubJSONL(t *testing.T) {
	sc, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	line := func(id, sess, text string) string {
		s := core.Step{ID: core.StepID(id), SessionID: core.SessionID(sess), Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
			Request: core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: text}}}}
		b, err := json.Marshal(core.ExportedStep{Schema: core.SchemaVersion, Step: s})
		if err != nil {
			t.Fatal(err)
		}
		return string(b) + "\n"
	}
	in := line("s1", "A", "bob@example.org") + "\n" + line("s2", "A", "ann@example.org, bob@example.org") + line("s3", "B", "ann@example.org")
	var out bytes.Buffer
	counts, err := sc.ScrubJSONL(context.Background(), strings.NewReader(in), &out, &StepOptions{Key: testKey}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e core.ExportedStep
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		got = append(got, e.Request.Messages[0].Content)
	}
	want := []string{"<EMAIL_1>", "<EMAIL_2>, <EMAIL_1>", "<EMAIL_1>"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("scrubbed %q, want %q", got, want)
	}
	if counts[Email] != 4 {
		t.Errorf("counts %v, want 4 e-mail addresses replaced", counts)
	}

	for _, c := range []struct{ in, want string }{
		{in + "{\"id\":\"x\"}\n", "line 5"},
		{"not json\n", "line 1: not a step"},
		{strings.Replace(line("s1", "A", "x"), core.SchemaVersion, "clawmesh.step/v0", 1), "line 1: schema"},
		{line("s1", "A", strings.Repeat("x", 2000)), "a line over"},
	} {
		_, err := sc.ScrubJSONL(context.Background(), strings.NewReader(c.in), &bytes.Buffer{}, &StepOptions{Key: testKey}, 1024)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.40q: %v, want an error naming %q", c.in, err, c.want)
		}
	}
}
