package fakeupstream

import "net/http"

func (c *call) respID() string { return "resp_fake_" + itoa(c.n) }

func (c *call) respTextItem(text string) map[string]any {
	return map[string]any{"type": "message", "id": "msg_fake_" + itoa(c.n), "status": "completed", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
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
		out = append(out, c.respTextItem(c.t.Text))
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
				"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}}) {
			return
		}
		for k, p := range SplitText(c.t.Text, c.s.script.Chunks) {
			if c.t.StreamErrorAfter > 0 && k == c.t.StreamErrorAfter {
				ev("error", map[string]any{"code": "server_error", "message": "scripted mid-stream failure", "param": nil})
				return
			}
			if !c.beforeChunk(k) {
				return
			}
			if !ev("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0, "delta": p, "logprobs": []any{}}) {
				return
			}
		}
		part := map[string]any{"type": "output_text", "text": c.t.Text, "annotations": []any{}}
		if !ev("response.output_text.done", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0, "text": c.t.Text, "logprobs": []any{}}) ||
			!ev("response.content_part.done", map[string]any{"item_id": itemID, "output_index": oi, "content_index": 0, "part": part}) ||
			!ev("response.output_item.done", map[string]any{"output_index": oi, "item": c.respTextItem(c.t.Text)}) {
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
