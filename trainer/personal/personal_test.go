package personal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// The tests train personal adapters for the tiny model (2 layers, hidden
// 64) written as a model directory, on steps its own policy generated and
// a simulated user scored: alice, who likes replies that start with a
// word. Two threads, whatever the machine: every run is the same run.
const threads = 2

// testLR is fast enough for the tiny model to learn in one job.
const testLR = 1e-2

var alice = scenario.Users()[0]

func testOptions(base string) Options {
	return Options{Base: base, LR: testLR, Threads: threads}
}

// tinyBase writes the tiny model of seed 1 with its tokenizer as a model
// directory.
func tinyBase(t *testing.T) string {
	t.Helper()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "base")
	if err := native.CreateTiny(dir, cfg, 1); err != nil {
		t.Fatal(err)
	}
	if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// policy opens the base in dir with shared merged in ("": none) and
// adapter as its adapter ("": a fresh one, which changes nothing).
func policy(t *testing.T, dir, shared, adapter string) engine.Engine {
	t.Helper()
	ctx := context.Background()
	base, err := native.Open(ctx, dir, native.Options{Threads: threads, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	var eng engine.Engine = base
	if shared != "" {
		if err := base.LoadAdapter(ctx, shared); err != nil {
			t.Fatal(err)
		}
		if eng, err = base.MergeAdapter(); err != nil {
			t.Fatal(err)
		}
		base.Close()
	}
	if adapter != "" {
		if err := eng.LoadAdapter(ctx, adapter); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// rollout has eng answer each prompt n times, as the gateway records it
// (token ids and log-probs with exact fidelity, served by adapter), and
// alice score each reply ±1. Steps start one second apart from at.
func rollout(t *testing.T, eng engine.Engine, dir string, prompts []string, n int, seed uint64, adapter string, at time.Time) []*core.Step {
	t.Helper()
	txt, err := modeldir.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := txt.Tokenizer.TokenID("<|im_end|>")
	var steps []*core.Step
	for pi, p := range prompts {
		msgs := []core.Message{{Role: core.RoleUser, Content: p}}
		text, err := txt.Renderer.Render(msgs, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		prompt := txt.Tokenizer.Encode(text)
		for i := range n {
			ids, lps, err := eng.Generate(context.Background(), prompt, engine.GenOptions{
				MaxTokens: 6, Temperature: 1, Seed: seed*1000 + uint64(pi*n+i), Stop: []int{end}})
			if err != nil {
				t.Fatal(err)
			}
			finish, body := "length", ids
			if k := len(ids); k > 0 && ids[k-1] == end {
				finish, body = "stop", ids[:k-1]
			}
			reply := txt.Tokenizer.Decode(body)
			toks := make([]core.TokenLogprob, len(ids))
			for k, id := range ids {
				toks[k] = core.TokenLogprob{Token: txt.Tokenizer.Decode([]int{id}), ID: id, Logprob: float64(lps[k])}
			}
			r := -1.0
			if alice.Pref.Accepts(reply) {
				r = 1
			}
			id := fmt.Sprintf("s%d-p%d-r%d", seed, pi, i)
			steps = append(steps, &core.Step{
				ID: core.StepID(id), SessionID: core.SessionID(id), Turn: core.TurnMain, API: core.APIChat,
				State:   core.StateScored,
				Request: core.Request{Messages: msgs},
				Response: core.Response{Choices: []core.Choice{{
					Message:      core.Message{Role: core.RoleAssistant, Content: reply},
					FinishReason: finish, Tokens: toks, Fidelity: core.FidelityExact,
				}}},
				Adapter: adapter,
				Timings: core.Timings{Start: at.Add(time.Duration(len(steps)) * time.Second)},
				Reward:  &core.Reward{Value: &r, At: at},
			})
		}
	}
	return steps
}

// agreement measures, apart from Train, the share of the held-back steps on
// which eng's policy moved each reply's mean log-prob from its frozen
// base's the way alice's reward says, and the mean move of liked and of
// disliked replies.
func agreement(t *testing.T, eng engine.Engine, dir string, held []*core.Step) (share, liked, disliked float64) {
	t.Helper()
	txt, err := modeldir.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := sample.NewBuilder(txt.Tokenizer, txt.Renderer, sample.Options{})
	var seqs [][]int
	var masks [][]bool
	var rewards []float64
	for _, st := range held {
		smps, err := b.Build(st)
		if err != nil {
			t.Fatal(err)
		}
		seqs, masks, rewards = append(seqs, smps[0].Tokens), append(masks, smps[0].LossMask), append(rewards, *st.Reward.Value)
	}
	pol, err := eng.Logprobs(context.Background(), seqs, false)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := eng.Logprobs(context.Background(), seqs, true)
	if err != nil {
		t.Fatal(err)
	}
	var nl, nd int
	for i, r := range rewards {
		p, s := MeanLogprob(pol[i], masks[i]), MeanLogprob(ref[i], masks[i])
		share += Agrees(r, p, s)
		if r > 0 {
			liked += p - s
			nl++
		} else {
			disliked += p - s
			nd++
		}
	}
	if nl == 0 || nd == 0 {
		t.Fatalf("held-back steps: %d liked, %d disliked; want both", nl, nd)
	}
	return share / float64(len(rewards)), liked / float64(nl), disliked / float64(nd)
}

// meanReward is alice's mean reward of n fresh replies per prompt from eng.
func meanReward(t *testing.T, eng engine.Engine, dir string, prompts []string, seed uint64) float64 {
	t.Helper()
	var s float64
	steps := rollout(t, eng, dir, prompts, 16, seed, "", time.Time{})
	for _, st := range steps {
		s += *st.Reward.Value
	}
	return s / float64(len(steps))
}

func readConfig(t *testing.T, dir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTrainLearnsTheUsersPreference(t *testing.T) {
	ctx := context.Background()
	base := tinyBase(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pol := policy(t, base, "", "")
	// Served by the shared version alone, and by shared and personal
	// versions stacked: none may be dropped as stale.
	steps := rollout(t, pol, base, alice.Prompts, 16, 1, "v12-p3", t0)
	for _, st := range steps[:len(steps)/2] {
		st.Adapter = "v3"
	}
	held := rollout(t, pol, base, alice.HeldBack, 16, 2, "v12", t0)
	before := meanReward(t, pol, base, alice.HeldBack, 9)

	out1 := filepath.Join(t.TempDir(), "p1")
	res1, err := Train(ctx, testOptions(base), core.PersonalJob{SharedVersion: "v12", Steps: steps, HeldBack: held, Out: out1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first job: %+v", res1)
	if res1.Trained != len(steps) || res1.HeldBack != len(held) {
		t.Errorf("trained on %d of %d steps, scored %d of %d held back", res1.Trained, len(steps), res1.HeldBack, len(held))
	}
	if res1.ScoreBefore != 0.5 {
		t.Errorf("a fresh adapter scored %v before training, want 0.5 (the shared policy itself)", res1.ScoreBefore)
	}
	// Observed 0.69: the replies the policy now prefers take probability
	// from the other liked ones too, only less than from the disliked.
	if res1.ScoreAfter < 0.625 {
		t.Errorf("held-back score %v after the first job, want at least 0.625", res1.ScoreAfter)
	}
	if !(res1.Seconds > 0) {
		t.Errorf("seconds %v", res1.Seconds)
	}
	// The adapter written is the one scored, and it moves liked replies up
	// and disliked ones down.
	p1 := policy(t, base, "", out1)
	share, liked, disliked := agreement(t, p1, base, held)
	t.Logf("after the first job: share %.3f, liked replies %+.3f nats/token, disliked %+.3f", share, liked, disliked)
	if share != res1.ScoreAfter {
		t.Errorf("the adapter written scores %v, Train reported %v", share, res1.ScoreAfter)
	}
	if !(liked > disliked) {
		t.Errorf("mean log-prob moved %+.4f on liked replies, %+.4f on disliked ones; want liked ones up from disliked ones", liked, disliked)
	}
	c := readConfig(t, out1)
	abs, _ := filepath.Abs(base)
	if c["r"] != float64(DefaultRank) || c["base_model_name_or_path"] != abs {
		t.Errorf("adapter config: r %v, base %v; want %d, %s", c["r"], c["base_model_name_or_path"], DefaultRank, abs)
	}

	// The second job trains on from the first adapter, on steps it served.
	steps2 := rollout(t, p1, base, alice.Prompts, 16, 3, "v12-p1", t0.Add(time.Hour))
	out2 := filepath.Join(t.TempDir(), "p2")
	res2, err := Train(ctx, testOptions(base), core.PersonalJob{SharedVersion: "v12", Prev: out1, Steps: steps2, HeldBack: held, Out: out2, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second job: %+v", res2)
	if res2.ScoreBefore != res1.ScoreAfter {
		t.Errorf("second job's score before %v, the first adapter's %v", res2.ScoreBefore, res1.ScoreAfter)
	}
	if res2.ScoreAfter < res2.ScoreBefore {
		t.Errorf("held-back score fell: %v → %v", res2.ScoreBefore, res2.ScoreAfter)
	}
	p2 := policy(t, base, "", out2)
	_, liked2, disliked2 := agreement(t, p2, base, held)
	t.Logf("after the second job: liked replies %+.3f nats/token, disliked %+.3f", liked2, disliked2)
	if !(liked2-disliked2 > liked-disliked) {
		t.Errorf("second job: liked replies %+.4f → %+.4f, disliked %+.4f → %+.4f; want them further apart", liked, liked2, disliked, disliked2)
	}
	// The user gets what it likes more often on prompts never trained on.
	after := meanReward(t, p2, base, alice.HeldBack, 9)
	t.Logf("mean reward on held-back prompts: %+.3f → %+.3f", before, after)
	if after-before < 0.25 {
		t.Errorf("mean reward on held-back prompts %+.3f → %+.3f, want a gain of at least 0.25", before, after)
	}
}

func TestTrainRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	base := tinyBase(t)
	steps := rollout(t, policy(t, base, "", ""), base, alice.Prompts[:1], 2, 1, "v1", time.Time{})
	taken := filepath.Join(t.TempDir(), "taken")
	if err := os.Mkdir(taken, 0o755); err != nil {
		t.Fatal(err)
	}
	out := func() string { return filepath.Join(t.TempDir(), "out") }
	unscored := rollout(t, policy(t, base, "", ""), base, alice.Prompts[:1], 2, 1, "v1", time.Time{})
	for _, st := range unscored {
		st.Reward = nil
	}
	for _, c := range []struct {
		name string
		o    Options
		j    core.PersonalJob
		want error
		says string
	}{
		{"no base", Options{}, core.PersonalJob{Steps: steps, Out: out()}, ErrOptions, "no base model directory"},
		{"missing base", Options{Base: filepath.Join(t.TempDir(), "nothing")}, core.PersonalJob{Steps: steps, Out: out()}, os.ErrNotExist, "base"},
		{"bad recipe", Options{Base: base, Recipe: "sft"}, core.PersonalJob{Steps: steps, Out: out()}, ErrOptions, "want binary, opd or combined"},
		{"bad rank", Options{Base: base, Rank: -1}, core.PersonalJob{Steps: steps, Out: out()}, ErrOptions, "rank -1"},
		{"no output", testOptions(base), core.PersonalJob{Steps: steps}, ErrJob, "no output directory"},
		{"output exists", testOptions(base), core.PersonalJob{Steps: steps, Out: taken}, ErrJob, "exists"},
		{"no steps", testOptions(base), core.PersonalJob{Out: out()}, ErrNoSteps, "the job has none"},
		{"only nil steps", testOptions(base), core.PersonalJob{Steps: []*core.Step{nil}, Out: out()}, ErrNoSteps, "the job has none"},
		{"nothing to learn from", Options{Base: base, Recipe: "binary", Threads: threads}, core.PersonalJob{Steps: unscored, Out: out()}, ErrNoSteps, "2 without a reward"},
		{"missing previous adapter", testOptions(base), core.PersonalJob{Steps: steps, Prev: filepath.Join(t.TempDir(), "nothing"), Out: out()}, engine.ErrAdapter, "previous personal adapter"},
		{"missing shared adapter", testOptions(base), core.PersonalJob{Steps: steps, Shared: filepath.Join(t.TempDir(), "nothing"), Out: out()}, os.ErrNotExist, "shared adapter"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := Train(ctx, c.o, c.j)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Train = %+v, %v; want %v saying %q", res, err, c.want, c.says)
			}
			if c.j.Out != "" && c.j.Out != taken {
				if _, err := os.Stat(c.j.Out); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("output written on an error: %v", err)
				}
			}
		})
	}
	// A job whose output appears while it trains writes nothing over it.
	if entries, err := os.ReadDir(filepath.Dir(taken)); err != nil || len(entries) != 1 {
		t.Errorf("beside the output: %v, %v", entries, err)
	}
}

func TestTrainWithoutHeldBackScoresNothing(t *testing.T) {
	base := tinyBase(t)
	steps := rollout(t, policy(t, base, "", ""), base, alice.Prompts[:2], 4, 1, "v1", time.Time{})
	// Steps without a reward or with a reward of 0 cannot be scored.
	held := rollout(t, policy(t, base, "", ""), base, alice.HeldBack[:1], 2, 2, "v1", time.Time{})
	zero := 0.0
	held[0].Reward, held[1].Reward.Value = nil, &zero
	out := filepath.Join(t.TempDir(), "p")
	res, err := Train(context.Background(), testOptions(base), core.PersonalJob{Steps: steps, HeldBack: held, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if res.HeldBack != 0 || res.ScoreBefore != -1 || res.ScoreAfter != -1 || res.Trained != len(steps) {
		t.Errorf("result %+v; want nothing scored, -1 before and after, %d trained", res, len(steps))
	}
	if _, err := os.Stat(filepath.Join(out, "adapter_model.safetensors")); err != nil {
		t.Error(err)
	}
}

// A personal adapter is trained and scored on the base with the shared
// adapter merged in: the policy scored is base + shared + personal, against
// base + shared.
func TestTrainOnTheSharedVersion(t *testing.T) {
	ctx := context.Background()
	base := tinyBase(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// The shared version: learned from users who dislike what alice likes.
	others := rollout(t, policy(t, base, "", ""), base, alice.Prompts, 8, 4, "v1", t0)
	for _, st := range others {
		r := -*st.Reward.Value
		st.Reward.Value = &r
	}
	shared := filepath.Join(t.TempDir(), "v2")
	if _, err := Train(ctx, testOptions(base), core.PersonalJob{Steps: others, Out: shared, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	// The mesh names its base model its own way; the personal adapter
	// carries the shared one's name, so that the two stack.
	c := readConfig(t, shared)
	c["base_model_name_or_path"] = "Qwen/Qwen3-0.6B"
	b, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(shared, "adapter_config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// A personal adapter from before, trained on the base alone.
	prev := filepath.Join(t.TempDir(), "p1")
	onBase := rollout(t, policy(t, base, "", ""), base, alice.Prompts, 4, 5, "v1", t0)
	if _, err := Train(ctx, testOptions(base), core.PersonalJob{Steps: onBase, Out: prev, Seed: 4}); err != nil {
		t.Fatal(err)
	}

	served := policy(t, base, shared, prev)
	steps := rollout(t, served, base, alice.Prompts, 16, 6, "v2-p1", t0)
	held := rollout(t, served, base, alice.HeldBack, 16, 7, "v2-p1", t0)
	out := filepath.Join(t.TempDir(), "p2")
	res, err := Train(ctx, testOptions(base), core.PersonalJob{Shared: shared, SharedVersion: "v2", Prev: prev,
		Steps: steps, HeldBack: held, Out: out, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	before, _, _ := agreement(t, served, base, held)
	after, liked, disliked := agreement(t, policy(t, base, shared, out), base, held)
	if res.ScoreBefore != before || res.ScoreAfter != after {
		t.Errorf("Train scored %v → %v; base + shared + personal against base + shared scores %v → %v",
			res.ScoreBefore, res.ScoreAfter, before, after)
	}
	// Liked replies gain on disliked ones (the agreement score on a few
	// dozen held-back replies is too coarse to say more here).
	if !(liked > disliked) {
		t.Errorf("on the shared version: score %v → %v, liked replies moved %+.4f, disliked %+.4f", res.ScoreBefore, res.ScoreAfter, liked, disliked)
	}
	// Without the shared version, the same adapters score otherwise: the
	// comparison above tells the two apart.
	noBefore, _, _ := agreement(t, policy(t, base, "", prev), base, held)
	noAfter, _, _ := agreement(t, policy(t, base, "", out), base, held)
	t.Logf("without the shared version the adapters score %v → %v", noBefore, noAfter)
	if noBefore == before && noAfter == after {
		t.Fatalf("the shared version changes no score: the test cannot tell whether Train used it")
	}
	if got := readConfig(t, out)["base_model_name_or_path"]; got != "Qwen/Qwen3-0.6B" {
		t.Errorf("personal adapter's base %v, want the shared one's", got)
	}
}

func TestNewestKeepsTheNewestSteps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	step := func(id string, at time.Duration) *core.Step {
		return &core.Step{ID: core.StepID(id), Timings: core.Timings{Start: t0.Add(at)}}
	}
	ids := func(steps []*core.Step) string {
		var s []string
		for _, st := range steps {
			s = append(s, string(st.ID))
		}
		return strings.Join(s, ",")
	}
	in := []*core.Step{step("c", 3), nil, step("a", 1), step("d", 3), step("b", 2), step("z", 0)}
	for _, c := range []struct {
		n    int
		want string
	}{{10, "z,a,b,c,d"}, {3, "b,c,d"}, {1, "d"}, {0, ""}} {
		if got := ids(newest(in, c.n)); got != c.want {
			t.Errorf("newest %d: %s, want %s", c.n, got, c.want)
		}
	}
	if got := ids(newest(nil, MaxSteps)); got != "" {
		t.Errorf("newest of none: %s", got)
	}
}
