package trainer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/tasks"
)

// scriptedEngine is a fake engine for unit tests of episodes: Generate
// answers its replies in turn (as token ids, each with log-prob -0.5) and
// keeps the prompts it was given.
type scriptedEngine struct {
	engine.Engine // the methods an episode does not call panic
	replies       [][]int
	prompts       [][]int
}

func (e *scriptedEngine) Generate(ctx context.Context, prompt []int, o engine.GenOptions) ([]int, []float32, error) {
	if len(e.prompts) >= len(e.replies) {
		return nil, nil, errors.New("scripted engine: no more replies")
	}
	e.prompts = append(e.prompts, prompt)
	ids := e.replies[len(e.prompts)-1]
	lps := make([]float32, len(ids))
	for i := range lps {
		lps[i] = -0.5
	}
	return ids, lps, nil
}

// TestToolEpisode: a task that declares a tool runs as a multi-turn
// episode without any outside service: the model's tool call is answered
// by the tool simulator plugin (a calculator built here), the result is
// in the next turn's prompt, each model turn is a step with its exact
// token ids and log-probs, and the verifier's verdict on the final answer
// is every turn's reward.
// toolSet is a set of two tasks that declare an add tool, answered by the
// calculator plugin, checked by the charset verifier; call is a reply that
// calls add(2, 3), end the end-of-turn token.
func toolSet(t *testing.T) (tok *tokenizer.Tokenizer, end int, set *tasks.Set, rt *rolloutRuntime, call []int) {
	t.Helper()
	tok, err := tokenizer.Tiny(tokenizer.TinyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	end, _ = tok.TokenID("<|im_end|>")
	line := `{"id":"sum","messages":[{"role":"user","content":"What is 2+3? Use the add tool."}],` +
		`"tools":[{"name":"add","description":"a + b","parameters":{"type":"object"}}],"answer":"0123456789","meta":{"max_tokens":64,"max_turns":3}}`
	set, err = tasks.Parse(strings.NewReader(line + "\n" + strings.Replace(line, `"sum"`, `"other"`, 1) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := group.TaskSet{Hash: set.Hash, Reward: set.Hash, Tools: set.Hash, Group: 2}
	rt = localRuntime(t, set, ts, charsetPlugin(t), testPlugin(t, "calc"))
	call = tok.Encode("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>")
	return tok, end, set, rt, call
}

func TestToolEpisode(t *testing.T) {
	tok, end, set, rt, call := toolSet(t)
	answer := tok.Encode("5")
	eng := &scriptedEngine{replies: [][]int{append(call, end), append(answer, end)}}
	w := &worker{eng: eng, tok: tok, render: chat.Qwen3()}
	steps, sc, n, err := w.episode(context.Background(), rt, set.Tasks[0], 3, 1, 7, "ep")
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 2 || len(eng.prompts) != 2 || n != len(call)+len(answer)+2 {
		t.Fatalf("%d steps, %d prompts, %d tokens", len(steps), len(eng.prompts), n)
	}
	first := steps[0].Response.Choices[0]
	if len(first.Message.ToolCalls) != 1 || first.Message.ToolCalls[0].Name != "add" || first.Fidelity != core.FidelityExact {
		t.Fatalf("first turn %+v", first)
	}
	if !strings.Contains(tok.Decode(eng.prompts[1]), "<tool_response>\n5\n</tool_response>") {
		t.Fatalf("the tool's result is not in the second prompt:\n%s", tok.Decode(eng.prompts[1]))
	}
	second := steps[1]
	if msgs := second.Request.Messages; len(msgs) != 3 || msgs[2].Role != core.RoleTool || msgs[2].Content != "5" || msgs[2].IsError {
		t.Fatalf("second turn's context %+v", msgs)
	}
	for i, st := range steps {
		c := st.Response.Choices[0]
		if len(c.Tokens) != len(eng.replies[i]) || c.Tokens[0].ID != eng.replies[i][0] || c.Tokens[0].Logprob != -0.5 ||
			len(st.Response.PromptTokenIDs) != len(eng.prompts[i]) {
			t.Fatalf("turn %d not recorded exactly: %+v", i, c.Tokens)
		}
		if st.Reward == nil || st.Reward.Value == nil || *st.Reward.Value != 1 {
			t.Fatalf("turn %d reward %+v", i, st.Reward)
		}
	}
	if sc.Value == nil || *sc.Value != 1 {
		t.Fatalf("verdict %+v", sc)
	}

	// A call to a tool the simulator does not know comes back as an error
	// result, and the episode goes on.
	bad := tok.Encode("<tool_call>\n{\"name\": \"mul\", \"arguments\": {}}\n</tool_call>")
	eng = &scriptedEngine{replies: [][]int{append(bad, end), append(tok.Encode("x"), end)}}
	w.eng = eng
	steps, sc, _, err = w.episode(context.Background(), rt, set.Tasks[0], 3, 1, 7, "ep2")
	if err != nil {
		t.Fatal(err)
	}
	if tm := steps[1].Request.Messages[2]; !tm.IsError || !strings.Contains(tm.Content, "no tool") {
		t.Fatalf("tool message %+v", tm)
	}
	if sc.Value == nil || *sc.Value >= 0 {
		t.Fatalf("a wrong final answer scored %+v", sc)
	}

	// A set without a tool simulator runs one turn.
	rt1 := localRuntime(t, set, group.TaskSet{Hash: set.Hash, Reward: set.Hash, Group: 2}, charsetPlugin(t), nil)
	eng = &scriptedEngine{replies: [][]int{append(call, end)}}
	w.eng = eng
	if steps, _, _, err = w.episode(context.Background(), rt1, set.Tasks[0], 3, 1, 7, "ep3"); err != nil || len(steps) != 1 {
		t.Fatalf("%d steps, %v", len(steps), err)
	}
}

// TestRolloutEpisodes: a prompt's G episodes come back with every turn
// tagged with the prompt's item and its episode, so the learner normalises
// the episodes of one prompt together and gives each turn its episode's
// advantage, however many turns the episode took.
func TestRolloutEpisodes(t *testing.T) {
	tok, end, set, rt, call := toolSet(t)
	// Episode 0: a tool call, then the right answer (two turns); episode
	// 1: a wrong answer at once (one turn).
	eng := &scriptedEngine{replies: [][]int{append(call, end), append(tok.Encode("5"), end), append(tok.Encode("x"), end)}}
	w := &worker{eng: eng, tok: tok, render: chat.Qwen3()}
	item := rolloutItem{id: "item-1", task: set.Tasks[0], rt: rt}
	steps, tags, st, err := w.rollouts(context.Background(), []rolloutItem{item}, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 || st.Prompts != 1 || st.Samples != 2 || st.Flat != 0 {
		t.Fatalf("%d steps, %+v", len(steps), st)
	}
	want := []episodeTag{{"item-1", "0"}, {"item-1", "0"}, {"item-1", "1"}}
	for i, s := range steps {
		if tags[s] != want[i] {
			t.Fatalf("step %d (%s): tag %+v, want %+v", i, s.ID, tags[s], want[i])
		}
	}
	if *steps[0].Reward.Value != *steps[1].Reward.Value || *steps[0].Reward.Value <= *steps[2].Reward.Value {
		t.Fatalf("rewards %v %v %v", *steps[0].Reward.Value, *steps[1].Reward.Value, *steps[2].Reward.Value)
	}
}

func TestSplitToolCalls(t *testing.T) {
	text, calls := splitToolCalls("I will add.<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call> then <tool_call>not json</tool_call><tool_call>{\"name\":\"x\",\"arguments\":\"{}\"}</tool_call>", 2)
	if text != "I will add. then" || len(calls) != 2 || calls[0].ID != "call_2_0" || calls[0].Arguments != `{"a": 1}` || calls[1].Name != "x" || calls[1].Arguments != "{}" {
		t.Fatalf("%q %+v", text, calls)
	}
	if text, calls := splitToolCalls("<tool_call>{\"name\":\"a\"}", 0); text != "<tool_call>{\"name\":\"a\"}" || calls != nil {
		t.Fatalf("unclosed: %q %+v", text, calls)
	}
}
