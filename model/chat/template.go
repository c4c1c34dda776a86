package chat

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Template renders a Jinja chat template (the chat_template of a Hugging
// Face tokenizer_config.json) with gonja, in an environment set up like
// transformers' apply_chat_template: trim_blocks and lstrip_blocks on,
// `tojson` writing Python's json.dumps(ensure_ascii=False) form with keys in
// their original order, and raise_exception. Messages are passed in
// OpenAI's shape: role, content (always a string), reasoning_content (only
// when set), tool_calls as {"type": "function", "function": {"name",
// "arguments"}} with the arguments as the model's JSON text; tools as
// {"type": "function", "function": {"name", "description", "parameters"}}.
type Template struct {
	tpl       *exec.Template
	env       *exec.Environment
	endOfTurn string
	extra     map[string]any
}

// TemplateOptions configures NewTemplate. The zero value gives the defaults.
type TemplateOptions struct {
	// EndOfTurn is the text closing an assistant turn (the eos_token),
	// used by ActionSpan; "" leaves ActionSpan without an end marker.
	EndOfTurn string
	// Vars are extra template variables (bos_token, enable_thinking, ...).
	Vars map[string]any
}

// NewTemplate compiles a Jinja chat template.
func NewTemplate(src string, opts TemplateOptions) (*Template, error) {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("raise_exception", func(msg string) (string, error) {
		return "", fmt.Errorf("%w: raise_exception: %s", ErrTemplate, msg)
	})
	env := &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	const name = "chat_template"
	loader, err := loaders.NewFileSystemLoader("")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	shifted, err := loaders.NewShiftedLoader(name, strings.NewReader(src), loader)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	tpl, err := exec.NewTemplate(name, cfg, shifted, env)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return &Template{tpl: tpl, env: env, endOfTurn: opts.EndOfTurn, extra: opts.Vars}, nil
}

// FromTokenizerConfig loads the chat_template of a tokenizer_config.json,
// with its eos_token as the end of turn and bos_token/eos_token as template
// variables.
func FromTokenizerConfig(path string) (*Template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		EOS          json.RawMessage `json:"eos_token"`
		BOS          json.RawMessage `json:"bos_token"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTemplate, path, err)
	}
	src, err := chatTemplateSource(cfg.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTemplate, path, err)
	}
	vars := map[string]any{}
	eos := tokenString(cfg.EOS)
	if eos != "" {
		vars["eos_token"] = eos
	}
	if bos := tokenString(cfg.BOS); bos != "" {
		vars["bos_token"] = bos
	}
	return NewTemplate(src, TemplateOptions{EndOfTurn: endOfTurn(src, eos), Vars: vars})
}

// endOfTurn is what closes an assistant turn in templates written with src:
// ChatML's <|im_end|> when the template writes it (Qwen's base models name
// <|endoftext|> as their eos_token, yet their template ends every turn with
// <|im_end|>), else the eos_token.
func endOfTurn(src, eos string) string {
	if strings.Contains(src, "<|im_end|>") {
		return "<|im_end|>"
	}
	return eos
}

// chatTemplateSource accepts a template string or the list form
// [{"name": "default", "template": ...}, ...].
func chatTemplateSource(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && s != "" {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err == nil {
		for _, t := range list {
			if t.Name == "default" {
				return t.Template, nil
			}
		}
	}
	return "", fmt.Errorf("no chat_template")
}

// tokenString reads a special token given as a string or as an AddedToken
// object {"content": ...}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// EndOfTurn implements TurnEnder.
func (t *Template) EndOfTurn() string { return t.endOfTurn }

// Render implements Renderer.
func (t *Template) Render(msgs []core.Message, tools []core.Tool, addGenerationPrompt bool) (string, error) {
	if len(msgs) == 0 {
		return "", ErrEmpty
	}
	vars := map[string]any{}
	for k, v := range t.extra {
		vars[k] = v
	}
	ms := make([]any, len(msgs))
	for i, m := range msgs {
		mm := map[string]any{"role": m.Role, "content": m.Content}
		if m.Reasoning != "" {
			mm["reasoning_content"] = m.Reasoning
		}
		if m.Name != "" {
			mm["name"] = m.Name
		}
		if m.ToolCallID != "" {
			mm["tool_call_id"] = m.ToolCallID
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]any, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				fn := map[string]any{"name": c.Name, "arguments": c.Arguments}
				calls[j] = map[string]any{"id": c.ID, "type": "function", "function": fn}
			}
			mm["tool_calls"] = calls
		}
		ms[i] = mm
	}
	vars["messages"] = ms
	if len(tools) > 0 {
		ts := make([]any, len(tools))
		for i, tl := range tools {
			raw, err := toolJSON(tl.Name, tl.Description, tl.Parameters)
			if err != nil {
				return "", err
			}
			// Decoded for the template's attribute access; orderedJSON keeps
			// the original text for tojson.
			var v map[string]any
			if err := json.Unmarshal(raw, &v); err != nil {
				return "", fmt.Errorf("%w: %v", ErrBadJSON, err)
			}
			ts[i] = orderedJSON{m: v, raw: raw}
		}
		vars["tools"] = ts
	}
	vars["add_generation_prompt"] = addGenerationPrompt
	out, err := t.tpl.ExecuteToString(exec.NewContext(vars))
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return out, nil
}

// orderedJSON is a JSON object passed to a template: gonja sees its fields,
// tojson writes its original text in its original key order.
type orderedJSON struct {
	m   map[string]any
	raw json.RawMessage
}

// GetAttribute gives templates the object's fields (tool.function.name).
func (o orderedJSON) GetAttribute(name string) (*exec.Value, bool) {
	v, ok := o.m[name]
	return exec.AsValue(v), ok
}

// GetItem gives templates the object's fields (tool["function"]).
func (o orderedJSON) GetItem(key any) (*exec.Value, bool) {
	k, _ := key.(string)
	v, ok := o.m[k]
	return exec.AsValue(v), ok
}

func filterToJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	var raw []byte
	switch v := in.Interface().(type) {
	case orderedJSON:
		raw = v.raw
	default:
		var err error
		raw, err = json.Marshal(v) // maps: keys sorted, the only stable order
		if err != nil {
			return exec.AsValue(fmt.Errorf("%w: tojson: %v", ErrTemplate, err))
		}
	}
	s, err := pyJSON(raw)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(s)
}
