package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
)

// TestNodeSealsScrubbedBatches: a running node scores the steps recorded
// through its gateway and, as its sharing policy allows, seals them into
// outbox batches whose bytes decode to the steps scrubbed; the admin API
// previews the batch; a policy reloaded to none stops sealing.
func TestNodeSealsScrubbedBatches(t *testing.T) {
	n, base := startNode(t, fakeupstream.Script{Turns: []fakeupstream.Turn{
		{Text: "I will write to jane.doe@example.com now."},
		{Text: "Done."},
	}}, node.Config{
		Share:         share.Policy{Mode: share.ModeAll, Names: []string{"Falcon"}},
		ShareInterval: 20 * time.Millisecond,
		ScoreInterval: 20 * time.Millisecond,
	})
	chat := base + "/v1/chat/completions"
	post(t, chat, `{"model":"m","messages":[{"role":"user","content":"Mail jane.doe@example.com about Falcon; my key is AKIAIOSFODNN7ABCDEFG"}]}`, "X-Session-Done", "true")

	ctx := context.Background()
	var b *pool.Batch
	for deadline := time.Now().Add(20 * time.Second); b == nil; {
		bs, err := n.Pool().Batches(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(bs) > 0 {
			b = bs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no batch sealed in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	payload, err := n.Pool().Payload(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := batch.Verify(payload, b.ID, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Steps) != 1 {
		t.Fatalf("%d steps", len(got.Steps))
	}
	s := got.Steps[0]
	if u := s.Request.Messages[0].Content; u != "Mail <EMAIL_1> about <NAME_1>; my key is <API_KEY_1>" {
		t.Errorf("user message left as %q", u)
	}
	if a := s.Action().Content; a != "I will write to <EMAIL_1> now." {
		t.Errorf("reply left as %q", a)
	}
	if s.Response.Choices[0].Fidelity == core.FidelityExact {
		t.Error("a reply scrubbing changed kept its recorded tokens")
	}
	if !s.Timings.Start.Equal(s.Timings.Start.Truncate(time.Hour)) || s.Upstream != "" {
		t.Errorf("timings %v, upstream %q", s.Timings.Start, s.Upstream)
	}
	steps, _ := n.Pool().List(ctx, pool.Filter{State: core.StateBatched})
	if len(steps) != 1 || steps[0].ID != b.Steps[0] {
		t.Fatalf("batched steps %v, batch %v", steps, b.Steps)
	}

	// The admin API shows the sealed batch, as `clawmesh pool preview` does.
	c := &node.Client{Base: base, Token: n.AdminToken()}
	pv, err := c.Preview(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !pv.Sealed || pv.ID != b.ID || len(pv.Steps) != 1 || !strings.Contains(pv.Steps[0].Request.Messages[0].Content, "<EMAIL_1>") {
		t.Fatalf("preview %+v", pv)
	}

	// Sharing off: a new scored step stays scored.
	if err := n.ReloadShare(share.Policy{Mode: share.ModeNone}); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadShare(share.Policy{Mode: "sometimes"}); err == nil {
		t.Fatal("a bad policy was accepted")
	}
	post(t, chat, `{"model":"m","messages":[{"role":"user","content":"again"}]}`, "X-Session-Done", "true")
	for deadline := time.Now().Add(20 * time.Second); ; {
		scored, _ := n.Pool().List(ctx, pool.Filter{State: core.StateScored})
		if len(scored) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second step was not scored in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // several share intervals
	if bs, _ := n.Pool().Batches(ctx); len(bs) != 1 {
		t.Fatalf("%d batches with sharing off", len(bs))
	}
}
