package main

import (
	"encoding/json"
	"os/exec"
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
