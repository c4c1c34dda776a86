// Package synthetic makes up the batches that trainers' tests and
// benchmarks train on (trainer/harness's SyntheticBatch).
package synthetic

import (
	"fmt"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/batch"
)

// Batch encodes a batch of n scored steps of one session, as a
// device would ship them: a user asks, the assistant answers, and a
// plugin's reward of +1 or −1 says whether the answer starts with a word.
// Different seeds give different batches.
func Batch(seed uint64, n int, adapter string) ([]byte, error) {
	prompts := []string{"Hi, how are you?", "What time is it?", "Can you help me?", "Tell me a joke."}
	replies := []string{"OK", " ok", "Sure.", "...", "Yes", "- no"}
	steps := make([]*core.Step, n)
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for i := range n {
		k := int(seed)*7 + i
		reply := replies[(k+k/len(prompts))%len(replies)] // every prompt gets good and bad replies
		v := -1.0
		if r := reply[0]; r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' {
			v = 1
		}
		id := fmt.Sprintf("s%d-%d", seed, i)
		steps[i] = &core.Step{
			ID: core.StepID(id), SessionID: core.SessionID(fmt.Sprintf("session-%d", seed)),
			Turn: core.TurnMain, API: core.APIChat, State: core.StateScored, Adapter: adapter,
			Request: core.Request{Model: "tiny", Messages: []core.Message{{Role: core.RoleUser, Content: prompts[k%len(prompts)]}}},
			Response: core.Response{Model: "tiny", Choices: []core.Choice{{
				Message: core.Message{Role: core.RoleAssistant, Content: reply}, FinishReason: "stop"}}},
			Timings: core.Timings{Start: at},
			Reward: &core.Reward{Value: &v, At: at, Scores: []core.Score{{Plugin: "starts-with-word",
				Hash: "0000000000000000000000000000000000000000000000000000000000000000", Value: &v, Weight: 1}}},
		}
	}
	return batch.Encode(batch.Meta{Created: at, Policy: "cluster"}, steps)
}
