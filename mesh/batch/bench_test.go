package batch

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// agentSteps makes n agent-sized steps: 4 sessions sharing one 40,000
// character system prompt and 12 tools, each step's conversation two
// messages longer than its predecessor's (2 to 32 messages, ~17 on
// average), with tool calls and results, 64 token log-probs and a reward.
func agentSteps(n int) []*core.Step {
	rng := rand.New(rand.NewPCG(1, 2))
	vocab := make([]string, 2000)
	for i := range vocab {
		w := make([]byte, 2+rng.IntN(9))
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		vocab[i] = string(w)
	}
	text := func(chars int) string {
		var sb strings.Builder
		for sb.Len() < chars {
			sb.WriteString(vocab[rng.IntN(len(vocab))])
			sb.WriteByte(' ')
		}
		return sb.String()[:chars]
	}
	system := text(40_000)
	tools := make([]core.Tool, 12)
	for i := range tools {
		params, _ := json.Marshal(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"path":  map[string]string{"type": "string", "description": text(80)},
				"query": map[string]string{"type": "string", "description": text(120)},
			},
			"required": []string{"path"},
		})
		tools[i] = core.Tool{Name: fmt.Sprintf("tool_%d", i), Description: text(300), Parameters: params}
	}

	const sessions = 4
	convo := make([][]core.Message, sessions)
	steps := make([]*core.Step, n)
	for i := range steps {
		sess := i % sessions
		if convo[sess] == nil {
			convo[sess] = []core.Message{{Role: core.RoleSystem, Content: system}}
		}
		call := fmt.Sprintf("call_%d", i)
		if len(convo[sess]) == 1 {
			convo[sess] = append(convo[sess], core.Message{Role: core.RoleUser, Content: text(400)})
		} else {
			convo[sess] = append(convo[sess],
				core.Message{Role: core.RoleAssistant, Content: text(200), ToolCalls: []core.ToolCall{{
					ID: call, Type: "function", Name: tools[rng.IntN(len(tools))].Name,
					Arguments: fmt.Sprintf(`{"path":%q}`, text(40))}}},
				core.Message{Role: core.RoleTool, ToolCallID: call, Content: text(1500)})
		}
		tokens := make([]core.TokenLogprob, 64)
		for j := range tokens {
			tokens[j] = core.TokenLogprob{Token: vocab[rng.IntN(len(vocab))], ID: rng.IntN(150_000), Logprob: -rng.Float64() * 3}
		}
		v := rng.Float64()*2 - 1
		steps[i] = &core.Step{
			ID:        core.StepID(fmt.Sprintf("01J%020d", i)),
			SessionID: core.SessionID(fmt.Sprintf("session-%d", sess)),
			Turn:      core.TurnMain, API: core.APIChat, State: core.StateScored,
			Request: core.Request{Model: "qwen3-8b", Messages: append([]core.Message(nil), convo[sess]...), Tools: tools,
				Params: json.RawMessage(`{"temperature":0.7,"max_tokens":4096}`)},
			Response: core.Response{Model: "qwen3-8b", Choices: []core.Choice{{
				Message:      core.Message{Role: core.RoleAssistant, Content: text(600)},
				FinishReason: "stop", Tokens: tokens, Fidelity: core.FidelityExact,
			}}, Usage: &core.Usage{PromptTokens: 14_000, CompletionTokens: 64, TotalTokens: 14_064}},
			Model:   "qwen3-8b",
			Adapter: fmt.Sprintf("lora-%d", i%2),
			Timings: core.Timings{Start: testHour, TTFT: time.Second, Total: 3 * time.Second},
			Reward: &core.Reward{Value: &v, Scores: []core.Score{
				{Plugin: "rubric", Hash: hashA, Value: &v, Weight: 1},
				{Plugin: "judge", Hash: hashB, Reason: "abstain"},
			}, At: testHour},
			Source: "gateway",
		}
	}
	return steps
}

func BenchmarkEncode(b *testing.B) {
	steps := agentSteps(64)
	enc := mustEncode(b, testMeta, steps)
	h, err := DecodeHeader(enc, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(h.BodyBytes) // MB/s of step JSONL
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(testMeta, steps); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.BodyBytes)/float64(len(enc)), "ratio")
	b.ReportMetric(float64(len(enc)), "batch-bytes")
}

func BenchmarkDecode(b *testing.B) {
	enc := mustEncode(b, testMeta, agentSteps(64))
	h, err := DecodeHeader(enc, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(h.BodyBytes)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(enc, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.BodyBytes)/float64(len(enc)), "ratio")
	b.ReportMetric(float64(len(enc)), "batch-bytes")
}
