package scrub

import (
	"fmt"
	"strings"
	"testing"
)

// agentPrompt is text like an agent's system prompt: rules and tool
// descriptions, nothing to find.
func agentPrompt() string {
	var sb strings.Builder
	for i := 0; sb.Len() < 40000; i++ {
		fmt.Fprintf(&sb, "Rule %d: when the user asks about topic %d, consult the notes in section %d, "+
			"cite them (see docs/section-%d.md: line %d), and keep the answer short unless asked otherwise; "+
			"use the tool `read_file` with {\"path\": \"src/module_%d.go\"} = the file.\n", i, i*7%97, i%13, i%5, i*3, i%17)
	}
	return sb.String()
}

func BenchmarkFindClean(b *testing.B) {
	s, _ := New(Options{})
	text := agentPrompt()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		s.Find(text)
	}
}

func BenchmarkFindDense(b *testing.B) {
	s, _ := New(Options{Names: []string{"Alice Zhou"}})
	text := strings.Repeat("Mail alice@example.org or call +44 20 7946 0958 from 10.0.4.17; DB_PASSWORD=hunter2 in /home/alice/.env. Alice Zhou said ok. ", 300)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		s.Find(text)
	}
}
