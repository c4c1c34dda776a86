package reward

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ErrResult wraps every reason a plugin's result is rejected.
var ErrResult = errors.New("reward: bad result")

// input is a step in the ABI's input forms, each built on first use; the
// parts shared by every plugin are encoded once.
type input struct {
	step *core.Step
	meta meta
	// task, when the step is a rollout of a task, is the task's answer
	// and meta for a verifier (input.task, the ABI's addition).
	task *Task

	// Version 1 (JSON).
	json                            bool // the fields below are set
	context, action, next, feedback json.RawMessage
	err                             error

	// Version 2 (flat): every part but meta.plugin and meta.config.
	flat []byte
}

type meta struct {
	Turn      string            `json:"turn"`
	API       string            `json:"api,omitempty"`
	ToolNames []string          `json:"tool_names,omitempty"`
	LatencyMS int64             `json:"latency_ms,omitempty"`
	Model     string            `json:"model,omitempty"`
	Plugin    string            `json:"plugin,omitempty"`
	Config    map[string]string `json:"config,omitempty"`
}

// Task is what a verifier plugin learns of the task a rollout answers: its
// id, its answer and its meta, as the task set gives them (JSON values).
// It reaches the plugin as input.task (JSON) or the flat layout's task
// section; a plugin that does not read it scores as before.
type Task struct {
	ID     string          `json:"id"`
	Answer json.RawMessage `json:"answer,omitempty"`
	Meta   json.RawMessage `json:"meta,omitempty"`
}

// wire is t as the input carries it: answer and meta left out when
// absent, and anything not valid JSON left out too.
func (t *Task) wire() Task {
	w := Task{ID: t.ID}
	if len(t.Answer) > 0 && json.Valid(t.Answer) {
		w.Answer = t.Answer
	}
	if len(t.Meta) > 0 && json.Valid(t.Meta) {
		w.Meta = t.Meta
	}
	return w
}

type feedback struct {
	Score *float64 `json:"score,omitempty"`
	Text  string   `json:"text,omitempty"`
}

func newInput(s *core.Step) *input {
	in := &input{step: s}
	model := s.Model
	if model == "" {
		model = s.Response.Model
	}
	if model == "" {
		model = s.Request.Model
	}
	var tools []string
	for _, t := range s.Request.Tools {
		tools = append(tools, t.Name)
	}
	in.meta = meta{
		Turn:      string(s.Turn),
		API:       string(s.API),
		ToolNames: tools,
		LatencyMS: s.Timings.Total.Milliseconds(),
		Model:     model,
	}
	return in
}

// action returns the step's action, its role defaulted to assistant.
func (in *input) actionMessage() core.Message {
	act := in.step.Action()
	if act.Role == "" {
		act.Role = core.RoleAssistant
	}
	return act
}

// encodeJSONParts encodes the parts of the JSON input every plugin shares.
func (in *input) encodeJSONParts() {
	in.json = true
	s := in.step
	ctxMsgs := s.Request.Messages
	if ctxMsgs == nil {
		ctxMsgs = []core.Message{}
	}
	var errs []error
	var err error
	in.context, err = json.Marshal(ctxMsgs)
	errs = append(errs, err)
	in.action, err = json.Marshal(in.actionMessage())
	errs = append(errs, err)
	if s.NextState != nil {
		next := s.NextState.Messages
		if next == nil {
			next = []core.Message{}
		}
		in.next, err = json.Marshal(next)
		errs = append(errs, err)
	} else {
		in.next = json.RawMessage("null")
	}
	fb := make([]feedback, 0, len(s.Feedback))
	for _, f := range s.Feedback {
		fb = append(fb, feedback{Score: f.Score, Text: f.Text})
	}
	in.feedback, err = json.Marshal(fb)
	errs = append(errs, err)
	in.err = errors.Join(errs...)
}

// encode renders the JSON input (version 1) for one plugin.
func (in *input) encode(c PluginConfig) ([]byte, error) {
	if !in.json {
		in.encodeJSONParts()
	}
	if in.err != nil {
		return nil, in.err
	}
	m := in.meta
	m.Plugin, m.Config = c.Name, c.Config
	mb, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(len(in.context) + len(in.action) + len(in.next) + len(in.feedback) + len(mb) + 64)
	b.WriteString(`{"context":`)
	b.Write(in.context)
	b.WriteString(`,"action":`)
	b.Write(in.action)
	b.WriteString(`,"next_state":`)
	b.Write(in.next)
	b.WriteString(`,"feedback":`)
	b.Write(in.feedback)
	b.WriteString(`,"meta":`)
	b.Write(mb)
	if in.task != nil {
		tb, err := json.Marshal(in.task.wire())
		if err != nil {
			return nil, err
		}
		b.WriteString(`,"task":`)
		b.Write(tb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Result is a plugin's decoded result.
type Result struct {
	Score  *float64
	Hint   string
	Labels []string
	Reason string
}

// DecodeResult parses and checks a plugin's JSON result: the score must be a
// number in [-1, 1] or null; the hint, labels and reason are trimmed to
// bounded sizes and made valid UTF-8.
func DecodeResult(b []byte) (Result, error) {
	var raw struct {
		Score  json.RawMessage `json:"score"`
		Hint   string          `json:"hint"`
		Labels []string        `json:"labels"`
		Reason string          `json:"reason"`
	}
	if len(b) > maxOutput {
		return Result{}, fmt.Errorf("%w: %d bytes", ErrResult, len(b))
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&raw); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrResult, err)
	}
	if d.More() {
		return Result{}, fmt.Errorf("%w: trailing data", ErrResult)
	}
	var score *float64
	switch s := strings.TrimSpace(string(raw.Score)); s {
	case "", "null":
	default:
		var v float64
		if err := json.Unmarshal(raw.Score, &v); err != nil {
			return Result{}, fmt.Errorf("%w: score %s is not a number", ErrResult, clip(s, 40))
		}
		score = &v
	}
	return checkResult(score, raw.Hint, raw.Reason, raw.Labels)
}

// checkResult checks a decoded result's score and bounds its strings, as
// ABI.md says, whatever the layout it came in.
func checkResult(score *float64, hint, reason string, labels []string) (Result, error) {
	var r Result
	if score != nil {
		if v := *score; math.IsNaN(v) || v < -1 || v > 1 {
			return Result{}, fmt.Errorf("%w: score %v outside [-1, 1]", ErrResult, v)
		}
		r.Score = score
	}
	r.Hint = clip(hint, maxHint)
	r.Reason = clip(reason, maxReason)
	for _, l := range labels {
		if len(r.Labels) == maxLabels {
			break
		}
		if l = clip(l, maxLabel); l != "" {
			r.Labels = append(r.Labels, l)
		}
	}
	return r, nil
}

// clip makes s valid UTF-8, trims space and cuts it to n bytes on a rune
// boundary.
func clip(s string, n int) string {
	s = strings.TrimSpace(strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
