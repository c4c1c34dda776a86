package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestServeSavedTiny checks --save-tiny and --model together: the tiny
// model written by `serve --tiny --save-tiny DIR` and served again by
// `serve --model DIR` (its config.json, safetensors and tokenizer.json, and
// Qwen3's template, as DIR has no tokenizer_config.json) gives a seeded
// completion the same text, token ids and log-probs as the original.
func TestServeSavedTiny(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	serveWith := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		addr := freeAddr(t)
		done := make(chan int, 1)
		var stderr strings.Builder
		go func() {
			done <- run(ctx, append([]string{"serve", "--listen", addr, "--log", "error"}, args...), io.Discard, &stderr)
		}()
		t.Cleanup(func() {
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("serve %v: exit %d: %s", args, code, stderr.String())
			}
		})
		waitHTTP(t, "http://"+addr+"/v1/models")
		return addr
	}
	type completion struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Logprobs struct {
				Content []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
				} `json:"content"`
			} `json:"logprobs"`
			TokenIDs     []int  `json:"token_ids"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	complete := func(addr string) completion {
		t.Helper()
		body := `{"model":"any","max_tokens":16,"seed":42,"temperature":1,"logprobs":true,"return_token_ids":true,` +
			`"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a tiny model?"}]}`
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", addr, resp.StatusCode, b)
		}
		var c completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || len(c.Choices[0].TokenIDs) == 0 || len(c.Choices[0].Logprobs.Content) != len(c.Choices[0].TokenIDs) {
			t.Fatalf("%s: want one choice with token ids and a log-prob each: %s", addr, b)
		}
		return c
	}

	tiny := serveWith("--tiny", "--seed", "3", "--save-tiny", dir)
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("--save-tiny did not write %s: %v", f, err)
		}
	}
	saved := serveWith("--model", dir, "--seed", "3")
	a, b := complete(tiny).Choices[0], complete(saved).Choices[0]
	t.Logf("--tiny: %q (%d tokens, %s); --model: %q", a.Message.Content, len(a.TokenIDs), a.FinishReason, b.Message.Content)
	if a.Message.Content != b.Message.Content || !slices.Equal(a.TokenIDs, b.TokenIDs) || a.FinishReason != b.FinishReason {
		t.Fatalf("the saved model answers otherwise:\n--tiny  %q %v %s\n--model %q %v %s",
			a.Message.Content, a.TokenIDs, a.FinishReason, b.Message.Content, b.TokenIDs, b.FinishReason)
	}
	for i := range a.Logprobs.Content {
		x, y := a.Logprobs.Content[i], b.Logprobs.Content[i]
		if x.Token != y.Token || x.Logprob != y.Logprob {
			t.Errorf("token %d: --tiny %q %v, --model %q %v", i, x.Token, x.Logprob, y.Token, y.Logprob)
		}
	}
	// A different seed is a different model: the comparison can tell.
	other := serveWith("--tiny", "--seed", "4")
	if c := complete(other).Choices[0]; slices.Equal(c.TokenIDs, a.TokenIDs) {
		t.Errorf("the tiny models of seeds 3 and 4 gave the same completion %v", c.TokenIDs)
	}
}
