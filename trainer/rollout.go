package trainer

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/reward"
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

// episode runs one episode of task on the engine's current adapter: the
// model answers; when the task declares tools and the set has a tool
// simulator, each tool call of its reply (Qwen3's <tool_call> JSON) is
// answered by the simulator and the model answers again, for at most the
// task's max_turns turns. Every model turn is a step whose prompt and
// reply token ids and log-probs are recorded exactly as the engine read
// and sampled them; the verifier scores the last turn (its context holds
// the whole transcript), and every turn of the episode carries that score
// as its reward. Temperature 0 is greedy.
func (w *worker) episode(ctx context.Context, rt *taskRuntime, task *tasks.Task, version uint64, temp float64, seed uint64, id string) ([]*core.Step, core.Score, int, error) {
	set := task.Settings(rt.ts.MaxTokens)
	tools := rt.ts.Tools != "" && len(task.Tools) > 0
	if !tools {
		set.MaxTurns = 1
	}
	msgs := slices.Clone(task.Messages)
	var steps []*core.Step
	tokens := 0
	for turn := range set.MaxTurns {
		text, err := w.render.Render(msgs, task.Tools, true)
		if err != nil {
			return nil, core.Score{}, 0, fmt.Errorf("trainer: task %q: %w", task.ID, err)
		}
		prompt := w.tok.Encode(text)
		ids, lps, err := w.eng.Generate(ctx, prompt, engine.GenOptions{MaxTokens: set.MaxTokens, Temperature: temp, Seed: seed + uint64(turn)})
		if err != nil {
			return nil, core.Score{}, 0, err
		}
		tokens += len(ids)
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
		reply := core.Message{Role: core.RoleAssistant, Content: w.tok.Decode(body)}
		if tools {
			reply.Content, reply.ToolCalls = splitToolCalls(reply.Content, turn)
		}
		st := &core.Step{
			ID: core.StepID(fmt.Sprintf("%s-t%d", id, turn)), Turn: core.TurnMain, Adapter: "v" + strconv.FormatUint(version, 10),
			Request: core.Request{Messages: slices.Clone(msgs), Tools: task.Tools},
			Response: core.Response{PromptTokenIDs: prompt, Choices: []core.Choice{{
				Message: reply, FinishReason: finish, Tokens: toks, Fidelity: core.FidelityExact}}},
		}
		steps = append(steps, st)
		msgs = append(msgs, reply)
		if len(reply.ToolCalls) == 0 || turn == set.MaxTurns-1 {
			break
		}
		for _, call := range reply.ToolCalls {
			msgs = append(msgs, w.callTool(ctx, rt, task, msgs, call))
		}
	}
	last := steps[len(steps)-1]
	sc, _ := rt.runner.ScoreTask(ctx, verifierName, last, reward.Task{ID: task.ID, Answer: task.Answer, Meta: task.Meta})
	for _, st := range steps {
		c := &st.Response.Choices[0]
		if c.Message.Content == "" && len(c.Message.ToolCalls) == 0 {
			// The sample builder refuses an empty reply; the recorded
			// ids, not the text, are what it trains, so the special
			// tokens stand in for the text.
			ids := make([]int, len(c.Tokens))
			for i, t := range c.Tokens {
				ids[i] = t.ID
			}
			c.Message.Content = w.tok.Decode(ids)
		}
		if sc.Value != nil {
			st.Reward = &core.Reward{Value: sc.Value, Scores: []core.Score{sc}}
		}
	}
	return steps, sc, tokens, nil
}

// splitToolCalls takes the <tool_call> blocks out of a reply: the text
// left, trimmed, and the calls that parse (ids call_<turn>_<n>).
func splitToolCalls(text string, turn int) (string, []core.ToolCall) {
	const open, end = "<tool_call>", "</tool_call>"
	var calls []core.ToolCall
	var rest strings.Builder
	for {
		i := strings.Index(text, open)
		if i < 0 {
			break
		}
		j := strings.Index(text[i:], end)
		if j < 0 {
			break
		}
		rest.WriteString(text[:i])
		if c, ok := chat.ParseToolCall(text[i+len(open) : i+j]); ok {
			c.ID = fmt.Sprintf("call_%d_%d", turn, len(calls))
			calls = append(calls, c)
		}
		text = text[i+j+len(end):]
	}
	rest.WriteString(text)
	return strings.TrimSpace(rest.String()), calls
}

// callTool asks the set's tool simulator for the result of call, made in
// the last message of msgs. The simulator is a plugin of the reward ABI:
// its input's action is the assistant message with that one call, and its
// result's hint is the tool's output (a label "error" flags it an error);
// a simulator that gives no hint yields an error result saying why.
func (w *worker) callTool(ctx context.Context, rt *taskRuntime, task *tasks.Task, msgs []core.Message, call core.ToolCall) core.Message {
	act := core.Message{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{call}}
	st := &core.Step{ID: core.StepID("tool-" + call.ID), Turn: core.TurnMain,
		Request:  core.Request{Messages: msgs[:len(msgs)-1], Tools: task.Tools},
		Response: core.Response{Choices: []core.Choice{{Message: act}}}}
	sc, _ := rt.runner.ScoreTask(ctx, toolsName, st, reward.Task{ID: task.ID, Answer: task.Answer, Meta: task.Meta})
	out := core.Message{Role: core.RoleTool, ToolCallID: call.ID, Name: call.Name, Content: sc.Hint}
	if sc.Hint == "" {
		out.Content, out.IsError = "error: the tool gave no result ("+sc.Reason+")", true
	}
	if slices.Contains(sc.Labels, "error") {
		out.IsError = true
	}
	return out
}

// episodeTag is a rollout step's GRPO group (its prompt's item) and the
// episode, of that prompt's G, it is a turn of.
type episodeTag struct{ group, episode string }

// rollouts samples G episodes of every item from the adapter loaded in the
// engine (version), scores them, and returns their turns as steps for the
// learner, with each step's episode: the learner normalises the rewards of
// each prompt's G episodes together (GRPO), each episode counting once and
// all its turns sharing its advantage. A group whose rewards are all equal
// is left out. The caller holds w.mu.
func (w *worker) rollouts(ctx context.Context, items []rolloutItem, version, round uint64) ([]*core.Step, map[*core.Step]episodeTag, rolloutStats, error) {
	var (
		st   rolloutStats
		out  []*core.Step
		sum  float64
		tags = map[*core.Step]episodeTag{}
	)
	start := time.Now()
	scored := 0
	for _, it := range items {
		g := it.rt.ts.Group
		steps := make([]*core.Step, 0, g)
		episodes := 0
		var first *float64
		flat := true
		for k := range g {
			id := fmt.Sprintf("task-%s-%s-r%d-%d", short(string(it.id)), it.task.ID, round, k)
			ep, sc, n, err := w.episode(ctx, it.rt, it.task, version, 1, rolloutSeed(it.id, round, k), id)
			if err != nil {
				return nil, nil, st, err
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
			for _, t := range ep {
				tags[t] = episodeTag{group: string(it.id), episode: strconv.Itoa(k)}
			}
			steps = append(steps, ep...)
			episodes++
		}
		st.Prompts++
		if flat || episodes < 2 {
			st.Flat++
			continue
		}
		out = append(out, steps...)
	}
	if scored > 0 {
		st.MeanReward = sum / float64(scored)
	}
	st.Seconds = time.Since(start).Seconds()
	return out, tags, st, nil
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
