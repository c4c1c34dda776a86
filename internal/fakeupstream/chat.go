package fakeupstream

import (
	"encoding/json"
	"net/http"
)

const created = 1700000000

var null = json.RawMessage("null")

type chatFunc struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type chatToolCall struct {
	Index    *int     `json:"index,omitempty"`
	ID       string   `json:"id,omitempty"`
	Type     string   `json:"type,omitempty"`
	Function chatFunc `json:"function"`
}

type chatMessage struct {
	Role             string         `json:"role,omitempty"`
	Content          *string        `json:"content,omitempty"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []chatToolCall `json:"tool_calls,omitempty"`
}

type chatLogprob struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []int   `json:"bytes"`
	TopLogprobs []any   `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      *chatMessage    `json:"message,omitempty"`
	Delta        *chatMessage    `json:"delta,omitempty"`
	Logprobs     *chatLogprobs   `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	TokenIDs     json.RawMessage `json:"token_ids,omitempty"`
}

type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatCompletion struct {
	ID             string          `json:"id"`
	Object         string          `json:"object"`
	Created        int             `json:"created"`
	Model          string          `json:"model"`
	Choices        []chatChoice    `json:"choices"`
	Usage          *chatUsage      `json:"usage,omitempty"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
}

func (c *call) usage() *chatUsage {
	ct := c.completionTokens() * c.p.N
	return &chatUsage{PromptTokens: c.s.script.PromptTokens, CompletionTokens: ct, TotalTokens: c.s.script.PromptTokens + ct}
}

func logprobsFor(pieces []string, first int) *chatLogprobs {
	lp := &chatLogprobs{Content: make([]chatLogprob, 0, len(pieces))}
	for k, p := range pieces {
		bs := make([]int, len(p))
		for i := 0; i < len(p); i++ {
			bs[i] = int(p[i])
		}
		lp.Content = append(lp.Content, chatLogprob{Token: p, Logprob: tokenLogprob(first + k), Bytes: bs, TopLogprobs: []any{}})
	}
	return lp
}

func idsFor(n, first int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = tokenID(first + i)
	}
	return ids
}

func (c *call) chat() {
	if c.p.Stream {
		c.chatStream()
		return
	}
	out := chatCompletion{ID: "chatcmpl-fake-" + itoa(c.n), Object: "chat.completion", Created: created, Model: c.p.Model, Usage: c.usage()}
	if c.p.ReturnTokenIDs {
		out.PromptTokenIDs = mustJSON(c.promptTokenIDs())
	} else if c.s.script.VLLM {
		out.PromptTokenIDs = null
	}
	fr := c.finish()
	for i := 0; i < c.p.N; i++ {
		text := c.textFor(i)
		m := &chatMessage{Role: "assistant", ReasoningContent: c.t.Reasoning}
		if text != "" || len(c.t.ToolCalls) == 0 {
			m.Content = &text
		}
		for j := range c.t.ToolCalls {
			tc := c.toolCall(j)
			m.ToolCalls = append(m.ToolCalls, chatToolCall{ID: tc.ID, Type: "function", Function: chatFunc{Name: tc.Name, Arguments: tc.Arguments}})
		}
		ch := chatChoice{Index: i, Message: m, FinishReason: &fr}
		pieces := SplitText(text, c.s.script.Chunks)
		if c.p.Logprobs {
			ch.Logprobs = logprobsFor(pieces, 0)
		}
		if c.p.ReturnTokenIDs {
			ch.TokenIDs = mustJSON(idsFor(len(pieces), 0))
		} else if c.s.script.VLLM {
			ch.TokenIDs = null
		}
		out.Choices = append(out.Choices, ch)
	}
	writeJSON(c.w, http.StatusOK, out)
}

func (c *call) chatChunk(choices []chatChoice) []byte {
	b, _ := json.Marshal(chatCompletion{ID: "chatcmpl-fake-" + itoa(c.n), Object: "chat.completion.chunk", Created: created, Model: c.p.Model, Choices: choices})
	return b
}

