package tasks

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDecodeLine(t *testing.T) {
	good := `{"id":"a1","messages":[{"role":"user","content":"2+2?"}],"tools":[{"name":"calc","parameters":{"type":"object"}}],"answer":4,"meta":{"max_tokens":8,"level":"easy"}}`
	task, err := DecodeLine([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if task.ID != "a1" || string(task.Answer) != "4" || len(task.Tools) != 1 || task.Settings(16).MaxTokens != 8 || task.Settings(16).MaxTurns != 4 {
		t.Fatalf("decoded %+v, settings %+v", task, task.Settings(16))
	}
	bad := map[string]string{
		"not json":       `{"id":`,
		"unknown field":  `{"id":"a","messages":[{"role":"user","content":"x"}],"answr":1}`,
		"no id":          `{"messages":[{"role":"user","content":"x"}]}`,
		"no messages":    `{"id":"a","messages":[]}`,
		"bad role":       `{"id":"a","messages":[{"role":"robot","content":"x"}]}`,
		"meta not obj":   `{"id":"a","messages":[{"role":"user","content":"x"}],"meta":[1]}`,
		"negative max":   `{"id":"a","messages":[{"role":"user","content":"x"}],"meta":{"max_tokens":-1}}`,
		"trailing":       `{"id":"a","messages":[{"role":"user","content":"x"}]} {}`,
		"control in id":  "{\"id\":\"a\\u0001\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
		"tool no name":   `{"id":"a","messages":[{"role":"user","content":"x"}],"tools":[{}]}`,
		"long id":        `{"id":"` + strings.Repeat("x", MaxID+1) + `","messages":[{"role":"user","content":"x"}]}`,
		"not utf8":       "{\"id\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
		"meta bad count": `{"id":"a","messages":[{"role":"user","content":"x"}],"meta":{"max_turns":"x"}}`,
	}
	for name, line := range bad {
		if _, err := DecodeLine([]byte(line)); !errors.Is(err, ErrTask) {
			t.Errorf("%s: err %v, want ErrTask", name, err)
		}
	}
}

func genSet(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"id\":\"t%03d\",\"messages\":[{\"role\":\"user\",\"content\":\"item %d\"}],\"answer\":\"x\"}\n\n", i, i)
	}
	return b.String()
}

func TestParseAndSplit(t *testing.T) {
	s, err := Parse(strings.NewReader(genSet(100)))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Tasks) != 100 || len(s.Hash) != 64 {
		t.Fatalf("%d tasks, hash %q", len(s.Tasks), s.Hash)
	}
	// The canonical form hashes the same whatever the file's spacing.
	s2, err := Parse(strings.NewReader(strings.ReplaceAll(genSet(100), "\n\n", "\n")))
	if err != nil || s2.Hash != s.Hash {
		t.Fatalf("hash %s vs %s (%v)", s2.Hash, s.Hash, err)
	}
	train, held := s.Split(0.2)
	if len(train) != 80 || len(held) != 20 {
		t.Fatalf("split %d/%d", len(train), len(held))
	}
	again, held2 := s.Split(0.2)
	if len(again) != len(train) || held2[0].ID != held[0].ID {
		t.Fatal("the split is not deterministic")
	}
	inHeld := map[string]bool{}
	for _, h := range held {
		inHeld[h.ID] = true
	}
	for _, tr := range train {
		if inHeld[tr.ID] {
			t.Fatalf("%s in both splits", tr.ID)
		}
	}
	// The split of earlier versions is still drawn the same.
	_, legacy := s.LegacySplit(0.2)
	for _, h := range legacy {
		if !HeldOut(s.Hash, h.ID, 0.2) {
			t.Fatalf("%s held out but HeldOut says no", h.ID)
		}
	}
	// Tiny sets keep one task on each side.
	two, _ := Parse(strings.NewReader(genSet(2)))
	if tr, h := two.Split(0.01); len(tr) != 1 || len(h) != 1 {
		t.Fatalf("2-task split %d/%d", len(tr), len(h))
	}
	if tr, h := two.Split(0); len(tr) != 2 || len(h) != 0 {
		t.Fatalf("no holdout: %d/%d", len(tr), len(h))
	}

	if tr, h := two.LegacySplit(0.01); len(tr) != 1 || len(h) != 1 {
		t.Fatalf("2-task legacy split %d/%d", len(tr), len(h))
	}

	for name, in := range map[string]string{
		"duplicate": genSet(2) + genSet(1),
		"one task":  genSet(1),
		"bad line":  genSet(2) + "{\n",
	} {
		if _, err := Parse(strings.NewReader(in)); !errors.Is(err, ErrTask) {
			t.Errorf("%s: %v, want ErrTask", name, err)
		}
	}
}

// FuzzTaskLine checks that the decoder never panics, and that a line it
// accepts re-encodes to a line it accepts with the same meaning.
func FuzzTaskLine(f *testing.F) {
	f.Add([]byte(`{"id":"a1","messages":[{"role":"user","content":"2+2?"}],"answer":4,"meta":{"max_tokens":8}}`))
	f.Add([]byte(`{"id":"b","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"tools":[{"name":"calc"}],"answer":{"x":[1,2]}}`))
	f.Add([]byte(`{"id":"c","messages":[{"role":"user"}],"answer":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		task, err := DecodeLine(line)
		if err != nil {
			if !errors.Is(err, ErrTask) {
				t.Fatalf("error %v does not wrap ErrTask", err)
			}
			return
		}
		other := "x"
		if task.ID == other {
			other = "y"
		}
		b, err := json.Marshal(task)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Parse(strings.NewReader(string(b) + "\n" + `{"id":"` + other + `","messages":[{"role":"user","content":"x"}]}`))
		if err != nil {
			t.Fatalf("a decoded task does not parse again: %v", err)
		}
		if s.Tasks[0].ID != task.ID || string(s.Tasks[0].Answer) != string(task.Answer) {
			t.Fatalf("round trip changed the task: %+v vs %+v", s.Tasks[0], task)
		}
	})
}

// TestSplitSize: the held-out split holds round(holdout·n) tasks, whatever
// the set's hash, where the per-task draw of earlier versions held out 11
// or 23 of 56 tasks for 0.25; a task's side does not depend on the
// others' order in the file beyond the hash.
func TestSplitSize(t *testing.T) {
	for _, c := range []struct {
		n    int
		frac float64
		want int
	}{{56, 0.25, 14}, {56, 0.1, 6}, {10, 0.25, 3}, {10, 0.24, 2}, {3, 0.01, 1}, {3, 0.99, 2}, {2, 0.5, 1}, {100, 0, 0}} {
		for seed := range 20 {
			var b strings.Builder
			for i := range c.n {
				fmt.Fprintf(&b, "{\"id\":\"s%d-%d\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}\n", seed, i)
			}
			s, err := Parse(strings.NewReader(b.String()))
			if err != nil {
				t.Fatal(err)
			}
			train, held := s.Split(c.frac)
			if len(held) != c.want || len(train)+len(held) != c.n {
				t.Fatalf("%d tasks, holdout %v (set %d): %d/%d, want %d held out", c.n, c.frac, seed, len(train), len(held), c.want)
			}
		}
	}
}
