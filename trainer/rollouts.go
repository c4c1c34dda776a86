package trainer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
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
	rt   *rolloutRuntime
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
func (w *worker) episode(ctx context.Context, rt *rolloutRuntime, task *tasks.Task, version uint64, temp float64, seed uint64, id string) ([]*core.Step, core.Score, int, error) {
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
func (w *worker) callTool(ctx context.Context, rt *rolloutRuntime, task *tasks.Task, msgs []core.Message, call core.ToolCall) core.Message {
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
func (w *worker) evaluate(ctx context.Context, cfg group.Config, dir string, rt *rolloutRuntime) (group.Eval, error) {
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
		if sc.Value == nil {
			ev.Abstained++
			continue
		}
		sum += *sc.Value
		if *sc.Value > 0 {
			ev.Passed++
		}
	}
	if ev.Prompts > 0 {
		ev.PassAt1 = float64(ev.Passed) / float64(ev.Prompts)
		ev.MeanReward = sum / float64(ev.Prompts)
	}
	return ev, nil
}

// rolloutRuntime is what a trainer needs to run a task set's rollouts:
// the set's settings as the group holds them, its tasks by id and a
// reward runner holding its verifier (and tool simulator). One that
// Trainer.acquireRuntime gave is held until release: its runner stays
// open until then, whatever else happens to the cache.
type rolloutRuntime struct {
	ts     group.TaskSet
	set    *tasks.Set
	byID   map[string]*tasks.Task
	runner *reward.Runner
	shared *sharedRuntime // nil for one made alone (newLocalRuntime)
	once   sync.Once
}

// release gives back a runtime acquireRuntime gave; it may be called more
// than once.
func (rt *rolloutRuntime) release() {
	if rt != nil && rt.shared != nil {
		rt.once.Do(func() { rt.shared.cache.release(rt.shared) })
	}
}

// runtimeKey names what a runtime runs: a set's canonical file and its
// plugins, by hash. The group never changes them for a set it holds, so a
// runtime is never replaced while rollouts or evaluations hold it; what a
// trainer was asked to add and the group refused never reaches the cache.
type runtimeKey struct{ set, reward, tools string }

// sharedRuntime is a cached runtime's parts, with the count of its
// holders.
type sharedRuntime struct {
	cache  *rolloutRuntimes
	key    runtimeKey
	set    *tasks.Set
	byID   map[string]*tasks.Task
	runner *reward.Runner
	refs   int
}

// rolloutRuntimes caches the runtimes of the group's task sets.
type rolloutRuntimes struct {
	mu     sync.Mutex
	m      map[runtimeKey]*sharedRuntime
	closed bool
}

func (c *rolloutRuntimes) release(sr *sharedRuntime) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sr.refs--
	if c.closed && sr.refs == 0 {
		sr.runner.Close(context.Background())
		delete(c.m, sr.key)
	}
}

// close closes the runtimes no one holds, and the others as their last
// holder releases them.
func (c *rolloutRuntimes) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for k, sr := range c.m {
		if sr.refs == 0 {
			errs = append(errs, sr.runner.Close(context.Background()))
			delete(c.m, k)
		}
	}
	return errors.Join(errs...)
}

// acquireRuntime returns the runtime of ts, a set the group holds (its
// settings are the runtime's), making it on first use: the set's files
// are fetched from the group's trainers when this one lacks them. The
// caller releases it.
func (t *Trainer) acquireRuntime(ctx context.Context, ts *group.TaskSet) (*rolloutRuntime, error) {
	c := &t.runtimes
	key := runtimeKey{ts.Hash, ts.Reward, ts.Tools}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("trainer: closed")
	}
	sr := c.m[key]
	if sr == nil {
		set, err := t.loadTaskSet(ctx, ts, "")
		if err != nil {
			return nil, err
		}
		runner, err := t.taskRunner(ctx, ts)
		if err != nil {
			return nil, err
		}
		sr = &sharedRuntime{cache: c, key: key, set: set, byID: set.ByID(), runner: runner}
		if c.m == nil {
			c.m = map[runtimeKey]*sharedRuntime{}
		}
		c.m[key] = sr
	}
	sr.refs++
	return &rolloutRuntime{ts: ts.WithDefaults(), set: sr.set, byID: sr.byID, runner: sr.runner, shared: sr}, nil
}

