package trainer

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/trainer/engine"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// rolloutItem is one task prompt of a trainer's share: G rollouts of it
// are sampled from the round's base version and scored by the set's
// verifier.
type rolloutItem struct {
	id   core.BatchID
	task *tasks.Task
	rt   *taskRuntime
}

// rolloutStats reports a share's rollouts.
type rolloutStats struct {
	Prompts int
	Samples int
	// Tokens counts the tokens sampled; Seconds the time spent sampling
	// and scoring.
	Tokens  int
	Seconds float64
	// Flat counts the prompts whose G rewards were all equal: their
	// advantages are all zero, so they are left out of training.
	Flat int
	// MeanReward is the verifier's mean score over the samples it scored.
	MeanReward float64

	steps []*core.Step
}

// rolloutSeed is the sampling seed of rollout g of item in round: every
// trainer that trains the item again after a failover samples the same.
func rolloutSeed(item core.BatchID, round uint64, g int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(item))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], round)
	binary.LittleEndian.PutUint64(b[8:], uint64(g))
	h.Write(b[:])
	return h.Sum64()
}

// episode samples one reply to task from the engine's current adapter and
// returns it as a step (the prompt's and the reply's token ids and
// log-probs recorded exactly) with the verifier's score as its reward.
// Temperature 0 is greedy.
func (w *worker) episode(ctx context.Context, rt *taskRuntime, task *tasks.Task, version uint64, temp float64, seed uint64, id string) (*core.Step, core.Score, int, error) {
	text, err := w.render.Render(task.Messages, task.Tools, true)
	if err != nil {
		return nil, core.Score{}, 0, fmt.Errorf("trainer: task %q: %w", task.ID, err)
	}
	prompt := w.tok.Encode(text)
	set := task.Settings(rt.ts.MaxTokens)
	ids, lps, err := w.eng.Generate(ctx, prompt, engine.GenOptions{MaxTokens: set.MaxTokens, Temperature: temp, Seed: seed})
	if err != nil {
		return nil, core.Score{}, 0, err
	}
	body := ids
	for len(body) > 0 && w.tok.IsSpecial(body[len(body)-1]) {
		body = body[:len(body)-1]
	}
	finish := "stop"
	if len(body) == len(ids) && len(ids) >= set.MaxTokens {
		finish = "length"
	}
	toks := make([]core.TokenLogprob, len(ids))
	for i, t := range ids {
		toks[i] = core.TokenLogprob{ID: t, Logprob: float64(lps[i])}
	}
	reply := w.tok.Decode(body)

	st := &core.Step{
		ID: core.StepID(id), Turn: core.TurnMain, Adapter: "v" + strconv.FormatUint(version, 10),
		Request: core.Request{Messages: task.Messages, Tools: task.Tools},
		Response: core.Response{PromptTokenIDs: prompt, Choices: []core.Choice{{
			Message: core.Message{Role: core.RoleAssistant, Content: reply}, FinishReason: finish,
			Tokens: toks, Fidelity: core.FidelityExact}}},
	}
	sc, _ := rt.runner.ScoreTask(ctx, verifierName, st, reward.Task{ID: task.ID, Answer: task.Answer, Meta: task.Meta})
	if reply == "" {
		// The sample builder refuses an empty reply; the recorded ids,
		// not the text, are what it trains, so the special tokens stand
		// in for the text.
		st.Response.Choices[0].Message.Content = w.tok.Decode(ids)
	}
	if sc.Value != nil {
		st.Reward = &core.Reward{Value: sc.Value, Scores: []core.Score{sc}}
	}
	return st, sc, len(ids), nil
}

// rollouts samples G replies to every item from the adapter loaded in the
// engine (version), scores them, and returns them as steps for the learner,
// which normalises the rewards of each prompt's group (GRPO). A group whose
// rewards are all equal is left out. The caller holds w.mu.
func (w *worker) rollouts(ctx context.Context, items []rolloutItem, version, round uint64) ([]*core.Step, rolloutStats, error) {
	var st rolloutStats
	start := time.Now()
	var sum float64
	scored := 0
	for _, it := range items {
		g := it.rt.ts.Group
		steps := make([]*core.Step, 0, g)
		var first *float64
		flat := true
		for k := range g {
			id := fmt.Sprintf("task-%s-%s-r%d-%d", short(string(it.id)), it.task.ID, round, k)
			s, sc, n, err := w.episode(ctx, it.rt, it.task, version, 1, rolloutSeed(it.id, round, k), id)
			if err != nil {
				return nil, st, err
			}
			st.Tokens += n
			st.Samples++
			if sc.Value == nil {
				continue
			}
			sum += *sc.Value
			scored++
			if first == nil {
				first = sc.Value
			} else if *sc.Value != *first {
				flat = false
			}
			steps = append(steps, s)
		}
		st.Prompts++
		if flat || len(steps) < 2 {
			st.Flat++
			continue
		}
		st.steps = append(st.steps, steps...)
	}
	if scored > 0 {
		st.MeanReward = sum / float64(scored)
	}
	st.Seconds = time.Since(start).Seconds()
	out := st.steps
	st.steps = nil
	return out, st, nil
}

// evaluate scores the version in dir on rt's held-out split: one greedy
// reply per prompt; a prompt passes when the verifier's score is positive.
func (w *worker) evaluate(ctx context.Context, cfg group.Config, dir string, rt *taskRuntime) (group.Eval, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ready(ctx, cfg); err != nil {
		return group.Eval{}, err
	}
	if err := w.eng.LoadAdapter(ctx, dir); err != nil {
		return group.Eval{}, err
	}
	ev := group.Eval{Prompts: len(rt.ts.HeldOut)}
	var sum float64
	for _, id := range rt.ts.HeldOut {
		task := rt.byID[id]
		if task == nil {
			return group.Eval{}, fmt.Errorf("%w: held-out task %q not in the set", ErrTasks, id)
		}
		_, sc, _, err := w.episode(ctx, rt, task, 0, 0, 0, "eval-"+id)
		if err != nil {
			return group.Eval{}, err
		}
		if sc.Value != nil {
			sum += *sc.Value
			if *sc.Value > 0 {
				ev.Passed++
			}
		}
	}
	if ev.Prompts > 0 {
		ev.PassAt1 = float64(ev.Passed) / float64(ev.Prompts)
		ev.MeanReward = sum / float64(ev.Prompts)
	}
	return ev, nil
}
