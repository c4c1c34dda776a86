package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/node/nodebench"
)

// TestBenchSoak runs `clawmesh bench soak` briefly: every call answered,
// the node's RSS sampled over time, and the scorer's counters with it
// (conversations beyond --max-sessions are closed, then scored).
func TestBenchSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a node under load")
	}
	bin := buildBinary(t)
	out, err := exec.Command(bin, "bench", "soak", "--rate", "40", "--duration", "4s", "--idle", "8s", "--every", "1s",
		"--max-sessions", "10", "--json").Output()
	if err != nil {
		t.Fatalf("bench soak: %v\n%s", err, out)
	}
	var r nodebench.SoakResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("bench soak --json: %v\n%s", err, out)
	}
	if r.Sent == 0 || r.Answered != r.Sent || r.Failed != 0 {
		t.Fatalf("calls: %d sent, %d answered, %d failed", r.Sent, r.Answered, r.Failed)
	}
	if len(r.Samples) < 8 || r.RSSStart <= 0 || r.RSSPeak < r.RSSStart || r.RSSIdle <= 0 {
		t.Fatalf("RSS over time: %d samples, start %d, peak %d, idle %d", len(r.Samples), r.RSSStart, r.RSSPeak, r.RSSIdle)
	}
	for _, s := range r.Samples {
		if s.RSS <= 0 {
			t.Fatalf("a sample without the node's RSS: %+v", s)
		}
		if s.RSS > r.RSSPeak {
			t.Fatalf("a sample above the reported peak %d: %+v", r.RSSPeak, s)
		}
	}
	last := r.Samples[len(r.Samples)-1]
	if last.Scored == 0 || last.Scored > uint64(r.Answered) {
		t.Fatalf("scorer at the end: %+v (answered %d); want the closed steps scored", last, r.Answered)
	}
	t.Logf("%d calls, RSS %d → %d bytes, %d scored, backlog %d at the end", r.Answered, r.RSSStart, r.RSSPeak, last.Scored, last.Backlog)
}

// TestBenchIdle runs `clawmesh bench idle` briefly: a fresh node scores
// the calls, and its RSS (split into anonymous and file-backed), data
// directory and compilation cache (outside the data directory) are
// reported beside their goals.
func TestBenchIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a node")
	}
	bin := buildBinary(t)
	out, err := exec.Command(bin, "bench", "idle", "--calls", "3", "--wait", "1s", "--json").Output()
	if err != nil {
		t.Fatalf("bench idle: %v\n%s", err, out)
	}
	var r nodebench.FootprintResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("bench idle --json: %v\n%s", err, out)
	}
	if r.Calls != 3 || r.Scored != 3 || r.WaitS != 1 {
		t.Fatalf("calls %d, scored %d, wait %vs; want 3 calls scored and a 1s wait", r.Calls, r.Scored, r.WaitS)
	}
	if r.RSS <= 0 || r.RSSAnon <= 0 || r.RSSFile <= 0 || r.RSSAnon+r.RSSFile > r.RSS {
		t.Fatalf("RSS %d, anon %d, file %d", r.RSS, r.RSSAnon, r.RSSFile)
	}
	if r.GoalRSS != 100<<20 || r.GoalData != 20<<20 {
		t.Fatalf("goals: RSS %d, data %d", r.GoalRSS, r.GoalData)
	}
	// The built-ins' compiled code is megabytes: it is in the cache
	// directory, and the data directory holds only the pool and keys.
	if r.CacheBytes < 1<<20 || r.DataBytes <= 0 || r.DataBytes >= r.CacheBytes || !strings.Contains(r.CacheDir, "clawmesh") {
		t.Fatalf("data directory %d bytes, cache %d bytes in %s", r.DataBytes, r.CacheBytes, r.CacheDir)
	}
	if r.Met != (r.RSS <= r.GoalRSS && r.DataBytes <= r.GoalData) {
		t.Fatalf("met %v for %+v", r.Met, r)
	}
}