func (c *call) chatStream() {
	f := c.sseStart()
	one := func(ch chatChoice) bool { return c.send(f, "", c.chatChunk([]chatChoice{ch})) }

	// Role chunk for every choice; the first carries prompt token ids.
	for i := 0; i < c.p.N; i++ {
		empty := ""
		d := &chatMessage{Role: "assistant", Content: &empty}
		if i == 0 && c.p.ReturnTokenIDs {
			b, _ := json.Marshal(chatCompletion{ID: "chatcmpl-fake-" + itoa(c.n), Object: "chat.completion.chunk", Created: created, Model: c.p.Model,
				Choices: []chatChoice{{Index: i, Delta: d}}, PromptTokenIDs: mustJSON(c.promptTokenIDs())})
			if !c.send(f, "", b) {
				return
			}
			continue
		}
		if !one(chatChoice{Index: i, Delta: d}) {
			return
		}
	}
	if c.t.Reasoning != "" {
		for i := 0; i < c.p.N; i++ {
			if !one(chatChoice{Index: i, Delta: &chatMessage{ReasoningContent: c.t.Reasoning}}) {
				return
			}
		}
	}
	// Text chunks, choices interleaved.
	pieces := make([][]string, c.p.N)
	most := 0
	for i := range pieces {
		pieces[i] = SplitText(c.textFor(i), c.s.script.Chunks)
		most = max(most, len(pieces[i]))
	}
	for k := 0; k < most; k++ {
		if c.t.StreamErrorAfter > 0 && k == c.t.StreamErrorAfter {
			c.send(f, "", mustJSON(errObj("server_error", "scripted mid-stream failure")))
			if c.t.DoneAfterError {
				c.send(f, "", []byte("[DONE]"))
			}
			return
		}
		if !c.beforeChunk(k) {
			return
		}
		for i := 0; i < c.p.N; i++ {
			if k >= len(pieces[i]) {
				continue
			}
			p := pieces[i][k]
			ch := chatChoice{Index: i, Delta: &chatMessage{Content: &p}}
			if c.p.Logprobs {
				ch.Logprobs = logprobsFor([]string{p}, k)
			}
			if c.p.ReturnTokenIDs {
				ch.TokenIDs = mustJSON([]int{tokenID(k)})
			}
			if !one(ch) {
				return
			}
		}
	}
	// Tool calls.
	for i := 0; i < c.p.N; i++ {
		for j := range c.t.ToolCalls {
			tc := c.toolCall(j)
			idx := j
			if c.s.script.OllamaToolIndex {
				idx = 0
				if !one(chatChoice{Index: i, Delta: &chatMessage{ToolCalls: []chatToolCall{{Index: &idx, ID: tc.ID, Type: "function", Function: chatFunc{Name: tc.Name, Arguments: tc.Arguments}}}}}) {
					return
				}
				continue
			}
			if !one(chatChoice{Index: i, Delta: &chatMessage{ToolCalls: []chatToolCall{{Index: &idx, ID: tc.ID, Type: "function", Function: chatFunc{Name: tc.Name}}}}}) {
				return
			}
			for _, part := range SplitText(tc.Arguments, 2) {
				if !one(chatChoice{Index: i, Delta: &chatMessage{ToolCalls: []chatToolCall{{Index: &idx, Function: chatFunc{Arguments: part}}}}}) {
					return
				}
			}
		}
	}
	fr := c.finish()
	for i := 0; i < c.p.N; i++ {
		if !one(chatChoice{Index: i, Delta: &chatMessage{}, FinishReason: &fr}) {
			return
		}
	}
	if c.p.StreamOptions != nil && c.p.StreamOptions.IncludeUsage {
		b, _ := json.Marshal(chatCompletion{ID: "chatcmpl-fake-" + itoa(c.n), Object: "chat.completion.chunk", Created: created, Model: c.p.Model, Choices: []chatChoice{}, Usage: c.usage()})
		if !c.send(f, "", b) {
			return
		}
	}
	if !c.t.NoDone {
		c.send(f, "", []byte("[DONE]"))
	}
}