// loadTaskSet reads ts's canonical file and checks it, and has its
// plugins here too, fetching what this trainer lacks (from hint first).
func (t *Trainer) loadTaskSet(ctx context.Context, ts *group.TaskSet, hint mesh.PeerID) (*tasks.Set, error) {
	raw, err := t.taskFile(ctx, ts.Hash, hint)
	if err != nil {
		return nil, err
	}
	set, err := tasks.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if set.Hash != ts.Hash {
		return nil, fmt.Errorf("%w: the file of %s is not canonical", ErrTasks, short(ts.Hash))
	}
	for _, h := range []string{ts.Reward, ts.Tools} {
		if h != "" {
			if _, err := t.taskFile(ctx, h, hint); err != nil {
				return nil, err
			}
		}
	}
	return set, nil
}

// taskRunner loads ts's plugins, kept here, into a new reward runner.
func (t *Trainer) taskRunner(ctx context.Context, ts *group.TaskSet) (*reward.Runner, error) {
	tools := ""
	if ts.Tools != "" {
		tools = t.taskPath(ts.Tools)
	}
	return newTaskRunner(ctx, t.taskPath(ts.Reward), tools, t.log)
}

func newTaskRunner(ctx context.Context, verifier, tools string, log *slog.Logger) (*reward.Runner, error) {
	plugins := []reward.PluginConfig{{Name: verifierName, Path: verifier, Enabled: true}}
	if tools != "" {
		plugins = append(plugins, reward.PluginConfig{Name: toolsName, Path: tools, Enabled: true})
	}
	return reward.New(ctx, reward.Options{Plugins: plugins, Strict: true, FailureLimit: -1, Logger: log})
}

// Trying a verifier when its set is added.
const (
	// probeTasks is how many of a set's first tasks the verifier is
	// tried on, probeTime how long those tries may take together.
	probeTasks = 5
	probeTime  = 20 * time.Second
)

// probeVerifier tries the verifier in runner on the set's first tasks,
// each with its answer as the reply (what a verifier scores, and should
// score well). A verifier that scores none of them (it abstains, traps or
// runs out of time on every one) would score no rollout: the rounds would
// mark the set's prompts done and learn nothing, and its evaluations would
// read as a neutral mean reward. It is refused, saying why.
func probeVerifier(ctx context.Context, runner *reward.Runner, set *tasks.Set) error {
	ctx, cancel := context.WithTimeout(ctx, probeTime)
	defer cancel()
	n := min(probeTasks, len(set.Tasks))
	var why []string
	for _, task := range set.Tasks[:n] {
		reply := core.Message{Role: core.RoleAssistant, Content: answerText(task.Answer)}
		st := &core.Step{ID: core.StepID("probe-" + task.ID), Turn: core.TurnMain,
			Request:  core.Request{Messages: slices.Clone(task.Messages), Tools: task.Tools},
			Response: core.Response{Choices: []core.Choice{{Message: reply, FinishReason: "stop"}}}}
		sc, _ := runner.ScoreTask(ctx, verifierName, st, reward.Task{ID: task.ID, Answer: task.Answer, Meta: task.Meta})
		if sc.Value != nil {
			return nil
		}
		reason := sc.Reason
		if reason == "" {
			reason = "no reason given"
		}
		if !slices.Contains(why, reason) {
			why = append(why, reason)
		}
		if ctx.Err() != nil {
			why = append(why, fmt.Sprintf("the tries ran out of their %s", probeTime))
			break
		}
	}
	return fmt.Errorf("%w: the verifier scored none of the set's first %d tasks, each tried with its answer as the reply: it abstained or failed on every one (%s); "+
		"it would score no rollout. Fix the verifier (try it with 'clawmesh reward test') and add the set again",
		ErrTasks, n, clipReason(strings.Join(why, "; ")))
}

// answerText is a task's answer as a reply would give it: a JSON string's
// value, any other value's JSON text.
func answerText(answer json.RawMessage) string {
	var s string
	if json.Unmarshal(answer, &s) == nil {
		return s
	}
	return string(answer)
}

