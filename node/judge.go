package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// judgeMaxReply bounds what a judge reply may bring back.
const judgeMaxReply = 1 << 20

// judge asks the upstream LLM one prompt, directly (not through the gateway,
// so judge calls are not recorded as the agent's steps), and returns the
// reply's text. Reward plugins reach it through the "judge" host call. The
// model is Config.JudgeModel, else the one the judged step asked for.
func (n *Node) judge(ctx context.Context, prompt string) (string, error) {
	model := n.cfg.JudgeModel
	if model == "" {
		model, _ = ctx.Value(stepModelKey{}).(string)
	}
	if model == "" {
		return "", errNoJudgeModel
	}
	return Judge(n.cfg.Upstream, model, n.cfg.UpstreamToken)(ctx, prompt)
}

var errNoJudgeModel = errors.New("node: judge: no model: the step names none and judge_model (--judge-model) is not set")

type stepModelKey struct{}

// withStepModel carries the model step s asked for to the judge calls its
// scoring makes.
func withStepModel(ctx context.Context, s *core.Step) context.Context {
	m := s.Request.Model
	if m == "" {
		m = s.Model
	}
	if m == "" {
		m = s.Response.Model
	}
	return context.WithValue(ctx, stepModelKey{}, m)
}

// Judge returns a reward.Options.Judge that asks an OpenAI-compatible
// chat completions endpoint (upstream is its base URL, ending in /v1) one
// prompt with model, and returns the reply's text. token, if not "", is
// sent as a bearer token.
func Judge(upstream, model, token string) func(ctx context.Context, prompt string) (string, error) {
	url := strings.TrimSuffix(upstream, "/") + "/chat/completions"
	return func(ctx context.Context, prompt string) (string, error) {
		body, err := json.Marshal(map[string]any{
			"model":       model,
			"messages":    []map[string]string{{"role": "user", "content": prompt}},
			"temperature": 0.7,
			"max_tokens":  512,
		})
		if err != nil {
			return "", err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", fmt.Errorf("node: judge: %w", err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, judgeMaxReply))
		if err != nil {
			return "", fmt.Errorf("node: judge: %w", err)
		}
		if resp.StatusCode/100 != 2 {
			return "", fmt.Errorf("node: judge: upstream status %d: %.200s", resp.StatusCode, raw)
		}
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return "", fmt.Errorf("node: judge: bad reply: %w", err)
		}
		if len(out.Choices) == 0 {
			return "", fmt.Errorf("node: judge: reply has no choices")
		}
		return out.Choices[0].Message.Content, nil
	}
}
