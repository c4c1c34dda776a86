package scrub

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// StepOptions say how Step treats a step beyond its text.
type StepOptions struct {
	// Key is the device's own secret for HashID (at least 16 bytes). It
	// never leaves the device: the hashes it makes are stable there and
	// cannot be linked to the ids, or to each other, anywhere else.
	Key []byte
	// Tools names the tools whose results may leave the device; the result
	// of a call to any other tool is replaced by Withheld. "*" lets every
	// tool's result leave (scrubbed).
	Tools []string
}

// ErrKey reports a missing or short StepOptions.Key.
var ErrKey = errors.New("scrub: the id key must be at least 16 bytes")

// HashID is the keyed hash that replaces one of our ids (a session, chain or
// step id) in what leaves the device: HMAC-SHA-256 under the device's key,
// over the id's kind and value, 24 hex digits. An empty id stays empty.
func HashID(key []byte, kind, id string) string {
	if id == "" {
		return ""
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(kind))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil)[:12])
}

// Hour rounds a time down to its hour, in UTC: exact times do not leave the
// device. The zero time stays zero.
func Hour(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Hour)
}

// keptParams are the request parameters a scrubbed step keeps: how the
// reply was sampled. Everything else (user, metadata, prompt_cache_key,
// previous_response_id, seed, ...) can identify the user or the device.
var keptParams = map[string]bool{
	"temperature": true, "top_p": true, "top_k": true, "min_p": true, "max_tokens": true,
	"max_completion_tokens": true, "max_output_tokens": true, "n": true, "stop": true,
	"stop_sequences": true, "tool_choice": true, "parallel_tool_calls": true, "response_format": true,
	"reasoning_effort": true, "reasoning": true, "thinking": true, "presence_penalty": true,
	"frequency_penalty": true, "repetition_penalty": true, "logprobs": true, "top_logprobs": true,
	"stream": true, "text": true, "chat_template_kwargs": true, "enable_thinking": true,
}

// Step returns a scrubbed copy of in, with placeholders numbered in t (one
// Table per session keeps them consistent across its steps). The copy
// keeps what learning needs: the messages, tools, replies and next state
// (scrubbed; tool results the policy does not allow withheld), the rewards
// and hints (scrubbed), the plugin hashes, the model and adapter version;
// its ids are keyed hashes and its times rounded to the hour. A reply that
// scrubbing changed loses its recorded tokens and is marked
// core.FidelityScrubbed; the prompt's token ids are kept only when the
// prompt came through unchanged. Other fields (the upstream's URL and
// response id, trace id, exact timings, upstream errors, non-text parts)
// are dropped.
func (p *Pass) Step(t *Table, in *core.Step, o *StepOptions) (*core.Step, error) {
	if len(o.Key) < 16 {
		return nil, ErrKey
	}
	k := o.Key
	out := &core.Step{
		ID:                 core.StepID(HashID(k, "step", string(in.ID))),
		SessionID:          core.SessionID(HashID(k, "session", string(in.SessionID))),
		ChainID:            core.ChainID(HashID(k, "chain", string(in.ChainID))),
		ParentID:           core.StepID(HashID(k, "step", string(in.ParentID))),
		Turn:               in.Turn,
		API:                in.API,
		State:              in.State,
		Model:              p.Text(t, in.Model),
		Adapter:            p.Text(t, in.Adapter),
		Timings:            core.Timings{Start: Hour(in.Timings.Start)},
		ClientDisconnected: in.ClientDisconnected,
		Source:             in.Source,
	}
	tools := toolsOf(in)
	allowAll := slices.Contains(o.Tools, "*")
	allowed := func(m *core.Message) bool {
		if allowAll {
			return true
		}
		name := m.Name
		if name == "" {
			name = tools[m.ToolCallID]
		}
		return name != "" && slices.Contains(o.Tools, name)
	}
	promptChanged := false
	out.Request = core.Request{
		Model:    p.Text(t, in.Request.Model),
		Messages: p.messages(t, in.Request.Messages, allowed, &promptChanged),
		Tools:    p.tools(t, in.Request.Tools, &promptChanged),
		Params:   p.params(t, in.Request.Params),
	}
	r := &in.Response
	out.Response = core.Response{Model: p.Text(t, r.Model), Status: r.Status}
	if r.Usage != nil {
		u := *r.Usage
		out.Response.Usage = &u
	}
	if !promptChanged && len(r.PromptTokenIDs) > 0 {
		out.Response.PromptTokenIDs = slices.Clone(r.PromptTokenIDs)
	}
	for _, c := range r.Choices {
		changed := false
		oc := core.Choice{Index: c.Index, FinishReason: c.FinishReason}
		oc.Message = p.message(t, &c.Message, allowed, &changed)
		if changed {
			oc.Fidelity = core.FidelityScrubbed
		} else {
			oc.Tokens = slices.Clone(c.Tokens)
			oc.Fidelity = c.Fidelity
		}
		out.Response.Choices = append(out.Response.Choices, oc)
	}
	if ns := in.NextState; ns != nil {
		var ignore bool
		out.NextState = &core.NextState{
			Messages: p.messages(t, ns.Messages, allowed, &ignore),
			StepID:   core.StepID(HashID(k, "step", string(ns.StepID))),
		}
	}
	for _, f := range in.Feedback {
		of := core.Feedback{Text: p.Text(t, f.Text), At: Hour(f.At)}
		if f.Score != nil {
			v := *f.Score
			of.Score = &v
		}
		out.Feedback = append(out.Feedback, of)
	}
	if rw := in.Reward; rw != nil {
		or := &core.Reward{Hint: p.Text(t, rw.Hint), At: Hour(rw.At), Scores: []core.Score{}}
		if rw.Value != nil {
			v := *rw.Value
			or.Value = &v
		}
		for _, s := range rw.Scores {
			os := core.Score{Plugin: s.Plugin, Hash: s.Hash, Weight: s.Weight, Hint: p.Text(t, s.Hint), Reason: p.Text(t, s.Reason)}
			if s.Value != nil {
				v := *s.Value
				os.Value = &v
			}
			for _, l := range s.Labels {
				os.Labels = append(os.Labels, p.Text(t, l))
			}
			or.Scores = append(or.Scores, os)
		}
		out.Reward = or
	}
	return out, nil
}

