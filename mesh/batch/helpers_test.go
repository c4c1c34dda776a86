package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Test helpers: builders of steps, and of batches by hand (to make ones
// Encode would refuse to make).

var (
	testHour = time.Date(2025, 6, 1, 14, 0, 0, 0, time.UTC)
	hashA    = hexSum("rubric.wasm")
	hashB    = hexSum("judge.wasm")
)

func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func fptr(v float64) *float64 { return &v }

// step is a step with messages, tools, a tool call, a response with token
// log-probs, feedback and a next state; mods change it.
func step(id, session string, mods ...func(*core.Step)) *core.Step {
	s := &core.Step{
		ID:        core.StepID(id),
		SessionID: core.SessionID(session),
		ChainID:   core.ChainID("chain-" + session),
		Turn:      core.TurnMain,
		API:       core.APIChat,
		State:     core.StateScored,
		Request: core.Request{
			Model: "qwen3-8b",
			Messages: []core.Message{
				{Role: core.RoleSystem, Content: "You are <helpful> & brief. Ünïcödé ✓"},
				{Role: core.RoleUser, Content: "list the files"},
				{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "call_1", Type: "function", Name: "ls", Arguments: `{"path": "."}`}}},
				{Role: core.RoleTool, ToolCallID: "call_1", Content: "a.go\nb.go", IsError: false},
				{Role: core.RoleUser, Parts: []core.Part{{Type: "image", Raw: json.RawMessage(`{"type":"image","url":"x"}`)}}},
			},
			Tools: []core.Tool{
				{Name: "ls", Description: "list files", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
				{Name: "cat", Parameters: json.RawMessage(`{"type":"object"}`)},
			},
			Params: json.RawMessage(`{"temperature":0.7,"max_tokens":512}`),
		},
		Response: core.Response{
			ID:    "resp-" + id,
			Model: "qwen3-8b",
			Choices: []core.Choice{{
				Message:      core.Message{Role: core.RoleAssistant, Content: "Two files: a.go and b.go.", Reasoning: "count them"},
				FinishReason: "stop",
				Tokens:       []core.TokenLogprob{{Token: "Two", ID: 7, Logprob: -0.25}, {Token: " files", ID: -1, Logprob: -1e-9}},
				Fidelity:     core.FidelityExact,
			}},
			Usage:  &core.Usage{PromptTokens: 120, CompletionTokens: 9, TotalTokens: 129},
			Status: 200,
		},
		Model:   "qwen3-8b",
		Timings: core.Timings{Start: testHour, TTFT: 120 * time.Millisecond, Total: 900 * time.Millisecond},
		NextState: &core.NextState{
			Messages: []core.Message{{Role: core.RoleUser, Content: "thanks"}},
			StepID:   core.StepID("next-" + id),
		},
		Feedback: []core.Feedback{{Score: fptr(1), Text: "good", At: testHour.In(time.FixedZone("", 2*3600))}},
		Source:   "gateway",
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func adapter(a string) func(*core.Step) { return func(s *core.Step) { s.Adapter = a } }

func reward(v *float64, hint string, scores ...core.Score) func(*core.Step) {
	return func(s *core.Step) {
		s.Reward = &core.Reward{Value: v, Hint: hint, Scores: scores, At: testHour}
	}
}

// richSteps: 3 sessions, 3 scored (2 positive, 1 negative, mean 0.5/3),
// 1 hint, 2 plugins, 2 adapters.
func richSteps() []*core.Step {
	return []*core.Step{
		step("a1", "s1", adapter("lora-b"), reward(fptr(0.5), "cite the file names",
			core.Score{Plugin: "rubric", Hash: hashA, Value: fptr(0.5), Weight: 1, Labels: []string{"ok"}},
			core.Score{Plugin: "judge", Hash: hashB, Reason: "no judge model"})),
		step("a2", "s1", adapter("lora-a"), reward(fptr(-1), "",
			core.Score{Plugin: "rubric", Hash: hashA, Value: fptr(-1), Weight: 1})),
		step("a3", "s2", adapter("lora-b"), reward(fptr(1), "",
			core.Score{Plugin: "judge", Hash: hashB, Value: fptr(1), Weight: 2})),
		step("a4", "s3", reward(nil, "", core.Score{Plugin: "judge", Hash: hashB, Reason: "abstain"})),
		step("a5", "s3", func(s *core.Step) { s.NextState = nil; s.State = core.StateClosed }),
	}
}

func mustEncode(t testing.TB, meta Meta, steps []*core.Step) []byte {
	t.Helper()
	b, err := Encode(meta, steps)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return b
}

// bodyOf writes steps as body lines without checking them.
func bodyOf(t testing.TB, steps []*core.Step) []byte {
	t.Helper()
	var buf bytes.Buffer
	lw := newLineWriter(&buf)
	for _, s := range steps {
		if err := lw.write(s); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// honestHeader is the header Encode would write for steps and body.
func honestHeader(steps []*core.Step, body []byte) Header {
	sum := sha256.Sum256(body)
	h := Header{
		Schema: Schema, StepSchema: core.SchemaVersion, Created: testHour, Policy: "policy-1",
		Steps: len(steps), BodyBytes: int64(len(body)), BodySHA256: hex.EncodeToString(sum[:]),
	}
	h.Sessions, h.Rewards, h.Plugins, h.Adapters = summarize(steps)
	return h
}

func headerJSON(t testing.TB, h Header) []byte {
	t.Helper()
	hj, err := marshalHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	return hj
}

func zframe(t testing.TB, body []byte) []byte {
	t.Helper()
	enc, err := sharedEncoder()
	if err != nil {
		t.Fatal(err)
	}
	return enc.EncodeAll(body, nil)
}

// assemble puts magic, version, header and frame together.
func assemble(hj, frame []byte) []byte {
	b := append([]byte(magic), formatVersion)
	b = binary.AppendUvarint(b, uint64(len(hj)))
	b = append(b, hj...)
	return append(b, frame...)
}

// split takes an encoded batch apart into its header JSON and frame.
func split(t testing.TB, b []byte) (hj, frame []byte) {
	t.Helper()
	rest := b[len(magic)+1:]
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		t.Fatal("split: bad header length")
	}
	return rest[k : k+int(n)], rest[k+int(n):]
}

// sentinelsOf lists the package's sentinels err wraps.
func sentinelsOf(err error) []error {
	var out []error
	for _, s := range []error{ErrMalformed, ErrTooLarge, ErrTruncated, ErrVersion, ErrHashMismatch} {
		if errors.Is(err, s) {
			out = append(out, s)
		}
	}
	return out
}

func stepsJSON(t testing.TB, steps []*core.Step) string {
	t.Helper()
	b, err := json.Marshal(steps)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
