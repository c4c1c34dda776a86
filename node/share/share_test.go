package share

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/pool"
)

var (
	t0      = time.Date(2026, 5, 1, 9, 30, 0, 0, time.UTC)
	testKey = bytes.Repeat([]byte{7}, 32)
)

func f64(v float64) *float64 { return &v }

// step makes a scored step of session sess at minute i whose user message
// is text.
func step(id, sess string, i int, text string, reward *core.Reward) *core.Step {
	return &core.Step{
		ID: core.StepID(id), SessionID: core.SessionID(sess), Turn: core.TurnMain, API: core.APIChat, State: core.StateScored,
		Request: core.Request{Model: "qwen3", Messages: []core.Message{
			{Role: core.RoleSystem, Content: "You are the assistant of ops@example.com. " + strings.Repeat("Be brief. ", 40)},
			{Role: core.RoleUser, Content: text},
		}},
		Response: core.Response{Model: "qwen3", Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "OK."}}}},
		Timings:  core.Timings{Start: t0.Add(time.Duration(i) * time.Minute)},
		Reward:   reward,
		Adapter:  "v1",
		Source:   "gateway",
	}
}

func scored(v float64, hint string) *core.Reward {
	return &core.Reward{Value: f64(v), Hint: hint, Scores: []core.Score{{Plugin: "p", Hash: "h1", Value: f64(v), Weight: 1}}}
}

