package swap

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/trainer/adapter"
)

// writeAdapter writes a PEFT adapter of rank r adapting modules (of a
// model with hidden size 8, one layer) and returns its directory. seed
// varies its values, so that two adapters differ in bytes.
func writeAdapter(t testing.TB, r int, modules []string, seed float32) string {
	t.Helper()
	cfg, err := json.Marshal(map[string]any{
		"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": modules,
		"task_type": "CAUSAL_LM", "base_model_name_or_path": "meta-llama/Llama-3.2-1B",
	})
	if err != nil {
		t.Fatal(err)
	}
	b := adapter.Bundle{Config: cfg}
	for _, m := range modules {
		pre := "base_model.model.model.layers.0.self_attn." + m
		a := make([]float32, r*8)
		for i := range a {
			a[i] = seed + float32(i)/100
		}
		b.Tensors = append(b.Tensors,
			adapter.Tensor{Name: pre + ".lora_A.weight", Shape: []int{r, 8}, Data: a},
			adapter.Tensor{Name: pre + ".lora_B.weight", Shape: []int{8, r}, Data: make([]float32, 8*r)})
	}
	slices.SortFunc(b.Tensors, func(x, y adapter.Tensor) int { return strings.Compare(x.Name, y.Name) })
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ctxT is a context that ends with the test, bounded so that a stuck
// server fails the test instead of hanging it.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// serveFake serves h on 127.0.0.1 until the test ends and returns its URL.
func serveFake(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads r's JSON body into v, answering 400 (true) if it is not.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": "bad JSON: " + err.Error(), "type": "BadRequestError", "code": 400}})
		return false
	}
	return true
}

// warmRequest is the part of a chat completion request the fakes check.
type warmRequest struct {
	Model     string `json:"model"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	Messages  []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
}

// checkWarm answers 400 (false) to a chat completion that is not a small
// warm-up: every warm-up asks for one token, unstreamed.
func checkWarm(w http.ResponseWriter, req warmRequest) bool {
	if req.MaxTokens != 1 || req.Stream || len(req.Messages) != 1 || req.Messages[0].Role != "user" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": fmt.Sprintf("not a warm-up: %+v", req), "type": "BadRequestError", "code": 400}})
		return false
	}
	return true
}

// completion is an OpenAI chat completion answered by model.
func completion(model string) map[string]any {
	return map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "Hello"}, "finish_reason": "length"}},
		"usage":   map[string]any{"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
	}
}

// readRank reads r and target_modules of the adapter at dir, as a server
// that sees the node's files does; ok is false when there is no adapter.
func readRank(dir string) (rank int, modules []string, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		return 0, nil, false
	}
	if _, err := os.Stat(filepath.Join(dir, "adapter_model.safetensors")); err != nil {
		return 0, nil, false
	}
	var c struct {
		R             int      `json:"r"`
		TargetModules []string `json:"target_modules"`
	}
	if json.Unmarshal(b, &c) != nil {
		return 0, nil, false
	}
	return c.R, c.TargetModules, true
}

func contains(err error, subs ...string) bool {
	if err == nil {
		return false
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			return false
		}
	}
	return true
}
