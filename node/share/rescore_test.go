package share

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
)

// fakeRescorer scores a step by what its user message says once
// scrubbed, and records the steps it was given.
type fakeRescorer struct{ seen []*core.Step }

func (f *fakeRescorer) Rescore(ctx context.Context, s *core.Step) core.Reward {
	f.seen = append(f.seen, s)
	user := s.Request.Messages[len(s.Request.Messages)-1].Content
	v := -1.0
	if strings.Contains(user, "@") {
		v = 1 // an address the scrubber missed
	}
	scores := []core.Score{{Plugin: "addr", Hash: "h2", Value: &v, Weight: 1, Reason: "saw " + user + " and ann@example.org", Labels: []string{"ann@example.org"}}}
	if strings.Contains(user, "hint") {
		// A hint the plugin made up, which scrubbing would change.
		scores = append(scores, core.Score{Plugin: "maker", Hash: "h3", Weight: 1, Hint: "call +1 415 555 0100"})
	}
	return core.Reward{Value: &v, Scores: scores}
}

// TestRescoredBatches: with a Rescorer, a batch carries the scores made on
// the steps as scrubbed, not those made before; a score whose hint
// scrubbing would change is left out; reasons and labels are scrubbed; a
// step whose new scores carry no signal is held.
func TestRescoredBatches(t *testing.T) {
	p := openPool(t)
	put(t, p,
		step("a", "s1", 0, "mail bob@example.com", scored(1, "")),
		step("b", "s1", 1, "a hint please, bob@example.com", scored(1, "")),
	)
	rs := &fakeRescorer{}
	o, err := New(Options{Pool: p, Key: testKey, Policy: Policy{Mode: ModeScored, MinRewardAbs: 0.5}, Rescore: rs, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := o.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.seen) != 2 || strings.Contains(rs.seen[0].Request.Messages[1].Content, "bob@") {
		t.Fatalf("rescored %d steps, the first %q: not the scrubbed ones", len(rs.seen), rs.seen[0].Request.Messages[1].Content)
	}
	b, err := batch.Verify(pr.Payload, pr.ID, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range b.Steps {
		rw := s.Reward
		if rw.Value == nil || *rw.Value != -1 || len(rw.Scores) != 1 || rw.Scores[0].Plugin != "addr" || *rw.Scores[0].Value != -1 {
			t.Fatalf("step %s left with %+v, want only addr's -1 made on the scrubbed step", s.ID, rw)
		}
		if sc := rw.Scores[0]; strings.Contains(sc.Reason, "@") || strings.Contains(sc.Labels[0], "@") {
			t.Errorf("reason %q, labels %q not scrubbed", sc.Reason, sc.Labels)
		}
		if !rw.At.Equal(t0.Truncate(time.Hour)) {
			t.Errorf("reward stamped %v", rw.At)
		}
	}
	if b.Header.Plugins[0] != "h2" || len(b.Header.Plugins) != 1 {
		t.Errorf("header plugins %v", b.Header.Plugins)
	}

	// Scores of no signal under the policy: the step is held.
	o2, _ := New(Options{Pool: p, Key: testKey, Policy: Policy{Mode: ModeScored, MinRewardAbs: 0.5}, Rescore: zeroRescorer{}})
	pr, err = o2.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if pr.Payload != nil || len(pr.Held) != 2 || !strings.Contains(pr.Held[0].Reason, "scored again once scrubbed") {
		t.Fatalf("held %+v, payload %d bytes", pr.Held, len(pr.Payload))
	}
}

type zeroRescorer struct{}

func (zeroRescorer) Rescore(ctx context.Context, s *core.Step) core.Reward {
	v := 0.1
	return core.Reward{Value: &v, Scores: []core.Score{{Plugin: "p", Hash: "h", Value: &v, Weight: 1}}}
}