func openPool(t *testing.T) *pool.Pool {
	t.Helper()
	p, err := pool.Open(t.TempDir(), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func put(t *testing.T, p *pool.Pool, steps ...*core.Step) {
	t.Helper()
	for _, s := range steps {
		if err := p.Put(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

func states(t *testing.T, p *pool.Pool) map[core.StepID]core.State {
	t.Helper()
	all, err := p.List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[core.StepID]core.State{}
	for _, s := range all {
		m[s.ID] = s.State
	}
	return m
}

func TestPolicy(t *testing.T) {
	for _, bad := range []Policy{
		{}, {Mode: "some"}, {Mode: ModeScored, MinRewardAbs: -0.1}, {Mode: ModeScored, MinRewardAbs: 1.5},
		{Mode: ModeAll, Tools: []string{" "}}, {Mode: ModeAll, Names: []string{"x"}},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrPolicy) {
			t.Errorf("%+v: %v, want ErrPolicy", bad, err)
		}
	}
	p := Policy{Mode: ModeScored, MinRewardAbs: 0.5}
	side := step("a", "s", 0, "hi", scored(1, ""))
	side.Turn = core.TurnSide
	for _, c := range []struct {
		s    *core.Step
		want bool
	}{
		{step("a", "s", 0, "hi", scored(1, "")), true},
		{step("a", "s", 0, "hi", scored(-0.6, "")), true},
		{step("a", "s", 0, "hi", scored(0.2, "")), false},
		{step("a", "s", 0, "hi", scored(0.2, "say it shorter")), true},
		{step("a", "s", 0, "hi", &core.Reward{Hint: "a hint"}), true},
		{step("a", "s", 0, "hi", &core.Reward{}), false},
		{step("a", "s", 0, "hi", nil), false},
		{side, false},
	} {
		if got, why := p.Allows(c.s); got != c.want || got == (why != "") {
			t.Errorf("Allows(reward %+v, turn %s) = %v (%q), want %v", c.s.Reward, c.s.Turn, got, why, c.want)
		}
	}
	if ok, _ := (&Policy{Mode: ModeAll}).Allows(side); !ok {
		t.Error("mode all holds a side turn")
	}
	if ok, _ := (&Policy{Mode: ModeNone}).Allows(step("a", "s", 0, "hi", scored(1, ""))); ok {
		t.Error("mode none lets a step out")
	}
	a := Policy{Mode: ModeScored, Tools: []string{"read", "exec"}, Names: []string{"Alice"}}
	b := Policy{Mode: ModeScored, Tools: []string{"exec", "read"}, Names: []string{"Alice"}}
	c := Policy{Mode: ModeScored, Tools: []string{"exec", "read"}, Names: []string{"Bob"}}
	if a.Digest() != b.Digest() || a.Digest() == c.Digest() || len(a.Digest()) != 12 || strings.Contains(a.Digest(), "Alice") {
		t.Errorf("digests %s %s %s", a.Digest(), b.Digest(), c.Digest())
	}
}

func TestLoadKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, err := LoadKey(dir)
	if err != nil || len(k1) != 32 {
		t.Fatalf("%x, %v", k1, err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}
	k2, err := LoadKey(dir)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("the key changed: %x, %x, %v", k1, k2, err)
	}
	if k3, _ := LoadKey(t.TempDir()); bytes.Equal(k1, k3) {
		t.Fatal("two devices made the same key")
	}
	os.WriteFile(filepath.Join(dir, KeyFile), []byte("not hex\n"), 0o600)
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("a damaged key: %v", err)
	}
}

// TestSeal: the outbox seals the steps the policy allows, scrubbed, into
// a payload that decodes, and holds the others on the device.
func TestSeal(t *testing.T) {
	ctx := context.Background()
	p := openPool(t)
	side := step("s4", "b", 4, "heartbeat", scored(1, ""))
	side.Turn = core.TurnSide
	open := step("s5", "b", 5, "not scored yet", nil)
	open.State = core.StateClosed
	put(t, p,
		step("s1", "a", 1, "mail alice@example.org about the invoice", scored(1, "")),
		step("s2", "a", 2, "no: mail bob@example.org, then alice@example.org", scored(-1, "mail bob first")),
		step("s3", "b", 3, "my key is AKIAIOSFODNN7ABCDEFG", &core.Reward{Scores: []core.Score{}}),
		side, open,
	)
	ob, err := New(Options{Pool: p, Key: testKey, Policy: Policy{Mode: ModeScored, Names: []string{"invoice"}}, Now: func() time.Time { return t0.Add(time.Hour + 17*time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ob.Seal(ctx)
	if err != nil || b == nil {
		t.Fatalf("Seal: %+v, %v", b, err)
	}
	if len(b.Steps) != 2 || b.Steps[0] != "s1" || b.Steps[1] != "s2" {
		t.Fatalf("batch steps %v", b.Steps)
	}
	want := map[core.StepID]core.State{"s1": core.StateBatched, "s2": core.StateBatched, "s3": core.StateHeld, "s4": core.StateHeld, "s5": core.StateClosed}
	if got := states(t, p); !mapsEqual(got, want) {
		t.Fatalf("states %v, want %v", got, want)
	}
	payload, err := p.Payload(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := batch.Verify(payload, b.ID, batch.Limits{})
	if err != nil {
		t.Fatalf("the sealed payload does not verify: %v", err)
	}
	h := got.Header
	if h.Steps != 2 || h.Sessions != 1 || h.Rewards.Positive != 1 || h.Rewards.Negative != 1 || h.Rewards.Hints != 1 ||
		h.Policy != ob.Policy().Digest() || !h.Created.Equal(t0.Truncate(time.Hour).Add(time.Hour)) || len(h.Adapters) != 1 {
		t.Errorf("header %+v", h)
	}
	for _, leak := range []string{"alice@", "bob@", "ops@", "invoice", "\"s1\"", "\"a\""} {
		if bytes.Contains(mustJSONL(t, got.Steps), []byte(leak)) {
			t.Errorf("the batch holds %q", leak)
		}
	}
	s1, s2 := got.Steps[0], got.Steps[1]
	if u := s1.Request.Messages[1].Content; u != "mail <EMAIL_2> about the <NAME_1>" {
		t.Errorf("step 1: %q", u)
	}
	// One table for the session: alice is <EMAIL_2> in both steps.
	if u := s2.Request.Messages[1].Content; u != "no: mail <EMAIL_3>, then <EMAIL_2>" {
		t.Errorf("step 2: %q", u)
	}
	if s1.SessionID != s2.SessionID || s1.SessionID == "a" || s1.State != core.StateBatched {
		t.Errorf("sessions %s %s, state %s", s1.SessionID, s2.SessionID, s1.State)
	}
	// Nothing left to seal.
	if b2, err := ob.Seal(ctx); err != nil || b2 != nil {
		t.Errorf("a second Seal: %+v, %v", b2, err)
	}
}

// TestPlaceholdersAcrossBatches: a session's placeholders keep their
// numbers from one batch to the next.
func TestPlaceholdersAcrossBatches(t *testing.T) {
	ctx := context.Background()
	p := openPool(t)
	ob, err := New(Options{Pool: p, Key: testKey, Policy: Policy{Mode: ModeScored}})
	if err != nil {
		t.Fatal(err)
	}
	put(t, p, step("s1", "a", 1, "write to carol@example.org", scored(1, "")))
	if _, err := ob.Seal(ctx); err != nil {
		t.Fatal(err)
	}
	put(t, p, step("s2", "a", 2, "and dan@example.org, cc carol@example.org", scored(1, "")))
	b, err := ob.Seal(ctx)
	if err != nil || b == nil {
		t.Fatal(err)
	}
	payload, _ := p.Payload(ctx, b.ID)
	got, err := batch.Decode(payload, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if u := got.Steps[0].Request.Messages[1].Content; u != "and <EMAIL_3>, cc <EMAIL_2>" {
		t.Errorf("second batch: %q (carol was <EMAIL_2> in the first)", u)
	}
}

// TestModeNone: nothing is sealed and nothing moves; switching the policy
// on seals what is waiting.
func TestModeNone(t *testing.T) {
	ctx := context.Background()
	p := openPool(t)
	put(t, p, step("s1", "a", 1, "hello", scored(1, "")))
	ob, err := New(Options{Pool: p, Key: testKey, Policy: Policy{Mode: ModeNone}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := ob.SealAll(ctx); err != nil || n != 0 {
		t.Fatalf("SealAll in mode none: %d, %v", n, err)
	}
	if st := states(t, p); st["s1"] != core.StateScored {
		t.Fatalf("state %v", st)
	}
	pv, err := ob.Preview(ctx, 5)
	if err != nil || !pv.Empty || !strings.Contains(pv.Note, "none") {
		t.Fatalf("preview in mode none: %+v, %v", pv, err)
	}
	if err := ob.SetPolicy(Policy{Mode: "bogus"}); err == nil || ob.Policy().Mode != ModeNone {
		t.Fatalf("a bad policy: %v, mode now %s", err, ob.Policy().Mode)
	}
	if err := ob.SetPolicy(Policy{Mode: ModeAll}); err != nil {
		t.Fatal(err)
	}
	if n, err := ob.SealAll(ctx); err != nil || n != 1 {
		t.Fatalf("SealAll in mode all: %d, %v", n, err)
	}
}

// TestPreview: a dry run shows what would leave and changes nothing; once
// sealed, the sealed batch is what preview shows, until it ships.
func TestPreview(t *testing.T) {
	ctx := context.Background()
	p := openPool(t)
	var steps []*core.Step
	for i := 0; i < 7; i++ {
		steps = append(steps, step("s"+string(rune('0'+i)), "a", i, "call +44 20 7946 0958", scored(1, "")))
	}
	steps[6].Reward = &core.Reward{Scores: []core.Score{}}
	put(t, p, steps...)
	ob, _ := New(Options{Pool: p, Key: testKey, Policy: Policy{Mode: ModeScored}})
	dry, err := ob.Preview(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if dry.Sealed || dry.Empty || len(dry.Steps) != 2 || dry.Header.Steps != 6 || len(dry.Held) != 1 || dry.Held[0].ID != "s6" || dry.Found["PHONE"] != 6 {
		t.Fatalf("dry run: %+v", dry)
	}
	if st := states(t, p); st["s0"] != core.StateScored || st["s6"] != core.StateScored {
		t.Fatalf("a preview changed the pool: %v", st)
	}
	b, err := ob.Seal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.ID != dry.ID {
		t.Errorf("sealed %s, the dry run said %s", b.ID, dry.ID)
	}
	sealed, err := ob.Preview(ctx, 0)
	if err != nil || !sealed.Sealed || sealed.ID != b.ID || len(sealed.Steps) != 6 || sealed.Size != int(b.Size) {
		t.Fatalf("sealed preview: %+v, %v", sealed, err)
	}
	if c := sealed.Steps[0].Request.Messages[1].Content; c != "call <PHONE_1>" {
		t.Errorf("sealed step: %q", c)
	}
	if err := p.MarkShipped(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if after, err := ob.Preview(ctx, 0); err != nil || !after.Empty {
		t.Fatalf("after shipping: %+v, %v", after, err)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func mustJSONL(t *testing.T, steps []*core.Step) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, s := range steps {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}
