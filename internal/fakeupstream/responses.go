package fakeupstream

import (
	"encoding/json"
	"net/http"
)

func (c *call) respID() string { return "resp_fake_" + itoa(c.n) }

// respWantLogprobs reports whether the request's include asks for the
// log-probs of output_text parts.
func (c *call) respWantLogprobs() bool {
	var inc []string
	if json.Unmarshal(c.p.Include, &inc) != nil {
		return false
	}
	for _, v := range inc {
		if v == "message.output_text.logprobs" {
			return true
		}
	}
	return false
}

// respLogprobList is the log-probs of pieces, the first being piece first
// of the text, in the Responses shape: output_text parts carry each token's
// bytes, output_text.delta and .done events do not.
func respLogprobList(pieces []string, first int, bytes bool) []any {
	out := make([]any, 0, len(pieces))
	for k, p := range pieces {
		lp := map[string]any{"token": p, "logprob": tokenLogprob(first + k), "top_logprobs": []any{}}
		if bytes {
			bs := make([]int, len(p))
			for i := 0; i < len(p); i++ {
				bs[i] = int(p[i])
			}
			lp["bytes"] = bs
		}
		out = append(out, lp)
	}
	return out
}

// respPartLogprobs is the "logprobs" of the output_text part holding the
// whole text, in a whole response (and, streaming, OpenAI's done events):
// the tokens' log-probs when asked for, else [] as OpenAI writes it or null
// as vLLM does.
func (c *call) respPartLogprobs() any {
	if c.respWantLogprobs() {
		return respLogprobList(SplitText(c.t.Text, c.s.script.Chunks), 0, true)
	}
	if c.s.script.VLLM {
		return nil
	}
	return []any{}
}

func (c *call) respTextItem(text string, logprobs any) map[string]any {
	return map[string]any{"type": "message", "id": "msg_fake_" + itoa(c.n), "status": "completed", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": logprobs}}}
}

func (c *call) respFuncItem(j int, args string, status string) map[string]any {
	tc := c.toolCall(j)
	return map[string]any{"type": "function_call", "id": "fc_fake_" + itoa(c.n) + "_" + itoa(j), "call_id": tc.ID, "name": tc.Name,
		"arguments": args, "status": status}
}

func (c *call) respReasoningItem() map[string]any {
	return map[string]any{"type": "reasoning", "id": "rs_fake_" + itoa(c.n),
		"summary": []any{map[string]any{"type": "summary_text", "text": c.t.Reasoning}}}
}

func (c *call) respObject(status string, output []any) map[string]any {
	r := map[string]any{"id": c.respID(), "object": "response", "created_at": created, "status": status, "model": c.p.Model,
		"output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}}
	if status == "completed" {
		ct := c.completionTokens()
		r["usage"] = map[string]any{"input_tokens": c.s.script.PromptTokens, "output_tokens": ct, "total_tokens": c.s.script.PromptTokens + ct,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	}
	return r
}

func (c *call) respOutput() []any {
	out := []any{}
	if c.t.Reasoning != "" {
		out = append(out, c.respReasoningItem())
	}
	if c.t.Text != "" {
		out = append(out, c.respTextItem(c.t.Text, c.respPartLogprobs()))
	}
	for j := range c.t.ToolCalls {
		out = append(out, c.respFuncItem(j, c.toolCall(j).Arguments, "completed"))
	}
	return out
}

func (c *call) responses() {
	if c.p.Stream {
		c.responsesStream()
		return
	}
	writeJSON(c.w, http.StatusOK, c.respObject("completed", c.respOutput()))
}

func (c *call) responsesStream() {
	f := c.sseStart()
	seq := 0
	ev := func(name string, v map[string]any) bool {
		v["type"] = name
		v["sequence_number"] = seq
		seq++
		return c.send(f, name, mustJSON(v))
	}
	if !ev("response.created", map[string]any{"response": c.respObject("in_progress", []any{})}) ||
		!ev("response.in_progress", map[string]any{"response": c.respObject("in_progress", []any{})}) {
		return
	}
	oi := 0
	if c.t.Reasoning != "" {
		it := c.respReasoningItem()
		if !ev("response.output_item.added", map[string]any{"output_index": oi, "item": it}) ||
			!ev("response.output_item.done", map[string]any{"output_index": oi, "item": it}) {
			return
		}
		oi++
	}
	if c.t.Text != "" {
		itemID := "msg_fake_" + itoa(c.n)
		added := map[string]any{"type": "message", "id": itemID, "status": "in_progress", "role": "assistant", "content": []any{}}
		if !ev("response.output_item.added", map[string]any{"output_index": oi, "item": added}) ||
			!ev("response.content_part.added", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}}}) {
			return
		}
		want := c.respWantLogprobs()
		pieces := SplitText(c.t.Text, c.s.script.Chunks)
		for k, p := range pieces {
			if c.t.StreamErrorAfter > 0 && k == c.t.StreamErrorAfter {
				ev("error", map[string]any{"code": "server_error", "message": "scripted mid-stream failure", "param": nil})
				return
			}
			if !c.beforeChunk(k) {
				return
			}
			lps := []any{}
			if want {
				lps = respLogprobList([]string{p}, k, false)
			}
			if !ev("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0, "delta": p, "logprobs": lps}) {
				return
			}
		}
		// The done events: OpenAI repeats the log-probs there (or [] when
		// not asked); vLLM writes [] in output_text.done and none (null) in
		// the done part and item, asked or not.
		doneLps, partLps := any([]any{}), c.respPartLogprobs()
		switch {
		case c.s.script.VLLM:
			partLps = nil
		case want:
			doneLps = respLogprobList(pieces, 0, false)
		}
		part := map[string]any{"type": "output_text", "text": c.t.Text, "annotations": []any{}, "logprobs": partLps}
		if !ev("response.output_text.done", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0, "text": c.t.Text, "logprobs": doneLps}) ||
			!ev("response.content_part.done", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0, "part": part}) ||
			!ev("response.output_item.done", map[string]any{"output_index": oi, "item": c.respTextItem(c.t.Text, partLps)}) {
			return
		}
		oi++
	}
	for j := range c.t.ToolCalls {
		tc := c.toolCall(j)
		itemID := "fc_fake_" + itoa(c.n) + "_" + itoa(j)
		if !ev("response.output_item.added", map[string]any{"output_index": oi, "item": c.respFuncItem(j, "", "in_progress")}) {
			return
		}
		for _, part := range SplitText(tc.Arguments, 2) {
			if !ev("response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": oi, "delta": part}) {
				return
			}
		}
		if !ev("response.function_call_arguments.done", map[string]any{"item_id": itemID, "output_index": oi, "arguments": tc.Arguments}) ||
			!ev("response.output_item.done", map[string]any{"output_index": oi, "item": c.respFuncItem(j, tc.Arguments, "completed")}) {
			return
		}
		oi++
	}
	ev("response.completed", map[string]any{"response": c.respObject("completed", c.respOutput())})
}