func clipReason(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// evaluate scores version, its bundle in dir, on ts's held-out split, as
// this trainer's evaluation.
func (t *Trainer) evaluate(ctx context.Context, cfg group.Config, dir string, version uint64, ts *group.TaskSet) (group.Eval, error) {
	rt, err := t.acquireRuntime(ctx, ts)
	if err != nil {
		return group.Eval{}, err
	}
	defer rt.release()
	ev, err := t.work.w.evaluate(ctx, cfg, dir, rt)
	if err != nil {
		return group.Eval{}, err
	}
	ev.Version, ev.Task, ev.By = version, ts.Hash, string(t.self)
	t.log.Info("version evaluated", "version", "v"+strconv.FormatUint(version, 10), "set", short(ts.Hash), "pass@1", ev.PassAt1, "mean_reward", ev.MeanReward,
		"abstained", ev.Abstained)
	if ev.MostlyAbstained() {
		t.log.Warn("the verifier abstained on most held-out prompts: the evaluation says little", "version", "v"+strconv.FormatUint(version, 10),
			"set", short(ts.Hash), "abstained", ev.Abstained, "prompts", ev.Prompts)
	}
	return ev, nil
}

func evalKey(v uint64, set string) string { return fmt.Sprintf("%d/%s", v, set) }

// evaluateCurrent scores the current version on the held-out split of
// every task set it has no evaluation on yet, and records the results in
// the lineage (the leader's loop, between rounds). A set it cannot score
// now is tried again after Timing.VerifyRetry; the rounds go on.
func (t *Trainer) evaluateCurrent(ctx context.Context, cfg group.Config) error {
	var (
		todo []*group.TaskSet
		cur  group.Version
	)
	t.group.view(func(s *group.State) {
		cur, _ = s.Current()
		for _, h := range s.Unevaluated() {
			if next, ok := t.evalLater[evalKey(cur.Version, h)]; ok && time.Now().Before(next) {
				continue
			}
			ts := *s.TaskSets[h]
			todo = append(todo, &ts)
		}
	})
	if len(todo) == 0 {
		return nil
	}
	dir, err := t.ensureVersion(ctx, cur)
	if err != nil {
		return err
	}
	for _, ts := range todo {
		ev, err := t.evaluate(ctx, cfg, dir, cur.Version, ts)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			// A set that cannot be scored now (its plugin not fetched, say)
			// must not hold the rounds up: try again later.
			t.evalLater[evalKey(cur.Version, ts.Hash)] = time.Now().Add(t.timing.VerifyRetry)
			t.log.Warn("version not evaluated yet: trying again later", "version", cur.Name(), "set", short(ts.Hash), "err", err)
			continue
		}
		if err := t.group.propose(ctx, &group.Entry{Eval: &ev}); err != nil {
			return err
		}
	}
	return nil
}

// evaluateChild scores the version about to be published (its bundle in
// dir) on the held-out split of every task set, so that the version is
// committed with its evaluations and its manifest carries them to the
// devices. A set it cannot score now is left to evaluateCurrent, after the
// version is committed.
func (t *Trainer) evaluateChild(ctx context.Context, cfg group.Config, dir string, version uint64) []group.Eval {
	var todo []*group.TaskSet
	t.group.view(func(s *group.State) {
		for _, ts := range s.SortedTaskSets() {
			if len(ts.HeldOut) > 0 {
				c := *ts
				todo = append(todo, &c)
			}
		}
	})
	var out []group.Eval
	for _, ts := range todo {
		ev, err := t.evaluate(ctx, cfg, dir, version, ts)
		if err != nil {
			if ctx.Err() == nil {
				t.log.Warn("new version not evaluated before publishing: it will be after", "version", "v"+strconv.FormatUint(version, 10), "set", short(ts.Hash), "err", err)
			}
			continue
		}
		out = append(out, ev)
	}
	return out
}

// newLocalRuntime makes a task runtime from a parsed set, a verifier file
// and a tool simulator file ("" for none), without a trainer.
func newLocalRuntime(ctx context.Context, set *tasks.Set, ts group.TaskSet, plugin, tools string) (*rolloutRuntime, error) {
	if set == nil {
		return nil, errors.New("trainer: no task set")
	}
	r, err := newTaskRunner(ctx, plugin, tools, nil)
	if err != nil {
		return nil, err
	}
	return &rolloutRuntime{ts: ts.WithDefaults(), set: set, byID: set.ByID(), runner: r}, nil
}