// toolsOf maps the step's tool call ids to the tools they called.
func toolsOf(s *core.Step) map[string]string {
	m := map[string]string{}
	add := func(msg *core.Message) {
		for _, tc := range msg.ToolCalls {
			if tc.ID != "" {
				m[tc.ID] = tc.Name
			}
		}
	}
	for i := range s.Request.Messages {
		add(&s.Request.Messages[i])
	}
	for i := range s.Response.Choices {
		add(&s.Response.Choices[i].Message)
	}
	return m
}

// text scrubs s and notes in changed whether it did anything.
func (p *Pass) text(t *Table, s string, changed *bool) string {
	out := p.Text(t, s)
	if out != s {
		*changed = true
	}
	return out
}

func (p *Pass) messages(t *Table, in []core.Message, allowed func(*core.Message) bool, changed *bool) []core.Message {
	if in == nil {
		return nil
	}
	out := make([]core.Message, len(in))
	for i := range in {
		out[i] = p.message(t, &in[i], allowed, changed)
	}
	return out
}

func (p *Pass) message(t *Table, m *core.Message, allowed func(*core.Message) bool, changed *bool) core.Message {
	out := core.Message{Role: m.Role, ToolCallID: m.ToolCallID, IsError: m.IsError}
	switch m.Role {
	case core.RoleTool, core.RoleAssistant:
		out.Name = m.Name // a tool's name, or the assistant's
	default:
		// A participant's name says who the user is.
		if m.Name != "" {
			*changed = true
		}
	}
	if m.Role == core.RoleTool && !allowed(m) {
		out.Content = Withheld
		if m.Content != Withheld || len(m.Parts) > 0 {
			*changed = true
		}
		return out
	}
	out.Content = p.text(t, m.Content, changed)
	out.Reasoning = p.text(t, m.Reasoning, changed)
	for _, pt := range m.Parts {
		// Images, audio and files cannot be scrubbed: only their type leaves.
		out.Parts = append(out.Parts, core.Part{Type: pt.Type})
		if len(pt.Raw) > 0 {
			*changed = true
		}
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, core.ToolCall{
			ID: tc.ID, Type: tc.Type, Name: tc.Name,
			Arguments: p.jsonText(t, tc.Arguments, changed),
		})
	}
	return out
}

func (p *Pass) tools(t *Table, in []core.Tool, changed *bool) []core.Tool {
	if in == nil {
		return nil
	}
	out := make([]core.Tool, len(in))
	for i, tl := range in {
		out[i] = core.Tool{Name: tl.Name, Description: p.text(t, tl.Description, changed)}
		if len(tl.Parameters) > 0 {
			out[i].Parameters = json.RawMessage(p.jsonText(t, string(tl.Parameters), changed))
		}
	}
	return out
}

// params keeps the sampling parameters (keptParams), scrubbed.
func (p *Pass) params(t *Table, raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if keptParams[k] {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteByte('{')
	var ignore bool
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.WriteString(p.jsonText(t, string(m[k]), &ignore))
	}
	b.WriteByte('}')
	return b.Bytes()
}

// jsonText scrubs text that is meant to be JSON (tool-call arguments, tool
// parameter schemas) so that valid JSON stays valid: the whole text is
// scanned (so "password": "..." is seen with its name), and if a
// replacement would break the JSON, each string in it is scrubbed alone.
// Text that is not valid JSON is scrubbed as text.
func (p *Pass) jsonText(t *Table, s string, changed *bool) string {
	fs := p.Find(s)
	if len(fs) == 0 {
		return s
	}
	*changed = true
	if !json.Valid([]byte(s)) {
		return Replace(t, s, fs)
	}
	var dry Table
	if json.Valid([]byte(Replace(&dry, s, fs))) {
		return Replace(t, s, fs)
	}
	return p.jsonStrings(t, s)
}

// jsonStrings scrubs each string of the valid JSON text s on its own.
func (p *Pass) jsonStrings(t *Table, s string) string {
	var b bytes.Buffer
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if s[i] != '"' {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i + 1
		for j < len(s) && s[j] != '"' {
			if s[j] == '\\' {
				j++
			}
			j++
		}
		j++ // the closing quote
		lit := s[i:min(j, len(s))]
		var v string
		if err := json.Unmarshal([]byte(lit), &v); err != nil {
			b.WriteString(lit)
		} else if sv := p.Text(t, v); sv != v {
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			enc.Encode(sv)
			b.Truncate(b.Len() - 1) // Encode's newline
		} else {
			b.WriteString(lit)
		}
		i = j
	}
	return b.String()
}
