package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/trainer/learn"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// TestTrainOnRecordedSteps goes from what the gateway records to an
// optimizer step: calls to `clawmesh serve --tiny` through a node, the
// recorded steps listed from the pool, rewarded, built into samples with the
// template serve renders with (Qwen3's), and trained on with learn.Learner
// on a native engine holding the very model that served them.
//
// The tiny model's replies are what Qwen3's template rewrites: it strips
// leading newlines and puts an empty <think> block before a reply without
// one, and sampled tokens need not be the ones the tokenizer would pick for
// the text. A sample is the sequence the model was fed and produced, so
// every recorded log-prob must be what the model gives its token at its
// place in the sample: checked here against the engine.
func TestTrainOnRecordedSteps(t *testing.T) {
	ctx := context.Background()
	_, gwAddr := serveAndNode(t)
	prompts := []string{"hello", "what is two plus two", "name a colour", "say something", "tell me a story", "why"}
	for i, p := range prompts {
		body := fmt.Sprintf(`{"model":"tiny","stream":%v,"max_tokens":8,"seed":%d,"messages":[{"role":"user","content":%q}]}`, i%2 == 0, i+1, p)
		resp, err := http.Post("http://"+gwAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	steps, err := nodeClient(gwAddr).List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != len(prompts) {
		t.Fatalf("%d steps recorded, want %d", len(steps), len(prompts))
	}

	// The model serve --tiny serves (seed 1), with the tokenizer and
	// template it serves with.
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	tok := txt.Tokenizer
	eng, err := native.NewTiny(cfg, 1, native.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	b := sample.NewBuilder(tok, txt.Renderer, sample.Options{})

	var afterThink, rewritten int
	for i, st := range steps {
		v := float64(1 - 2*(i%2))
		st.Reward = &core.Reward{Value: &v}
		smps, err := b.Build(st)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		s := smps[0]
		ch := st.Response.Choices[0]
		ids := make([]int, len(ch.Tokens))
		for k, tl := range ch.Tokens {
			ids[k] = tl.ID
		}
		_, completion, err := chat.ActionSpan(txt.Renderer, st.Request.Messages, nil, ch.Message)
		if err != nil {
			t.Fatal(err)
		}
		resp := tok.Encode(completion)
		switch {
		case slices.Equal(resp, ids), slices.Equal(resp[:len(resp)-1], ids):
		case hasSuffix(resp, ids), hasSuffix(resp[:len(resp)-1], ids):
			afterThink++ // the template puts a <think> block before them
		default:
			rewritten++ // the template does not give these ids back
		}
		if s.OldLogprobs == nil || !slices.Equal(s.Tokens[s.PromptLen:s.PromptLen+len(ids)], ids) {
			t.Fatalf("step %d: the sample's response %v does not start with the recorded ids %v", i, s.Tokens[s.PromptLen:], ids)
		}
		lps, err := eng.Logprobs(ctx, [][]int{s.Tokens}, false)
		if err != nil {
			t.Fatal(err)
		}
		var worst float64
		for k := range ids {
			p := s.PromptLen + k
			d := math.Abs(float64(s.OldLogprobs[p] - lps[0][p]))
			worst = max(worst, d)
			if d > 1e-3 {
				t.Errorf("step %d position %d (token %d): recorded log-prob %.5f, the model's %.5f", i, p, s.Tokens[p], s.OldLogprobs[p], lps[0][p])
			}
		}
		t.Logf("step %d: reply %q, %d recorded tokens, largest difference to the model's log-probs %.2g", i, ch.Message.Content, len(ids), worst)
	}
	t.Logf("of %d replies, %d re-render after an empty <think> block the model never saw, %d do not re-render", len(steps), afterThink, rewritten)

	before, err := eng.Logprobs(ctx, [][]int{tok.Encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi")}, false)
	if err != nil {
		t.Fatal(err)
	}
	l, err := learn.New(eng, b, learn.Options{Recipe: loss.RecipeRL})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Train(ctx, steps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("trained: %d samples used, %d with recorded log-probs, %d with some recomputed; loss %.4f, grad norm %.4f",
		rep.Used, rep.Recorded, rep.Recomputed, rep.Loss, rep.GradNorm)
	if rep.Used != len(steps) || rep.Rewarded != len(steps) || rep.BuildFailed != 0 || rep.Stale != 0 {
		t.Errorf("report %+v: want every step used and rewarded", rep)
	}
	if rep.OptSteps != 1 || rep.Version != 1 || rep.Tokens == 0 {
		t.Errorf("report %+v: want one optimizer step", rep)
	}
	// Every reply was recorded exactly, and its recording is used.
	if rep.Recorded != len(steps) {
		t.Errorf("%d samples used recorded log-probs, want %d", rep.Recorded, len(steps))
	}
	// "base" names no version: the steps are kept, counted unversioned.
	if rep.Unversioned != len(steps) {
		t.Errorf("%d unversioned samples, want %d", rep.Unversioned, len(steps))
	}
	after, _ := eng.Logprobs(ctx, [][]int{tok.Encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi")}, false)
	if slices.Equal(before[0], after[0]) {
		t.Error("the optimizer step left the policy as it was")
	}
}

func hasSuffix(s, suffix []int) bool {
	return len(suffix) <= len(s) && slices.Equal(s[len(s)-len(suffix):], suffix)
}
